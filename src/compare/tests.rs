//! The oracles of the grid's statistics and tables: small hand-made results with the numbers
//! each cell, interval and ranking must show.

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
