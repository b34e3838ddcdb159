//! The statistics of a grid over its seeds: means, sample standard deviations and Student-t
//! intervals of the final accuracy, and the time each run took to reach a target accuracy.

use super::RunResult;
use fedshard_actors::record::RoundRecord;
use statrs::distribution::{ContinuousCDF, StudentsT};

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
