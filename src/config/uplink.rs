//! The run checked against what its compressor needs
//! (`fedshard_protocol::uplink::requirements` states the rules and their reasons).

use super::{Config, DataSection, ModelSection, check};
use fedshard_protocol::uplink::requirements::Values;
use fedshard_strategies::aggregation::AggregatorName;

/// The `[model]`, `[data]` and `[federation]` settings that conflict with
/// `federation.compressor`, then the `[compression]` table's own ranges.
pub(super) fn validate(config: &Config) -> anyhow::Result<()> {
    let f = &config.federation;
    let compressor = f.compressor;
    let needs = compressor.requirements();
    let fedpm_model = matches!(config.model, ModelSection::Fedpm { .. });
    let fits = match needs.values {
        Values::Any => true,
        Values::MaskProbabilities => fedpm_model,
        Values::Weights => !fedpm_model,
    };
    check(
        "federation.compressor",
        fits,
        "`fedpm` and `fedpm-klms` with `[model] kind = \"fedpm\"` (whose values are mask \
         probabilities), and with that model `identity`, `fedpm` or `fedpm-klms`",
        format!("`{compressor}` with model kind `{}`", config.model.kind()),
    )?;
    if let Some(bound) = f.max_update_norm {
        check(
            "federation.max_update_norm",
            compressor.update_norm_varies(config.compression.as_ref()),
            "no bound with `signsgd` or `signsgd-klms` without `compression.rescale_drift`: \
             every such update has the norm server_lr × √(values sent), so a bound rejects \
             all of them or none (remove the line)",
            format!("{bound} with `{compressor}`"),
        )?;
    }
    let with = |reason: &str, what: &str| format!("{what} with `{compressor}` ({reason})");
    if let Some(reason) = needs.rounds {
        check(
            "federation.mode",
            f.schedule.mode() == super::Mode::Sync,
            &with(reason, "`sync`"),
            format!("`async` with `{compressor}`"),
        )?;
    }
    if let Some(reason) = needs.equal_weights {
        check(
            "federation.aggregator",
            f.aggregator == AggregatorName::Uniform,
            &with(reason, "`uniform`"),
            format!("`{}` with `{compressor}`", f.aggregator),
        )?;
    }
    if let Some(reason) = needs.gradient_classifier {
        check(
            "model.kind",
            matches!(
                config.model,
                ModelSection::Softmax { .. } | ModelSection::Neural { .. }
            ),
            &with(reason, "`softmax` or `neural`"),
            format!("`{}` with `{compressor}`", config.model.kind()),
        )?;
    }
    if let Some(reason) = needs.labelled_data {
        check(
            "data.dataset",
            !matches!(config.data, DataSection::Shakespeare { .. }),
            &with(reason, "a labelled dataset"),
            format!("{} with `{compressor}`", config.data.name()),
        )?;
    }
    if let Some(reason) = needs.whole_model {
        check(
            "federation.keep_ratios",
            !f.partial(),
            &with(reason, "keep ratio 1 for every client"),
            "a keep ratio below 1".into(),
        )?;
        check(
            "model.sharded_layers",
            config.model.sharded_layers().is_empty(),
            &with(reason, "no sharded layer"),
            format!("{:?}", config.model.sharded_layers()),
        )?;
    }
    match &config.compression {
        Some(table) => Ok(table.validate(compressor)?),
        None => Ok(()),
    }
}
