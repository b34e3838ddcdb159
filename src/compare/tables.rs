//! The markdown `fedshard compare` prints: Table 1 itself, the ranking by intervals and the
//! time-to-accuracy table.

use super::{Cell, FULL_MODEL, NO_SHARDING, RunResult, Setup, cell, time_to_cell};
use fedshard_strategies::sharding::strategy::Strategy;
use std::fmt::Write as _;

/// The time to `target` test accuracy per strategy and setup, laid out as [`table`]: the mean
/// over the seeds that reached it, in `clock`'s seconds (`simulated` or `wall`).
pub fn time_table(
    results: &[RunResult],
    (strategies, setups): (&[Strategy], &[Setup]),
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

/// Per setup, the strategies ranked by mean final accuracy with the 95% t-interval of each
/// mean, as markdown bullets. Between neighbours `>` means the two intervals do not overlap (a
/// conservative test of a difference), `≈` that they do or that one has no interval. Strategies
/// without a completed run are left out; the no-sharding reference closes each line.
pub fn ranking(results: &[RunResult], strategies: &[Strategy], setups: &[Setup]) -> String {
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
pub fn table(results: &[RunResult], strategies: &[Strategy], setups: &[Setup]) -> String {
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
