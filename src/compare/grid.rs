//! The one grid runner behind `fedshard compare` and `fedshard compare --compressors`: a grid
//! is a list of arms (anything that is a [`GridArm`]) run once per seed, one run after the
//! other, with a journal to resume from.

use crate::compare_journal::{Journal, JournalRow};
use crate::config::Config;
use crate::federation;
use anyhow::ensure;
use fedshard_actors::record::{RoundRecord, Summary};
use std::str::FromStr;
use std::time::Instant;

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

/// `count` consecutive seeds from `first` (wrapping at `u64::MAX`).
pub fn seeds(first: u64, count: usize) -> Vec<u64> {
    (0..count as u64).map(|i| first.wrapping_add(i)).collect()
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
