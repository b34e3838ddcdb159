//! The paper's Table 1 (the sharding paper §4.2) on any config: the same federation — the config's data,
//! model and training — run under each sharding strategy and keep-ratio setup over several
//! seeds, summarised as final test accuracy (mean ± std over seeds) and mean ANME per cell, with
//! a no-sharding reference row.
//!
//! Runs are independent and run one after the other in this process by [`run_grid`], the one
//! grid runner (the uplink grid of [`crate::compare_uplink`] is another set of arms for it),
//! with no run folder and no metrics exporter. Every run is deterministic given its seed, so
//! the whole grid is too.

use crate::compare_journal::{Journal, JournalRow};
use crate::config::{Config, KeepRatioShare};
use crate::federation;
use anyhow::{Context, bail, ensure};
use fedshard_actors::record::{RoundRecord, Summary};
use fedshard_strategies::sharding::plan::StrategySpec;
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::fmt::Write as _;
use std::str::FromStr;
use std::time::Instant;

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

/// Parses a comma-separated list (`--strategies`, `--keep-ratios`): no empty entries, no repeats.
pub(crate) fn parse_list<T, E>(list: &str) -> anyhow::Result<Vec<T>>
where
    T: FromStr<Err = E> + PartialEq,
    E: Into<anyhow::Error>,
{
    let mut items: Vec<T> = Vec::new();
    for text in list.split(',').map(str::trim) {
        ensure!(
            !text.is_empty(),
            "empty entry in `{list}`: expected a comma-separated list"
        );
        let item = text.parse().map_err(Into::into)?;
        ensure!(!items.contains(&item), "`{text}` is listed twice");
        items.push(item);
    }
    Ok(items)
}

/// Parses `top-n,unbiased,…` with the strategy parser of the config.
pub fn parse_strategies(list: &str) -> anyhow::Result<Vec<StrategySpec>> {
    parse_list(list)
}

/// Parses `0.1,0.2,mixed`: keep ratios in (0, 1] and the paper's `mixed` setup.
pub fn parse_setups(list: &str) -> anyhow::Result<Vec<Setup>> {
    parse_list(list)
}

/// `count` consecutive seeds from `first` (wrapping at `u64::MAX`).
pub fn seeds(first: u64, count: usize) -> Vec<u64> {
    (0..count as u64).map(|i| first.wrapping_add(i)).collect()
}

/// One row × column of the grid, run once per seed.
#[derive(Debug, Clone, PartialEq)]
pub enum Arm {
    /// The reference: every client trains the full dense model (see [`run_config`]).
    NoSharding,
    /// One strategy under one keep-ratio setup.
    Sharded {
        strategy: StrategySpec,
        setup: Setup,
    },
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
/// keeps following the strategy through [`federation::server`]; dense training has no factor
/// columns to clip.
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

/// Each round's end, seconds since the run began: in simulated time when the run had a clock
/// (`--clock virtual`), else the rounds' wall-clock `seconds` summed.
pub fn time_per_round(rounds: &[RoundRecord]) -> Vec<f64> {
    let mut wall = 0.0;
    rounds
        .iter()
        .map(|r| {
            wall += r.seconds;
            r.time.as_ref().map_or(wall, |t| t.end)
        })
        .collect()
}

/// When the test accuracy first reached `target`, from a run's accuracies and times per round.
pub fn time_to(accuracy: &[f64], time: &[f64], target: f64) -> Option<f64> {
    accuracy
        .iter()
        .zip(time)
        .find(|(a, _)| **a >= target)
        .map(|(_, t)| *t)
}

/// A table cell of the time to a target over a cell's runs: the mean over the runs that reached
/// it, and how many did (`never (0/n)` when none).
pub fn time_to_cell(runs: &[(&[f64], &[f64])], target: f64) -> String {
    let times: Vec<f64> = runs
        .iter()
        .filter_map(|(accuracy, time)| time_to(accuracy, time, target))
        .collect();
    if times.is_empty() {
        format!("never (0/{})", runs.len())
    } else {
        let (mean, _) = mean_and_sample_std(&times);
        format!("{mean:.1} ({}/{})", times.len(), runs.len())
    }
}

/// The grid: the reference arm first (a quick sanity check of the data and training), then
/// every strategy for each setup.
pub fn arms(strategies: &[StrategySpec], setups: &[Setup]) -> Vec<Arm> {
    let sharded = setups.iter().flat_map(|setup| {
        strategies.iter().map(|&strategy| Arm::Sharded {
            strategy,
            setup: setup.clone(),
        })
    });
    std::iter::once(Arm::NoSharding).chain(sharded).collect()
}

/// Runs every arm of [`arms`] for every seed through [`run_grid`], and returns the results in
/// run order; the no-sharding reference first. A config whose `model.sharded_layers` is empty
/// is refused: every strategy would train the same dense model.
pub fn compare(
    config: &Config,
    strategies: &[StrategySpec],
    setups: &[Setup],
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
    run_grid(
        config,
        &arms(strategies, setups),
        seeds,
        journal,
        on_run,
        on_round,
    )
}

/// A grid's progress callback: `(k, total, result, resumed)` after run `k` of `total`
/// (1-based; `resumed`: the result came from the journal instead of a run).
pub type OnRun<'a, R> = dyn FnMut(usize, usize, &R, bool) + 'a;

/// One arm of a grid (a row, or a cell, of its table), run once per seed by [`run_grid`].
pub trait GridArm {
    /// What one run of the arm gives the table, as the journal keeps it.
    type Run: JournalRow;
    /// The arm in progress lines (`top-n 0.1`, `fedpm-klms (D = 2)`).
    fn label(&self) -> String;
    /// The validated config of the arm's run with `seed`; its error names the arm.
    fn config(&self, base: &Config, seed: u64) -> anyhow::Result<Config>;
    /// The run's result from its summary, or from the error that stopped it, and its wall time.
    fn result(&self, seed: u64, outcome: anyhow::Result<Summary>, seconds: f64) -> Self::Run;
}

/// The one grid runner behind `fedshard compare` (strategies) and `fedshard compare
/// --compressors`: every arm for every seed, one run after the other, each through
/// [`federation::run_to_end_watching`] (the loop behind `fedshard run`) with no run folder.
/// Returns the results in run order.
///
/// Every run's config is built and validated before the first run starts, so a bad arm fails at
/// once; a run that fails later is recorded with its error and the grid goes on. With a
/// [`Journal`], a run it holds for the identical config is reused, and every new run is
/// appended to it as soon as it ends. `on_run(k, total, result, resumed)` after run `k` of
/// `total` (1-based; `resumed`: the result came from the journal), `on_round(label, record)`
/// after each round of a run that trains, with the run's label (`[k/total] arm seed s`).
pub fn run_grid<A: GridArm>(
    base: &Config,
    arms: &[A],
    seeds: &[u64],
    mut journal: Option<&mut Journal<A::Run>>,
    on_run: &mut OnRun<'_, A::Run>,
    on_round: &mut dyn FnMut(&str, &RoundRecord),
) -> anyhow::Result<Vec<A::Run>> {
    ensure!(!seeds.is_empty(), "no seed to run");
    let mut planned = Vec::with_capacity(arms.len() * seeds.len());
    for arm in arms {
        for &seed in seeds {
            planned.push((arm, seed, arm.config(base, seed)?));
        }
    }
    let total = planned.len();
    let mut results = Vec::with_capacity(total);
    for (arm, seed, config) in planned {
        let k = results.len() + 1;
        if let Some(result) = journal
            .as_deref()
            .map(|j| j.recorded(&config))
            .transpose()?
            .flatten()
        {
            on_run(k, total, &result, true);
            results.push(result);
            continue;
        }
        let started = Instant::now();
        let label = format!("[{k}/{total}] {} seed {seed}", arm.label());
        let outcome = federation::run_to_end_watching(&config, &mut |r| on_round(&label, r))
            .map(|(_, summary)| summary);
        let result = arm.result(seed, outcome, started.elapsed().as_secs_f64());
        if let Some(journal) = journal.as_deref_mut() {
            journal.record(&config, &result)?;
        }
        on_run(k, total, &result, false);
        results.push(result);
    }
    Ok(results)
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

/// The time to `target` test accuracy per strategy and setup, laid out as [`table`]: the mean
/// over the seeds that reached it, in `clock`'s seconds (`simulated` or `wall`).
pub fn time_table(
    results: &[RunResult],
    (strategies, setups): (&[StrategySpec], &[Setup]),
    target: f64,
    clock: &str,
) -> String {
    let mut out = format!(
        "Time to {:.0}% test accuracy ({clock} seconds; mean over the seeds that reached it, and how many did):\n\n| strategy |",
        100.0 * target
    );
    let mut rule = String::from("|---|");
    for setup in setups {
        let _ = write!(out, " {} |", setup.describe());
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "\n{rule}");
    let rows = strategies
        .iter()
        .map(ToString::to_string)
        .chain(std::iter::once(NO_SHARDING.to_string()));
    for strategy in rows {
        let _ = write!(out, "| {strategy} |");
        for setup in setups {
            let runs: Vec<(&[f64], &[f64])> = results
                .iter()
                .filter(|r| {
                    r.strategy == strategy && (r.setup == setup.name || strategy == NO_SHARDING)
                })
                .map(|r| (&r.accuracy_per_round[..], &r.time_per_round[..]))
                .collect();
            let text = if runs.is_empty() {
                "–".to_string()
            } else {
                time_to_cell(&runs, target)
            };
            let _ = write!(out, " {text} |");
        }
        out.push('\n');
    }
    out
}

/// One cell of the table: the runs of one (strategy, setup) over the seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    /// Over the completed runs (NaN if none completed).
    pub accuracy_mean: f64,
    /// Sample standard deviation (n − 1 in the denominator) over the completed runs; 0 for one.
    pub accuracy_std: f64,
    pub anme_mean: f64,
    pub completed: usize,
    pub failed: usize,
}

impl Cell {
    /// The 95% t-interval of the mean accuracy over the completed runs ([`t_interval_95`]).
    pub fn interval_95(&self) -> Option<(f64, f64)> {
        t_interval_95(self.accuracy_mean, self.accuracy_std, self.completed)
    }
}

/// Mean and sample standard deviation (n − 1 in the denominator) of `values`: the std is 0 for
/// one value, the mean NaN (and the std 0) for none.
pub fn mean_and_sample_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let std = if values.len() > 1 {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (mean, std)
}

/// Summarises the results of `strategy` under `setup`; `None` if there are none.
pub fn cell(results: &[RunResult], strategy: &str, setup: &str) -> Option<Cell> {
    let runs: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.strategy == strategy && r.setup == setup)
        .collect();
    if runs.is_empty() {
        return None;
    }
    let completed: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| r.final_accuracy.zip(r.mean_anme))
        .collect();
    let n = completed.len() as f64;
    let accuracies: Vec<f64> = completed.iter().map(|c| c.0).collect();
    let (accuracy_mean, accuracy_std) = mean_and_sample_std(&accuracies);
    Some(Cell {
        accuracy_mean,
        accuracy_std,
        anme_mean: completed.iter().map(|c| c.1).sum::<f64>() / n,
        completed: completed.len(),
        failed: runs.len() - completed.len(),
    })
}

/// The two-sided 95% Student-t interval of a mean of `n` values with sample standard deviation
/// `std` (n − 1 degrees of freedom); `None` for fewer than two values, which have no interval.
pub fn t_interval_95(mean: f64, std: f64, n: usize) -> Option<(f64, f64)> {
    let freedom = n.checked_sub(1).filter(|&f| f > 0)? as f64;
    let t = StudentsT::new(0.0, 1.0, freedom).ok()?.inverse_cdf(0.975);
    let half = t * std / (n as f64).sqrt();
    Some((mean - half, mean + half))
}

/// Per setup, the strategies ranked by mean final accuracy with the 95% t-interval of each
/// mean, as markdown bullets. Between neighbours `>` means the two intervals do not overlap (a
/// conservative test of a difference), `≈` that they do or that one has no interval. Strategies
/// without a completed run are left out; the no-sharding reference closes each line.
pub fn ranking(results: &[RunResult], strategies: &[StrategySpec], setups: &[Setup]) -> String {
    let entry = |name: &str, c: &Cell| {
        let interval = c.interval_95().map_or_else(
            || format!(" [n={}]", c.completed),
            |(lo, hi)| format!(" [{:.1}, {:.1}]", 100.0 * lo, 100.0 * hi),
        );
        format!("{name} {:.1}{interval}", 100.0 * c.accuracy_mean)
    };
    let mut out = String::from(
        "Ranking by mean final accuracy in %, with the 95% Student-t interval of each mean over \
         its completed seeds (`>`: the neighbours' intervals do not overlap; `≈`: they do):\n\n",
    );
    for setup in setups {
        let mut ranked: Vec<(String, Cell)> = strategies
            .iter()
            .filter_map(|s| {
                let c = cell(results, &s.to_string(), &setup.name)?;
                (c.completed > 0).then(|| (s.to_string(), c))
            })
            .collect();
        ranked.sort_by(|a, b| b.1.accuracy_mean.total_cmp(&a.1.accuracy_mean));
        let _ = write!(out, "- {}:", setup.describe());
        for (k, (name, c)) in ranked.iter().enumerate() {
            if k > 0 {
                let apart = ranked[k - 1]
                    .1
                    .interval_95()
                    .zip(c.interval_95())
                    .is_some_and(|((above_lo, _), (_, hi))| above_lo > hi);
                out.push_str(if apart { " >" } else { " ≈" });
            }
            let _ = write!(out, " {}", entry(name, c));
        }
        if let Some(c) = cell(results, NO_SHARDING, FULL_MODEL).filter(|c| c.completed > 0) {
            let _ = write!(out, " (reference: {})", entry(NO_SHARDING, &c));
        }
        out.push('\n');
    }
    out
}

/// The markdown table: a row per strategy in the given order and the no-sharding row last; per
/// setup, a column "accuracy % (mean ± std)" and a column ANME. The reference runs fill every
/// setup's column, as they do not depend on it. A cell without runs shows `–`; failed runs are
/// counted in their cell and listed with their errors under the table.
pub fn table(results: &[RunResult], strategies: &[StrategySpec], setups: &[Setup]) -> String {
    let mut out = String::from("| strategy |");
    let mut rule = String::from("|---|");
    for setup in setups {
        let _ = write!(out, " {} acc. % | ANME |", setup.describe());
        rule.push_str("---:|---:|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    let rows = strategies
        .iter()
        .map(|s| (s.to_string(), None))
        .chain(std::iter::once((NO_SHARDING.to_string(), Some(FULL_MODEL))));
    for (strategy, fixed_setup) in rows {
        let _ = write!(out, "| {strategy} |");
        for setup in setups {
            let text = match cell(results, &strategy, fixed_setup.unwrap_or(&setup.name)) {
                None => "– | –".to_string(),
                Some(c) if c.completed == 0 => format!("failed ({}/{}) | –", c.failed, c.failed),
                Some(c) => {
                    let failed = if c.failed > 0 {
                        format!(" ({}/{} failed)", c.failed, c.failed + c.completed)
                    } else {
                        String::new()
                    };
                    format!(
                        "{:.1} ± {:.1}{failed} | {:.2}",
                        100.0 * c.accuracy_mean,
                        100.0 * c.accuracy_std,
                        c.anme_mean
                    )
                }
            };
            let _ = write!(out, " {text} |");
        }
        out.push('\n');
    }
    let failures: Vec<&RunResult> = results.iter().filter(|r| r.error.is_some()).collect();
    if !failures.is_empty() {
        out.push_str("\nFailed runs:\n");
        for r in failures {
            let error = r.error.as_deref().unwrap_or_default();
            let _ = writeln!(out, "- {} {} seed {}: {error}", r.strategy, r.setup, r.seed);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setups_parse_ratios_and_mixed() {
        let setups = parse_setups("0.1, 0.2,mixed,1").unwrap();
        let names: Vec<&str> = setups.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["0.1", "0.2", "mixed", "1"]);
        assert_eq!(setups[2].describe(), "60% r = 0.2, 40% r = 0.4");
        assert_eq!(setups[0].describe(), "r = 0.1");
        for bad in ["0", "1.5", "-0.1", "NaN", "abc", "0.1,,0.2", "0.1,0.1", ""] {
            assert!(parse_setups(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn strategies_use_the_config_parser() {
        let list = parse_strategies(DEFAULT_STRATEGIES).unwrap();
        let names: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(names.join(","), DEFAULT_STRATEGIES);
        let err = parse_strategies("top-n,bogus").unwrap_err().to_string();
        assert!(
            err.contains("bogus") && err.contains("valid names"),
            "{err}"
        );
        // `scaled` is an alias of `top-n+scaled`: the same row twice.
        assert!(parse_strategies("scaled,top-n+scaled").is_err());
    }

    /// Accuracies 0.8, 0.9, 1.0: mean 0.9, sample std 0.1 (n − 1 = 2 in the denominator).
    #[test]
    fn cells_use_the_sample_standard_deviation() {
        let run = |seed, final_accuracy| RunResult {
            strategy: "unbiased".into(),
            setup: "0.1".into(),
            seed,
            final_accuracy: Some(final_accuracy),
            mean_anme: Some(0.5),
            mean_update_cosine: Some(0.9),
            error: None,
            seconds: 0.0,
            accuracy_per_round: Vec::new(),
            time_per_round: Vec::new(),
        };
        let results = [run(1, 0.8), run(2, 0.9), run(3, 1.0)];
        let c = cell(&results, "unbiased", "0.1").unwrap();
        assert!((c.accuracy_mean - 0.9).abs() < 1e-12);
        assert!((c.accuracy_std - 0.1).abs() < 1e-12);
        assert_eq!((c.completed, c.failed), (3, 0));
        assert_eq!(
            cell(&results[..1], "unbiased", "0.1").unwrap().accuracy_std,
            0.0
        );
        assert!(cell(&results, "top-n", "0.1").is_none());
        let text = table(
            &results,
            &parse_strategies("unbiased").unwrap(),
            &[Setup::uniform(0.1)],
        );
        assert!(text.contains("| unbiased | 90.0 ± 10.0 | 0.50 |"), "{text}");
        assert!(text.contains("| no sharding | – | – |"), "{text}");
        assert!(!text.contains("Failed runs"), "{text}");
    }

    /// t(0.975; 2) = 4.3027: accuracies 0.8, 0.9, 1.0 (std 0.1) give 0.9 ± 4.3027 · 0.1/√3.
    #[test]
    fn intervals_use_student_t_and_the_ranking_marks_separated_neighbours() {
        let (lo, hi) = t_interval_95(0.9, 0.1, 3).unwrap();
        assert!(
            (hi - 0.9 - 4.302_653 * 0.1 / 3f64.sqrt()).abs() < 1e-6,
            "{hi}"
        );
        assert!((0.9 - lo - (hi - 0.9)).abs() < 1e-12);
        assert!(t_interval_95(0.9, 0.0, 1).is_none());
        let (lo, _) = t_interval_95(0.5, 0.1, 2).unwrap();
        assert!(
            (0.5 - lo - 12.706_205 * 0.1 / 2f64.sqrt()).abs() < 1e-5,
            "{lo}"
        );

        let run = |strategy: &str, seed, accuracy| RunResult {
            strategy: strategy.into(),
            setup: "0.2".into(),
            seed,
            final_accuracy: Some(accuracy),
            mean_anme: Some(0.5),
            mean_update_cosine: None,
            error: None,
            seconds: 0.0,
            accuracy_per_round: Vec::new(),
            time_per_round: Vec::new(),
        };
        let results = [
            run("top-n", 1, 0.40),
            run("top-n", 2, 0.42),
            run("top-n", 3, 0.41),
            run("prism", 1, 0.80),
            run("prism", 2, 0.82),
            run("prism", 3, 0.81),
            run("unbiased", 1, 0.30),
            run("unbiased", 2, 0.36),
            run("unbiased", 3, 0.33),
        ];
        let strategies = parse_strategies("top-n,prism,unbiased").unwrap();
        let text = ranking(&results, &strategies, &[Setup::uniform(0.2)]);
        assert!(
            text.contains("- r = 0.2: prism 81.0 [78.5, 83.5] > top-n 41.0 [38.5, 43.5] ≈ unbiased 33.0 [25.5, 40.5]\n"),
            "{text}"
        );
    }

    /// The time-to-target table: per strategy and setup the mean time of the seeds that reached
    /// the target, the reference in every column, `never` for a cell none reached.
    #[test]
    fn the_time_table_averages_the_seeds_that_reached_the_target() {
        let run = |strategy: &str, setup: &str, accuracy: [f64; 3]| RunResult {
            strategy: strategy.into(),
            setup: setup.into(),
            seed: 1,
            final_accuracy: Some(accuracy[2]),
            mean_anme: Some(0.0),
            mean_update_cosine: None,
            error: None,
            seconds: 0.0,
            accuracy_per_round: accuracy.to_vec(),
            time_per_round: vec![5.0, 10.0, 15.0],
        };
        let results = [
            run("prism", "0.2", [0.5, 0.9, 0.95]),
            run("prism", "0.2", [0.9, 0.9, 0.95]),
            run("top-n", "0.2", [0.1, 0.2, 0.3]),
            run(NO_SHARDING, FULL_MODEL, [0.95, 0.96, 0.97]),
        ];
        let strategies = parse_strategies("prism,top-n").unwrap();
        let text = time_table(
            &results,
            (&strategies, &[Setup::uniform(0.2)]),
            0.9,
            "simulated",
        );
        assert!(
            text.contains("Time to 90% test accuracy (simulated seconds"),
            "{text}"
        );
        assert!(text.contains("| prism | 7.5 (2/2) |"), "{text}");
        assert!(text.contains("| top-n | never (0/1) |"), "{text}");
        assert!(
            text.contains(&format!("| {NO_SHARDING} | 5.0 (1/1) |")),
            "{text}"
        );
    }

    /// A failed run is counted in its cell, left out of the statistics and listed with its error.
    #[test]
    fn failed_runs_are_counted_and_listed() {
        let run = |seed, outcome: Result<f64, &str>| RunResult {
            strategy: "unbiased".into(),
            setup: "0.1".into(),
            seed,
            final_accuracy: outcome.ok(),
            mean_anme: outcome.ok().map(|_| 0.5),
            mean_update_cosine: None,
            error: outcome.err().map(String::from),
            seconds: 0.0,
            accuracy_per_round: Vec::new(),
            time_per_round: Vec::new(),
        };
        let strategies = parse_strategies("unbiased").unwrap();
        let setups = [Setup::uniform(0.1)];
        let results = [run(1, Ok(0.8)), run(2, Err("round 3: diverged"))];
        let c = cell(&results, "unbiased", "0.1").unwrap();
        assert_eq!((c.completed, c.failed, c.accuracy_std), (1, 1, 0.0));
        let text = table(&results, &strategies, &setups);
        assert!(
            text.contains("| 80.0 ± 0.0 (1/2 failed) | 0.50 |"),
            "{text}"
        );
        assert!(
            text.contains("- unbiased 0.1 seed 2: round 3: diverged"),
            "{text}"
        );
        let text = table(&results[1..], &strategies, &setups);
        assert!(text.contains("| unbiased | failed (1/1) | – |"), "{text}");
    }
}
