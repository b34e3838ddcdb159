//! `fedshard probs`: the inclusion probabilities and multipliers a sharding strategy assigns to
//! a spectrum.

use super::input::read_vector;
use anyhow::{Context, bail};
use clap::Args;
use fedshard_strategies::metrics::anme_layer;
use fedshard_strategies::sampling::SamplerName;
use fedshard_strategies::sharding::plan::StrategySpec;
use fedshard_strategies::spectrum::{SortedSpectrum, kept_terms};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("size").required(true).args(["n", "keep_ratio"]))]
pub struct ProbsArgs {
    /// Strategy name: top-n, top-n+scaled, prism, prism+scaled, prism-wallenius,
    /// prism-wallenius+cliplr, unbiased, collective. Parsed by [`probs`] rather than by clap so
    /// that an unknown name is a one-line error (exit code 2) like every other bad input.
    #[arg(long)]
    pub strategy: String,
    /// Number of kept terms n.
    #[arg(long)]
    pub n: Option<usize>,
    /// Keep ratio r ∈ (0, 1]; n = ⌈N r⌉.
    #[arg(long)]
    pub keep_ratio: Option<f64>,
    /// Group size C for the collective strategy.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// JSON file with an array of positive singular values, in any order.
    #[arg(long)]
    pub spectrum: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct ProbsReport {
    pub strategy: String,
    pub n: usize,
    /// In the input order of the spectrum.
    pub pi: Vec<f64>,
    /// In input order; `null` where ω depends on each client's draw (+scaled on PriSM).
    pub omega: Option<Vec<f64>>,
    pub expected_discrepancy: Option<f64>,
    pub anme: f64,
}

pub fn probs(args: &ProbsArgs) -> anyhow::Result<ProbsReport> {
    let strategy: StrategySpec = args.strategy.parse().context("--strategy")?;
    let values = read_vector(&args.spectrum, "spectrum")?;
    let spectrum =
        SortedSpectrum::new(&values).with_context(|| args.spectrum.display().to_string())?;
    let total = spectrum.len();
    let (n, keep_ratio) = match (args.n, args.keep_ratio) {
        (Some(n), _) => {
            if n == 0 || n > total {
                bail!(
                    "--n {n} is out of range: the spectrum has {total} values, so n must be in 1..={total}"
                );
            }
            (n, n as f64 / total as f64)
        }
        (None, Some(r)) => (kept_terms(total, r).context("--keep-ratio")?, r),
        (None, None) => bail!("give --n or --keep-ratio"),
    };
    if args.clients == 0 {
        bail!("--clients must be at least 1");
    }
    let plan = strategy
        .plan(
            spectrum.values(),
            keep_ratio,
            n,
            args.clients,
            SamplerName::default(),
        )
        .with_context(|| format!("strategy {strategy}"))?;
    let m = &plan.marginals;
    Ok(ProbsReport {
        strategy: strategy.to_string(),
        n,
        pi: spectrum.unsort(&m.inclusion_probabilities),
        omega: (!plan.multipliers_per_draw()).then(|| spectrum.unsort(&m.multipliers)),
        expected_discrepancy: m.expected_discrepancy,
        anme: anme_layer(&m.inclusion_probabilities, n),
    })
}
