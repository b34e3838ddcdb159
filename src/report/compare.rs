//! The output folder of `fedshard compare --out DIR`: the table as markdown (`table.md`) and as
//! CSV (`table.csv`, one line per cell), every run (`runs.csv`), and per keep-ratio setup one
//! figure of test accuracy per round with a line per strategy (`accuracy-SETUP.svg`, `.png`).

use super::figure::{Figure, Legend, Series, ValueAxis};
use crate::compare::{self, FULL_MODEL, NO_SHARDING, RunResult, Setup};
use anyhow::Context;
use fedshard_strategies::sharding::strategy::Strategy;
use std::path::Path;

/// Writes every output into `dir` (created if missing). `markdown` is the table as printed,
/// with its heading lines.
pub fn write(
    dir: &Path,
    markdown: &str,
    results: &[RunResult],
    strategies: &[Strategy],
    setups: &[Setup],
    step: &'static str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let texts = [
        ("table.md", markdown.to_string()),
        ("table.csv", table_csv(results, strategies, setups)),
        ("runs.csv", runs_csv(results)),
    ];
    for (name, text) in texts {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    for (stem, figure) in accuracy_figures(results, strategies, setups, step) {
        figure.write(dir, &stem)?;
    }
    Ok(())
}

/// One line per cell of the table, with the same statistics and the 95% t-interval of the mean
/// accuracy: accuracy as a fraction (not %), empty fields where no run of the cell completed
/// (the interval also where only one did).
pub fn table_csv(results: &[RunResult], strategies: &[Strategy], setups: &[Setup]) -> String {
    let columns = [
        "strategy",
        "setup",
        "accuracy_mean",
        "accuracy_std",
        "ci95_low",
        "ci95_high",
        "anme_mean",
        "completed",
        "failed",
    ];
    let rows = cells(strategies, setups)
        .into_iter()
        .filter_map(|(strategy, setup)| {
            let c = compare::cell(results, &strategy, &setup)?;
            let number = |v: f64| {
                if c.completed > 0 {
                    v.to_string()
                } else {
                    String::new()
                }
            };
            let (low, high) = c.interval_95().unzip();
            Some([
                strategy,
                setup,
                number(c.accuracy_mean),
                number(c.accuracy_std),
                optional(low),
                optional(high),
                number(c.anme_mean),
                c.completed.to_string(),
                c.failed.to_string(),
            ])
        });
    csv_text(columns, rows)
}

/// Every run: its labels, seed, outcome, wall time and error (quoted: errors hold commas).
pub fn runs_csv(results: &[RunResult]) -> String {
    let columns = [
        "strategy",
        "setup",
        "seed",
        "final_accuracy",
        "mean_anme",
        "mean_update_cosine",
        "seconds",
        "error",
    ];
    let rows = results.iter().map(|r| {
        [
            r.strategy.clone(),
            r.setup.clone(),
            r.seed.to_string(),
            optional(r.final_accuracy),
            optional(r.mean_anme),
            optional(r.mean_update_cosine),
            r.seconds.to_string(),
            r.error.clone().unwrap_or_default(),
        ]
    });
    csv_text(columns, rows)
}

/// A number's cell, empty when there is none.
fn optional(value: Option<f64>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

/// A CSV document through the csv crate, which quotes a cell holding a comma, a quote or a line
/// break; each row has as many cells as there are columns, by its type.
fn csv_text<const N: usize>(
    columns: [&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) -> String {
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    // Into memory and with rows of one length, writing cannot fail.
    let written: csv::Result<()> = std::iter::once(columns.map(String::from))
        .chain(rows)
        .try_for_each(|row| writer.write_record(&row));
    written.expect("rows of the header's length, written into memory");
    let bytes = writer.into_inner().expect("a writer into memory flushes");
    String::from_utf8(bytes).expect("cells are UTF-8 strings")
}

/// Per setup, `(file stem, figure)`: the test accuracy after each round, averaged over the
/// completed seeds of each strategy, and the no-sharding reference (which every setup shares).
/// A strategy with failed runs says how many in its legend entry, since its line averages
/// fewer seeds than the title says. `step` is what the runs count: `round` or `version`.
pub fn accuracy_figures(
    results: &[RunResult],
    strategies: &[Strategy],
    setups: &[Setup],
    step: &'static str,
) -> Vec<(String, Figure)> {
    setups
        .iter()
        .map(|setup| {
            let rows = strategies
                .iter()
                .map(|s| (s.to_string(), setup.name.as_str()))
                .chain(std::iter::once((NO_SHARDING.to_string(), FULL_MODEL)));
            let series = rows
                .filter_map(|(strategy, setup_name)| {
                    let curve = mean_curve(results, &strategy, setup_name);
                    let cell = compare::cell(results, &strategy, setup_name)?;
                    let label = if cell.failed > 0 {
                        let runs = cell.failed + cell.completed;
                        format!("{strategy} ({} of {runs} failed)", cell.failed)
                    } else {
                        strategy
                    };
                    (!curve.is_empty()).then_some(Series {
                        label,
                        points: curve,
                    })
                })
                .collect();
            let seeds = seeds_of(results, &setup.name);
            let figure = Figure {
                title: format!(
                    "Test accuracy per {step}, {} (mean over {seeds} seed{})",
                    setup.describe(),
                    if seeds == 1 { "" } else { "s" }
                ),
                step,
                value_label: "accuracy".into(),
                value_axis: ValueAxis::Fixed(0.0, 1.0),
                legend: Legend::LowerRight,
                series,
            };
            (format!("accuracy-{}", file_stem(&setup.name)), figure)
        })
        .collect()
}

/// The mean, round by round, of the accuracy curves of the completed runs of a cell.
fn mean_curve(results: &[RunResult], strategy: &str, setup: &str) -> Vec<(f64, f64)> {
    let curves: Vec<&[f64]> = results
        .iter()
        .filter(|r| r.strategy == strategy && r.setup == setup && r.error.is_none())
        .map(|r| r.accuracy_per_round.as_slice())
        .filter(|c| !c.is_empty())
        .collect();
    let rounds = curves.iter().map(|c| c.len()).max().unwrap_or(0);
    (0..rounds)
        .map(|i| {
            let values: Vec<f64> = curves.iter().filter_map(|c| c.get(i).copied()).collect();
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            ((i + 1) as f64, mean)
        })
        .collect()
}

/// How many distinct seeds ran under `setup`.
fn seeds_of(results: &[RunResult], setup: &str) -> usize {
    let mut seeds: Vec<u64> = results
        .iter()
        .filter(|r| r.setup == setup)
        .map(|r| r.seed)
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    seeds.len()
}

/// The table's cells in its order: strategies by setup, then the reference.
fn cells(strategies: &[Strategy], setups: &[Setup]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = strategies
        .iter()
        .flat_map(|s| {
            setups
                .iter()
                .map(move |setup| (s.to_string(), setup.name.clone()))
        })
        .collect();
    out.push((NO_SHARDING.into(), FULL_MODEL.into()));
    out
}

/// A setup name as a file name: `0.1` and `mixed` stay, anything else becomes `_`.
fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strategy: &str, setup: &str, seed: u64, curve: &[f64]) -> RunResult {
        RunResult {
            strategy: strategy.into(),
            setup: setup.into(),
            seed,
            final_accuracy: curve.last().copied(),
            mean_anme: Some(0.5),
            mean_update_cosine: Some(0.9),
            error: None,
            seconds: 1.0,
            accuracy_per_round: curve.to_vec(),
            time_per_round: Vec::new(),
        }
    }

    /// Two seeds of unbiased at 0.1: the figure's line is their round-by-round mean; the
    /// reference appears in the setup's figure too; a failed run adds no line.
    #[test]
    fn figures_average_the_seeds_per_round() {
        let mut failed = run("top-n", "0.1", 1, &[]);
        failed.error = Some("round 2: diverged, badly".into());
        failed.final_accuracy = None;
        failed.mean_update_cosine = None;
        let results = [
            run(NO_SHARDING, FULL_MODEL, 1, &[0.5, 0.9]),
            run("unbiased", "0.1", 1, &[0.2, 0.4]),
            run("unbiased", "0.1", 2, &[0.4, 0.6]),
            failed,
        ];
        let strategies = compare::parse_strategies("unbiased,top-n").unwrap();
        let setups = [Setup::uniform(0.1)];
        let figures = accuracy_figures(&results, &strategies, &setups, "round");
        assert_eq!(figures.len(), 1);
        let (stem, figure) = &figures[0];
        assert_eq!(stem, "accuracy-0.1");
        assert!(figure.title.contains("r = 0.1") && figure.title.contains("2 seeds"));
        let labels: Vec<&str> = figure.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["unbiased", NO_SHARDING]);
        let mut half_failed = results.to_vec();
        half_failed.push(run("top-n", "0.1", 2, &[0.3, 0.35]));
        let figures = accuracy_figures(&half_failed, &strategies, &setups, "round");
        assert_eq!(figures[0].1.series[1].label, "top-n (1 of 2 failed)");
        let points = &figure.series[0].points;
        assert_eq!(points.len(), 2);
        assert!((points[0].1 - 0.3).abs() < 1e-12 && (points[1].1 - 0.5).abs() < 1e-12);

        let table = table_csv(&results, &strategies, &setups);
        let lines: Vec<&str> = table.lines().collect();
        let cells: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(cells[..3], ["unbiased", "0.1", "0.5"]);
        assert!((cells[3].parse::<f64>().unwrap() - 0.02f64.sqrt()).abs() < 1e-12);
        // t(0.975; 1) = 12.7062: 0.5 ± 12.7062 · √0.02/√2.
        let half = 12.706_205 * 0.1;
        assert!((cells[4].parse::<f64>().unwrap() - (0.5 - half)).abs() < 1e-5);
        assert!((cells[5].parse::<f64>().unwrap() - (0.5 + half)).abs() < 1e-5);
        assert_eq!(cells[6..], ["0.5", "2", "0"]);
        assert_eq!(lines[2], "top-n,0.1,,,,,,0,1");
        assert_eq!(lines[3], "no sharding,full,0.9,0,,,0.5,1,0");
        let runs = runs_csv(&results);
        assert!(runs.contains("\nunbiased,0.1,2,0.6,0.5,0.9,1,\n"), "{runs}");
        assert!(
            runs.ends_with("top-n,0.1,1,,0.5,,1,\"round 2: diverged, badly\"\n"),
            "{runs}"
        );
    }

    #[test]
    fn csv_text_quotes_only_when_needed() {
        let text = csv_text(["a", "b"], [["top-n+scaled".into(), "a \"b\", c".into()]]);
        assert_eq!(text, "a,b\ntop-n+scaled,\"a \"\"b\"\", c\"\n");
        assert_eq!(file_stem("0.1"), "0.1");
        assert_eq!(file_stem("a/b c"), "a_b_c");
    }
}
