//! `fedshard compare` on the shipped digits config, shortened to 3 rounds and 2 seeds: the grid
//! through the library, the table and the JSON through the binary, and bad flags as one-line
//! errors with exit code 2.
//!
//! On this tiny layer (a 10 × 64 weight, so N = 10 and n = 1 at r = 0.1) the large
//! Horvitz–Thompson multipliers of Unbiased can make a run diverge until the server's SVD
//! refuses the weights; such a run is a recorded failure, so every assertion below accepts
//! either outcome and checks that it is reported consistently.

mod common;

use common::{error_of, stdout_of};
use fedshard::compare::{
    self, DEFAULT_SETUPS, FULL_MODEL, NO_SHARDING, RunResult, parse_setups, parse_strategies,
};
use fedshard::config::Config;
use serde_json::Value;
use std::path::Path;

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/digits-linear.toml");
const RIDGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/oneshot-ridge.toml");
const STRATEGIES: &str = "top-n,unbiased";
const SHORT: [&str; 6] = ["--strategies", STRATEGIES, "--seeds", "2", "--rounds", "3"];

/// The short grid's JSON with the timings zeroed (they are the only nondeterministic field).
fn runs_without_timings() -> Vec<Value> {
    let mut args = vec!["compare", CONFIG, "--json"];
    args.extend_from_slice(&SHORT);
    let report: Value = serde_json::from_str(stdout_of(&args).trim()).expect("stdout is JSON");
    let mut runs = report["runs"]
        .as_array()
        .expect("`runs` is an array")
        .clone();
    for run in &mut runs {
        let seconds = &mut run["seconds"];
        assert!(seconds.as_f64().is_some_and(|s| s >= 0.0), "{run}");
        *seconds = Value::from(0.0);
    }
    runs
}

/// A run either completed (accuracy and ANME, no error) or failed (an error, neither number).
fn assert_consistent(r: &RunResult) {
    match (&r.final_accuracy, &r.mean_anme, &r.error) {
        (Some(a), Some(_), None) => {
            assert!((0.0..=1.0).contains(a), "{r:?}");
            let cosine = r
                .mean_update_cosine
                .expect("a completed run moved the model");
            assert!((-1.0..=1.0).contains(&cosine), "{r:?}");
        }
        (None, None, Some(e)) => assert!(!e.is_empty(), "{r:?}"),
        _ => panic!("half a result: {r:?}"),
    }
}

#[test]
fn the_library_runs_every_strategy_setup_and_seed_plus_the_reference() {
    let mut config = Config::load(Path::new(CONFIG)).expect("shipped config");
    config.run.rounds = 3;
    let strategies = parse_strategies(STRATEGIES).unwrap();
    let setups = parse_setups(DEFAULT_SETUPS).unwrap();
    let seeds = compare::seeds(config.run.seed, 2);
    assert_eq!(seeds, [1, 2]);
    let mut progress = Vec::new();
    let mut rounds = Vec::new();
    let results = compare::compare(
        &config,
        &strategies,
        &setups,
        compare::Budget::Cost,
        &seeds,
        None,
        &mut |k, total, _, _| progress.push((k, total)),
        &mut |label, record| rounds.push((label.to_string(), record.round)),
    )
    .expect("the grid runs");

    // 1 reference + 2 strategies × 3 setups, each for 2 seeds.
    let total = (1 + 2 * 3) * 2;
    assert_eq!(results.len(), total);
    assert_eq!(
        progress,
        (1..=total).map(|k| (k, total)).collect::<Vec<_>>()
    );
    // Every round of every run reported as it ended, under its run's label.
    assert_eq!(rounds.len(), total * 3);
    assert_eq!(
        rounds[0],
        (format!("[1/{total}] {NO_SHARDING} {FULL_MODEL} seed 1"), 1)
    );
    assert_eq!(rounds[3].1, 1, "the second run starts at round 1");
    assert!(
        rounds[3].0.starts_with(&format!("[2/{total}] ")),
        "{:?}",
        rounds[3]
    );
    for r in &results {
        assert_consistent(r);
    }
    fn of<'a>(results: &'a [RunResult], strategy: &'a str) -> impl Iterator<Item = &'a RunResult> {
        results.iter().filter(move |r| r.strategy == strategy)
    }

    // The reference trains the dense model: no shards, so no ANME, and it never diverges.
    let reference: Vec<&RunResult> = of(&results, NO_SHARDING).collect();
    assert_eq!(reference.len(), 2);
    for r in reference {
        assert_eq!(r.setup, FULL_MODEL);
        assert_eq!(r.mean_anme, Some(0.0), "{r:?}");
    }
    // Top-n is deterministic: ANME 0 (docs/algorithms.md §1.9), and nothing to diverge from.
    assert_eq!(of(&results, "top-n").count(), 6);
    for r in of(&results, "top-n") {
        assert_eq!(r.mean_anme, Some(0.0), "{r:?}");
    }
    // Unbiased is random with marginals summing to n < N: ANME in (0, 1].
    assert_eq!(of(&results, "unbiased").count(), 6);
    let completed: Vec<f64> = of(&results, "unbiased")
        .filter_map(|r| r.mean_anme)
        .collect();
    assert!(!completed.is_empty(), "some unbiased run completes");
    for anme in completed {
        assert!(anme > 0.0 && anme <= 1.0, "unbiased ANME {anme}");
    }
    let seeds_seen: Vec<u64> = of(&results, "unbiased").map(|r| r.seed).collect();
    assert_eq!(seeds_seen, [1, 2, 1, 2, 1, 2]);

    let table = compare::table(&results, &strategies, &setups);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0],
        "| strategy | r = 0.1 acc. % | ANME | r = 0.2 acc. % | ANME \
         | 60% r = 0.2, 40% r = 0.4 acc. % | ANME |"
    );
    let rows: Vec<&str> = lines[2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').nth(1).unwrap_or_default().trim())
        .collect();
    assert_eq!(rows, ["top-n", "unbiased", NO_SHARDING]);
}

/// The table's cells against the per-run JSON: mean and sample standard deviation (n − 1) over
/// the seeds that completed, in %, to the printed 0.1.
#[test]
fn the_table_summarises_the_json_and_runs_are_deterministic() {
    let first = runs_without_timings();
    let second = runs_without_timings();
    assert_eq!(first, second, "same config and seeds, same results");
    let runs: Vec<RunResult> = first
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("a RunResult"))
        .collect();

    let mut args = vec!["compare", CONFIG];
    args.extend_from_slice(&SHORT);
    let out = stdout_of(&args);
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.contains("digits-linear.toml")
            && header.contains("3 rounds")
            && header.contains("20 clients")
            && header.contains("seeds 1,2"),
        "{header}"
    );
    assert!(
        out.contains(&format!(
            "Reproduce: `fedshard compare {CONFIG} --strategies top-n,unbiased \
             --keep-ratios 0.1,0.2,mixed --seeds 2 --rounds 3`"
        )),
        "{out}"
    );
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| strategy"))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    for row in rows {
        assert_eq!(row.len(), 1 + 2 * 3, "{row:?}");
        for (column, setup) in ["0.1", "0.2", "mixed"].into_iter().enumerate() {
            let setup = if row[0] == NO_SHARDING {
                FULL_MODEL
            } else {
                setup
            };
            let cell: Vec<&RunResult> = runs
                .iter()
                .filter(|r| r.strategy == row[0] && r.setup == setup)
                .collect();
            assert_eq!(cell.len(), 2, "{row:?} {setup}");
            let accuracy: Vec<f64> = cell.iter().filter_map(|r| r.final_accuracy).collect();
            let failed = cell.len() - accuracy.len();
            let (printed, anme) = (row[1 + 2 * column], row[2 + 2 * column]);
            if accuracy.is_empty() {
                assert_eq!(printed, format!("failed ({failed}/{failed})"));
                assert_eq!(anme, "–");
                continue;
            }
            let n = accuracy.len() as f64;
            let mean = accuracy.iter().sum::<f64>() / n;
            let std = if accuracy.len() > 1 {
                (accuracy.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
            } else {
                0.0
            };
            let mut expected = format!("{:.1} ± {:.1}", 100.0 * mean, 100.0 * std);
            if failed > 0 {
                expected.push_str(&format!(" ({failed}/{} failed)", cell.len()));
            }
            assert_eq!(printed, expected, "{row:?} {setup}");
            let mean_anme = cell.iter().filter_map(|r| r.mean_anme).sum::<f64>() / n;
            assert_eq!(anme, format!("{mean_anme:.2}"), "{row:?} {setup}");
        }
    }
    for r in runs.iter().filter(|r| r.error.is_some()) {
        let line = format!("- {} {} seed {}: ", r.strategy, r.setup, r.seed);
        assert!(
            out.contains(&line),
            "failed run listed under the table: {line}"
        );
    }
}

#[test]
fn bad_flags_and_unshardable_configs_are_one_line_errors_with_exit_code_2() {
    let m = error_of(&["compare", CONFIG, "--strategies", "top-n,bogus"]);
    assert!(
        m.contains("--strategies") && m.contains("bogus") && m.contains("unbiased"),
        "{m}"
    );
    for (list, bad) in [("0.1,1.5", "1.5"), ("0", "0"), ("half", "half")] {
        let m = error_of(&["compare", CONFIG, "--keep-ratios", list]);
        assert!(
            m.contains("--keep-ratios") && m.contains(bad) && m.contains("(0, 1]"),
            "{m}"
        );
    }
    let m = error_of(&["compare", CONFIG, "--keep-ratios", "0.1,0.1"]);
    assert!(m.contains("--keep-ratios") && m.contains("twice"), "{m}");
    let m = error_of(&["compare", CONFIG, "--seeds", "0"]);
    assert!(m.contains("--seeds"), "{m}");
    let m = error_of(&["compare", CONFIG, "--rounds", "0"]);
    assert!(m.contains("--rounds"), "{m}");
    // `run` names its override flags too, before it writes a run folder.
    let m = error_of(&["run", CONFIG, "--rounds", "0", "--metrics-addr", "off"]);
    assert!(m.contains("--rounds") && m.contains("run.rounds"), "{m}");
    let m = error_of(&["compare", RIDGE]);
    assert!(
        m.contains("sharded_layers") && m.contains("nothing to compare"),
        "{m}"
    );
}

/// A grid stopped after seed 1 and resumed with `--seeds 2` reuses seed 1's runs from
/// `runs.jsonl`, runs only seed 2, and gives the results of an uninterrupted grid.
#[test]
fn a_resumed_grid_reuses_the_journal_and_matches_an_uninterrupted_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("grid");
    let out_arg = out.to_str().expect("utf-8 path");
    fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "compare",
            CONFIG,
            "--strategies",
            "top-n",
            "--keep-ratios",
            "0.2",
        ];
        args.extend_from_slice(&["--rounds", "2", "--json"]);
        args.extend_from_slice(extra);
        args
    }
    let journal_lines = || {
        std::fs::read_to_string(out.join("runs.jsonl"))
            .expect("the journal")
            .lines()
            .count()
    };
    let zero_timings = |json: &str| {
        let mut report: Value = serde_json::from_str(json.trim()).expect("stdout is JSON");
        for run in report["runs"].as_array_mut().expect("`runs` is an array") {
            run["seconds"] = Value::from(0.0);
        }
        report
    };

    stdout_of(&with(&["--seeds", "1", "--out", out_arg]));
    assert_eq!(journal_lines(), 2, "the reference and top-n, seed 1");
    let m = error_of(&with(&["--seeds", "2", "--out", out_arg]));
    assert!(m.contains("runs.jsonl") && m.contains("--resume"), "{m}");

    let resumed = common::fedshard(&with(&["--seeds", "2", "--out", out_arg, "--resume"]));
    assert!(resumed.status.success());
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    let progress: Vec<&str> = stderr.lines().filter(|l| l.contains(" → ")).collect();
    assert_eq!(progress.len(), 4, "{stderr}");
    let reused: Vec<&str> = progress
        .iter()
        .copied()
        .filter(|l| l.contains("from the journal"))
        .collect();
    assert_eq!(reused.len(), 2, "{stderr}");
    assert!(reused.iter().all(|l| l.contains("seed 1")), "{stderr}");
    assert_eq!(journal_lines(), 4);

    let fresh = stdout_of(&with(&["--seeds", "2"]));
    let resumed = String::from_utf8(resumed.stdout).expect("utf-8 stdout");
    assert_eq!(zero_timings(&resumed), zero_timings(&fresh));
}
