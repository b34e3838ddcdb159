//! The rules a run's policies must keep together are the engine's
//! ([`fedshard_actors::policies::Policies::check`]), secure aggregation's parameters' and the
//! privacy accountant's, each with a typed error; the config asks them before anything starts
//! and only translates each refusal into the field it is about.

use super::Config;
use fedshard_actors::Policy;
use fedshard_actors::error::Error;
use fedshard_actors::policies::Policies;
use fedshard_secagg::Param;
use fedshard_strategies::StrategyError;
use fedshard_strategies::sharding::strategy::Strategy;

/// Asks the engine whether it can run `config`'s policies together.
pub(super) fn check(config: &Config) -> anyhow::Result<()> {
    policies(config).check().map(drop).map_err(refusal)
}

/// `config`'s policies as the engine takes them.
fn policies(config: &Config) -> Policies {
    let f = &config.federation;
    Policies {
        schedule: f.schedule.engine(),
        aggregator: f.aggregator,
        selector: f.selector,
        compressor: f.compressor,
        max_update_norm: f.max_update_norm,
        sharded_layers: config.model.resolved_sharded_layers(),
        width: match f.strategy {
            Strategy::Width(w) if !config.model.sharded_layers().is_empty() => Some(w),
            _ => None,
        },
        privacy: config.privacy.as_ref().map(|p| p.settings(config)),
        secure: config.secure_aggregation.as_ref().map(|s| s.settings()),
        scaffold: f.scaffold,
    }
}

/// The field of the config a policy is chosen by.
fn policy_field(policy: Policy) -> &'static str {
    match policy {
        Policy::Aggregator => "federation.aggregator",
        // The config draws a private run's sample with its selector.
        Policy::Selector | Policy::Sampling => "federation.selector",
        Policy::Mode => "federation.mode",
        Policy::OverCommit => "federation.over_commit",
        Policy::MaxUpdateNorm => "federation.max_update_norm",
        Policy::Compressor => "federation.compressor",
        Policy::ShardedLayers => "model.sharded_layers",
        Policy::Strategy => "federation.strategy",
        Policy::SecureAggregation => "secure_aggregation",
        Policy::Privacy => "privacy",
    }
}

/// A refusal of the engine, the secure-aggregation parameters or the accountant, prefixed with
/// the field(s) it is about; `Error::Invalid` names its field already.
fn refusal(error: Error) -> anyhow::Error {
    let field = match &error {
        Error::Unsupported { policy, .. } => policy_field(*policy),
        Error::Aggregator { .. } => "federation.aggregator",
        Error::SecureAggregation(fedshard_secagg::Error::OutOfRange {
            param,
            expected,
            found,
        }) => {
            let field = match param {
                Param::Threshold => "field `secure_aggregation.threshold`",
                Param::Degree => "field `secure_aggregation.degree`",
                Param::FixedPoint => {
                    "fields `secure_aggregation.clip_norm` (or `privacy.clip_norm`) and \
                     `secure_aggregation.scale`"
                }
            };
            return anyhow::anyhow!("{field}: expected {expected}, found {found}");
        }
        Error::Privacy(StrategyError::InvalidInput { what, .. }) => match *what {
            "noise multiplier" => "privacy.noise_multiplier",
            "clipped count noise" => "privacy.clipped_count_stddev",
            "sampling rate" | "sample size" => "federation.clients_per_round",
            _ => return error.into(),
        },
        _ => return error.into(),
    };
    anyhow::anyhow!("field `{field}`: {error}")
}
