//! `fedshard widths`: the units a width strategy keeps of every hidden width of a config's
//! model in a given round at a given keep ratio (docs/algorithms.md §8.2), so that anyone can
//! check a selection by hand.

use crate::config::Config;
use anyhow::Context;
use clap::Args;
use fedshard_protocol::width::{Axis, WidthPolicy, plan_widths};
use fedshard_strategies::sharding::width::WidthStrategy;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct WidthsArgs {
    /// The TOML config whose model's widths are sliced.
    pub config: PathBuf,
    /// `heterofl`, `fedrolex` or `fjord` (FjORD: its largest slice; every batch trains a
    /// prefix of it).
    #[arg(long)]
    pub strategy: String,
    /// The client's keep ratio, in (0, 1].
    #[arg(long)]
    pub keep_ratio: f64,
    /// The round (from 1): FedRolex's window moves with it.
    #[arg(long, default_value_t = 1)]
    pub round: u64,
}

/// One width, the units kept of it, and the tensor axes that follow it (for an ONNX model,
/// what the trace through its graph found).
#[derive(Debug, Serialize)]
pub struct KeptWidth {
    pub width: String,
    pub units: usize,
    pub norm_groups: usize,
    pub kept: Vec<usize>,
    pub axes: Vec<Axis>,
}

#[derive(Debug, Serialize)]
pub struct WidthsReport {
    pub strategy: String,
    pub keep_ratio: f64,
    pub round: u64,
    /// FjORD's ordered-dropout levels, one drawn per local batch; absent for the strategies
    /// that train the whole slice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub levels: Option<Vec<f64>>,
    pub widths: Vec<KeptWidth>,
}

pub fn widths(args: &WidthsArgs) -> anyhow::Result<WidthsReport> {
    let strategy: WidthStrategy = args.strategy.parse().context("--strategy")?;
    anyhow::ensure!(args.round >= 1, "--round: expected a round from 1, found 0");
    // The widths are the model's description alone: the config is not validated against its
    // data or device, so `config/cifar10-resnet18.toml` is described without CIFAR or CUDA.
    let config = Config::read_unvalidated(&args.config)?;
    let groups = config
        .model
        .architecture()
        .map(|network| network.width_groups())
        .unwrap_or_default();
    anyhow::ensure!(
        !groups.is_empty(),
        "{}: the {} model describes no hidden width to slice",
        args.config.display(),
        config.model.kind()
    );
    let policy = WidthPolicy {
        strategy,
        groups: groups.clone(),
    };
    let mut slices =
        plan_widths(&policy, &[(0, args.keep_ratio)], args.round).context("--keep-ratio")?;
    let slice = slices
        .remove(&0)
        .unwrap_or_else(|| unreachable!("planned client 0"));
    Ok(WidthsReport {
        strategy: strategy.to_string(),
        keep_ratio: args.keep_ratio,
        round: args.round,
        levels: strategy.ordered_dropout_levels(args.keep_ratio),
        widths: groups
            .into_iter()
            .map(|g| KeptWidth {
                kept: slice.kept.get(&g.name).cloned().unwrap_or_default(),
                width: g.name,
                units: g.units,
                norm_groups: g.norm_groups,
                axes: g.axes,
            })
            .collect(),
    })
}
