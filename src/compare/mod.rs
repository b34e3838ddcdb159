//! The paper's Table 1 (the sharding paper §4.2) on any config: the same federation — the config's data,
//! model and training — run under each sharding strategy and keep-ratio setup over several
//! seeds, summarised as final test accuracy (mean ± std over seeds) and mean ANME per cell, with
//! a no-sharding reference row.
//!
//! Runs are independent and run one after the other in this process by [`run_grid`], the one
//! grid runner (the uplink grid of [`crate::compare_uplink`] is another set of arms for it),
//! with no run folder and no metrics exporter. Every run is deterministic given its seed, so
//! the whole grid is too.
//!
//! Here: the grid of Table 1 (its arms, one run's config and result). [`run_grid`] runs any
//! grid (`grid`), the statistics over seeds are in `stats` and the markdown tables in `tables`.

mod budget;
mod grid;
mod stats;
mod tables;
#[cfg(test)]
mod tests;

pub use budget::{Budget, CostMatch, Costs, describe};
pub(crate) use grid::parse_list;
pub use grid::{GridArm, OnRun, run_grid, seeds};
pub use stats::{
    Cell, cell, mean_and_sample_std, t_interval_95, time_per_round, time_to, time_to_cell,
};
pub use tables::{ranking, table, time_table};

use crate::compare_journal::{Journal, JournalRow};
use crate::config::{Config, KeepRatioShare};
use anyhow::{Context, bail, ensure};
use fedshard_actors::record::{RoundRecord, Summary};
use fedshard_strategies::sharding::strategy::Strategy;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// The strategies of Table 1, in its row order.
pub const DEFAULT_STRATEGIES: &str = "top-n,top-n+scaled,prism,prism+scaled,prism-wallenius,\
prism-wallenius+cliplr,unbiased,collective";

/// The keep-ratio setups of Table 1, in its order.
pub const DEFAULT_SETUPS: &str = "0.1,0.2,mixed";

/// The `strategy` of the reference runs.
pub const NO_SHARDING: &str = "no sharding";

/// The `setup` of the reference runs: every client trains the full dense model.
pub const FULL_MODEL: &str = "full";

/// One column of the table: the clients' keep ratios.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The name on the command line and in the JSON: a ratio such as `0.1`, or `mixed`.
    pub name: String,
    /// The clients' keep ratios, as the config's `federation.keep_ratios` shares.
    pub keep_ratios: Vec<KeepRatioShare>,
}

impl Setup {
    /// Every client keeps the fraction `ratio` of each sharded layer.
    pub fn uniform(ratio: f64) -> Self {
        Self {
            name: ratio.to_string(),
            keep_ratios: vec![KeepRatioShare { ratio, share: 1.0 }],
        }
    }

    /// The paper's heterogeneous setup: 60% of the clients with r = 0.2, 40% with r = 0.4.
    pub fn mixed() -> Self {
        Self {
            name: "mixed".into(),
            keep_ratios: vec![
                KeepRatioShare {
                    ratio: 0.2,
                    share: 0.6,
                },
                KeepRatioShare {
                    ratio: 0.4,
                    share: 0.4,
                },
            ],
        }
    }

    /// The column header: `r = 0.1`, or the shares of a mixed setup.
    pub fn describe(&self) -> String {
        match self.keep_ratios.as_slice() {
            [only] => format!("r = {}", only.ratio),
            shares => shares
                .iter()
                .map(|k| format!("{}% r = {}", (k.share * 100.0).round(), k.ratio))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

impl FromStr for Setup {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        if text == "mixed" {
            return Ok(Self::mixed());
        }
        match text.parse::<f64>() {
            Ok(ratio) if ratio > 0.0 && ratio <= 1.0 => Ok(Self::uniform(ratio)),
            _ => bail!(
                "expected a comma-separated list of keep ratios in (0, 1] or `mixed`, found `{text}`"
            ),
        }
    }
}

/// Parses `top-n,unbiased,…` with the strategy parser of the config.
pub fn parse_strategies(list: &str) -> anyhow::Result<Vec<Strategy>> {
    parse_list(list)
}

/// Parses `0.1,0.2,mixed`: keep ratios in (0, 1] and the paper's `mixed` setup.
pub fn parse_setups(list: &str) -> anyhow::Result<Vec<Setup>> {
    parse_list(list)
}

/// One row × column of the grid, run once per seed.
#[derive(Debug, Clone, PartialEq)]
pub enum Arm {
    /// The reference: every client trains the full dense model (see [`run_config`]).
    NoSharding,
    /// One strategy under one keep-ratio setup.
    Sharded { strategy: Strategy, setup: Setup },
}

impl Arm {
    /// The `(strategy, setup)` labels of this arm's results.
    pub fn labels(&self) -> (String, String) {
        match self {
            Arm::NoSharding => (NO_SHARDING.into(), FULL_MODEL.into()),
            Arm::Sharded { strategy, setup } => (strategy.to_string(), setup.name.clone()),
        }
    }
}

/// The config of one run: `base` with `seed` and the arm's strategy and keep ratios.
///
/// The reference arm empties `model.sharded_layers` and gives every client keep ratio 1, so the
/// runtime plans no shards and every client trains the dense model — the paper's "conventional
/// full model". (Keep ratio 1 with the layer still sharded would train a full-rank
/// factorisation, the paper's over-parameterised row; ask for it with the setup `1`.) ClipLR
/// keeps following the strategy through [`crate::federation::server`]; dense training has no
/// factor columns to clip.
pub fn run_config(base: &Config, arm: &Arm, seed: u64) -> anyhow::Result<Config> {
    let mut config = base.clone();
    config.run.seed = seed;
    match arm {
        Arm::NoSharding => {
            config.model.clear_sharded_layers();
            config.federation.keep_ratios = Setup::uniform(1.0).keep_ratios;
        }
        Arm::Sharded { strategy, setup } => {
            config.federation.strategy = *strategy;
            config.federation.keep_ratios = setup.keep_ratios.clone();
        }
    }
    config.validate()?;
    Ok(config)
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// A strategy name, or [`NO_SHARDING`].
    pub strategy: String,
    /// A [`Setup::name`], or [`FULL_MODEL`].
    pub setup: String,
    pub seed: u64,
    /// Test accuracy after the last round, in [0, 1]; `None` if the run failed.
    pub final_accuracy: Option<f64>,
    /// ANME (docs/algorithms.md §1.9) averaged over the rounds, 0 when nothing is sharded; `None` if
    /// the run failed.
    pub mean_anme: Option<f64>,
    /// The cosine of each round's applied update with the clients' FedAvg update (the sharding paper,
    /// Fig. 4; `update_cosine` in `metrics.jsonl`), averaged over the rounds that moved the
    /// model: how well a strategy's aggregate points where its clients asked. `None` if the run
    /// failed or never moved the model.
    #[serde(default)]
    pub mean_update_cosine: Option<f64>,
    /// Why the run stopped before its last round (a diverging run can make the server's SVD
    /// fail): one failed run is a result of the grid, not a reason to drop the others.
    pub error: Option<String>,
    /// Wall time of the run: building the federation and every round.
    pub seconds: f64,
    /// Test accuracy after each round, for the accuracy-per-round figures of `--out`; empty if
    /// the run failed. Not in the JSON, whose shape stays one number per run.
    #[serde(skip)]
    pub accuracy_per_round: Vec<f64>,
    /// The time at the end of each round ([`time_per_round`]); kept, like the accuracies, in
    /// the journal and not in the JSON.
    #[serde(skip)]
    pub time_per_round: Vec<f64>,
}

/// The grid: the reference arm first (a quick sanity check of the data and training), then
/// every strategy for each setup; a width strategy's setups are `width_setup`'s (the setup
/// itself at equal nominal ratio).
pub fn arms(
    strategies: &[Strategy],
    setups: &[Setup],
    width_setup: &dyn Fn(&Setup) -> anyhow::Result<Setup>,
) -> anyhow::Result<Vec<Arm>> {
    let mut arms = vec![Arm::NoSharding];
    for setup in setups {
        for &strategy in strategies {
            let setup = match strategy {
                Strategy::Width(_) => width_setup(setup)?,
                Strategy::Spectral(_) => setup.clone(),
            };
            arms.push(Arm::Sharded { strategy, setup });
        }
    }
    Ok(arms)
}

/// Runs every arm of [`arms`] for every seed through [`run_grid`], and returns the results in
/// run order; the no-sharding reference first. Width strategies run at `budget` ([`Budget`]).
/// A config whose `model.sharded_layers` is empty is refused: every strategy would train the
/// same dense model.
#[allow(clippy::too_many_arguments)]
pub fn compare(
    config: &Config,
    strategies: &[Strategy],
    setups: &[Setup],
    budget: Budget,
    seeds: &[u64],
    journal: Option<&mut Journal<RunResult>>,
    on_run: &mut OnRun<'_, RunResult>,
    on_round: &mut dyn FnMut(&str, &RoundRecord),
) -> anyhow::Result<Vec<RunResult>> {
    ensure!(
        !config.model.sharded_layers().is_empty(),
        "the config's `model.sharded_layers` is empty: every strategy would train the same dense \
         model, so there is nothing to compare"
    );
    ensure!(!strategies.is_empty(), "no strategy to compare");
    ensure!(!setups.is_empty(), "no keep-ratio setup to compare");
    let costs = match budget {
        Budget::Cost if strategies.iter().any(|s| matches!(s, Strategy::Width(_))) => {
            Some(Costs::of(config)?)
        }
        _ => None,
    };
    let width_setup = |setup: &Setup| match &costs {
        Some(costs) => Ok(costs.width_setup(setup)?.0),
        None => Ok(setup.clone()),
    };
    run_grid(
        config,
        &arms(strategies, setups, &width_setup)?,
        seeds,
        journal,
        on_run,
        on_round,
    )
}

impl GridArm for Arm {
    type Run = RunResult;

    fn label(&self) -> String {
        let (strategy, setup) = self.labels();
        format!("{strategy} {setup}")
    }

    fn config(&self, base: &Config, seed: u64) -> anyhow::Result<Config> {
        run_config(base, self, seed).with_context(|| {
            let (strategy, setup) = self.labels();
            format!("strategy {strategy}, setup {setup}")
        })
    }

    /// Final accuracy, ANME and update cosine averaged over the rounds; a run that completed
    /// no round is a failed one.
    fn result(&self, seed: u64, outcome: anyhow::Result<Summary>, seconds: f64) -> RunResult {
        let (strategy, setup) = self.labels();
        let outcome = outcome.and_then(|summary| {
            ensure!(!summary.per_round.is_empty(), "the run completed no round");
            Ok(summary)
        });
        let rounds = outcome.as_ref().map_or(&[][..], |s| s.per_round.as_slice());
        let mean = |values: Vec<f64>| {
            (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
        };
        RunResult {
            strategy,
            setup,
            seed,
            final_accuracy: outcome.as_ref().ok().map(|s| s.final_accuracy),
            mean_anme: mean(rounds.iter().map(|r| r.anme).collect()),
            mean_update_cosine: mean(rounds.iter().filter_map(|r| r.update_cosine).collect()),
            seconds,
            accuracy_per_round: rounds.iter().map(|r| r.accuracy).collect(),
            time_per_round: time_per_round(rounds),
            error: outcome.err().map(|e| format!("{e:#}")),
        }
    }
}

impl JournalRow for RunResult {
    fn per_round(&self) -> (&[f64], &[f64]) {
        (&self.accuracy_per_round, &self.time_per_round)
    }

    fn set_per_round(&mut self, accuracy: Vec<f64>, time: Vec<f64>) {
        self.accuracy_per_round = accuracy;
        self.time_per_round = time;
    }
}
