//! The research commands `fedshard probs` and `fedshard sample` as a user runs them: JSON out on
//! success, exit code 2 and a one-line message on bad input (docs/algorithms.md §1.11 oracles).

mod common;

use std::path::{Path, PathBuf};

use common::{error_of, stdout_of};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use serde_json::Value;
use tempfile::TempDir;

/// Spectrum A of §1.11 in a shuffled order, with the permutation back to the sorted order.
const A_SORTED: [f64; 6] = [10.0, 5.0, 3.0, 2.0, 1.0, 0.5];
/// `A_SHUFFLED[i] = A_SORTED[A_POSITION[i]]`.
const A_POSITION: [usize; 6] = [3, 0, 5, 2, 4, 1];

const STRATEGIES: [&str; 9] = [
    "top-n",
    "top-n+scaled",
    "scaled",
    "prism",
    "prism+scaled",
    "prism-wallenius",
    "prism-wallenius+cliplr",
    "unbiased",
    "collective",
];

fn write_json(dir: &TempDir, name: &str, contents: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).expect("write input file");
    path
}

fn write_vector(dir: &TempDir, name: &str, values: &[f64]) -> PathBuf {
    write_json(
        dir,
        name,
        &serde_json::to_string(values).expect("serialise"),
    )
}

fn shuffled_a(dir: &TempDir) -> PathBuf {
    let values: Vec<f64> = A_POSITION.iter().map(|&k| A_SORTED[k]).collect();
    write_vector(dir, "a.json", &values)
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// Runs a command that must succeed and returns its single JSON object.
fn json_of(args: &[&str]) -> Value {
    let stdout = stdout_of(args);
    assert_eq!(stdout.trim().lines().count(), 1, "one JSON line: {stdout}");
    let value: Value = serde_json::from_str(stdout.trim()).expect("stdout is JSON");
    assert!(value.is_object(), "a JSON object: {value}");
    value
}

fn numbers(value: &Value, key: &str) -> Vec<f64> {
    value[key]
        .as_array()
        .unwrap_or_else(|| panic!("`{key}` is an array in {value}"))
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// Checks an input-order vector against oracle values given in sorted order.
fn assert_input_order(actual: &[f64], sorted_oracle: &[f64], what: &str) {
    assert_eq!(actual.len(), sorted_oracle.len(), "{what}");
    for (i, (&got, &k)) in actual.iter().zip(&A_POSITION).enumerate() {
        let want = sorted_oracle[k];
        assert!(
            (got - want).abs() <= 1e-6,
            "{what}[{i}] (λ = {}) = {got}, oracle {want}",
            A_SORTED[k]
        );
    }
}

#[test]
fn probs_unbiased_matches_oracle_in_input_order() {
    let dir = TempDir::new().unwrap();
    let a = shuffled_a(&dir);
    let report = json_of(&[
        "probs",
        "--strategy",
        "unbiased",
        "--n",
        "3",
        "--spectrum",
        path_arg(&a),
    ]);
    let mut keys: Vec<&str> = report
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "anme",
            "expected_discrepancy",
            "n",
            "omega",
            "pi",
            "strategy"
        ]
    );
    assert_eq!(report["strategy"], "unbiased");
    assert_eq!(report["n"], 3);
    assert_input_order(
        &numbers(&report, "pi"),
        &[1.0, 0.869565, 0.521739, 0.347826, 0.173913, 0.086957],
        "pi",
    );
    assert_input_order(
        &numbers(&report, "omega"),
        &[1.0, 1.15, 1.916667, 2.875, 5.75, 11.5],
        "omega",
    );
    let e = report["expected_discrepancy"]
        .as_f64()
        .expect("closed form");
    assert!((e - 26.875).abs() < 1e-6, "E = {e}");
    let anme = report["anme"].as_f64().expect("anme");
    assert!((0.0..=1.0).contains(&anme), "anme = {anme}");
}

#[test]
fn probs_keep_ratio_gives_ceiling_of_n_r() {
    let dir = TempDir::new().unwrap();
    let a = shuffled_a(&dir);
    let by_ratio = json_of(&[
        "probs",
        "--strategy",
        "unbiased",
        "--keep-ratio",
        "0.5",
        "--spectrum",
        path_arg(&a),
    ]);
    assert_eq!(by_ratio["n"], 3);
    assert_input_order(
        &numbers(&by_ratio, "pi"),
        &[1.0, 0.869565, 0.521739, 0.347826, 0.173913, 0.086957],
        "pi",
    );
    // ⌈6 · 0.4⌉ = 3 as well, ⌈6 · 0.1⌉ = 1.
    let r04 = json_of(&[
        "probs",
        "--strategy",
        "unbiased",
        "--keep-ratio",
        "0.4",
        "--spectrum",
        path_arg(&a),
    ]);
    assert_eq!(r04["n"], 3);
    let r01 = json_of(&[
        "probs",
        "--strategy",
        "top-n",
        "--keep-ratio",
        "0.1",
        "--spectrum",
        path_arg(&a),
    ]);
    assert_eq!(r01["n"], 1);
}

#[test]
fn probs_collective_matches_oracle() {
    let dir = TempDir::new().unwrap();
    let a = shuffled_a(&dir);
    let report = json_of(&[
        "probs",
        "--strategy",
        "collective",
        "--clients",
        "5",
        "--n",
        "2",
        "--spectrum",
        path_arg(&a),
    ]);
    assert_eq!(report["n"], 2);
    assert_input_order(
        &numbers(&report, "pi"),
        &[1.0, 0.625, 0.275, 0.1, 0.0, 0.0],
        "pi",
    );
    assert_input_order(
        &numbers(&report, "omega"),
        &[1.0, 1.428571, 2.380952, 3.571429, 0.0, 0.0],
        "omega",
    );
    let error = report["expected_discrepancy"].as_f64().expect("error");
    assert!((error - 9.607143).abs() < 1e-6, "error = {error}");
}

#[test]
fn probs_prism_has_no_closed_form_discrepancy() {
    let dir = TempDir::new().unwrap();
    let a = shuffled_a(&dir);
    for strategy in ["prism", "prism+scaled", "prism-wallenius"] {
        let report = json_of(&[
            "probs",
            "--strategy",
            strategy,
            "--n",
            "2",
            "--spectrum",
            path_arg(&a),
        ]);
        assert!(
            report["expected_discrepancy"].is_null(),
            "{strategy}: {report}"
        );
        let sum: f64 = numbers(&report, "pi").iter().sum();
        assert!((sum - 2.0).abs() < 1e-6, "{strategy}: Σπ = {sum}");
    }
    // +scaled on PriSM draws its multipliers per client: no fixed ω.
    let scaled = json_of(&[
        "probs",
        "--strategy",
        "prism+scaled",
        "--n",
        "2",
        "--spectrum",
        path_arg(&a),
    ]);
    assert!(scaled["omega"].is_null(), "{scaled}");
}

#[test]
fn every_strategy_on_random_spectra() {
    let dir = TempDir::new().unwrap();
    for (seed, big_n) in [(1u64, 20usize), (2, 512), (3, 4096)] {
        let mut rng = stream(seed, 0, 0, Purpose::Experiment);
        // Log-uniform over four decades, in random order.
        let spectrum: Vec<f64> = (0..big_n)
            .map(|_| 10f64.powf(-4.0 * uniform(&mut rng)))
            .collect();
        let file = write_vector(&dir, &format!("s{big_n}.json"), &spectrum);
        let n = big_n.div_ceil(10).max(2);
        let n_arg = n.to_string();
        for strategy in STRATEGIES {
            let report = json_of(&[
                "probs",
                "--strategy",
                strategy,
                "--n",
                &n_arg,
                "--clients",
                "4",
                "--spectrum",
                path_arg(&file),
            ]);
            let pi = numbers(&report, "pi");
            assert_eq!(pi.len(), big_n, "{strategy} N = {big_n}");
            assert!(
                pi.iter().all(|p| (0.0..=1.0).contains(p)),
                "{strategy} N = {big_n}: π out of [0, 1]"
            );
            let sum: f64 = pi.iter().sum();
            assert!(
                (sum - n as f64).abs() <= 1e-6,
                "{strategy} N = {big_n}: Σπ = {sum}, n = {n}"
            );
            if let Some(omega) = report["omega"].as_array() {
                assert_eq!(omega.len(), big_n, "{strategy} N = {big_n}");
            }
        }
    }
}

#[test]
fn sample_conditional_poisson_reproduces_pi() {
    let dir = TempDir::new().unwrap();
    let pi = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2];
    let file = write_vector(&dir, "pi.json", &pi);
    let draws = 20_000u32;
    let report = json_of(&[
        "sample",
        "--method",
        "conditional-poisson",
        "--draws",
        &draws.to_string(),
        "--seed",
        "1",
        "--pi",
        path_arg(&file),
    ]);
    assert_eq!(report["method"], "conditional-poisson");
    assert_eq!(report["n"], 3);
    assert_eq!(report["draws"], draws);
    let freq = numbers(&report, "frequencies");
    assert_eq!(freq.len(), pi.len());
    for (i, (&f, &p)) in freq.iter().zip(&pi).enumerate() {
        let sigma = (p * (1.0 - p) / draws as f64).sqrt();
        assert!(
            (f - p).abs() <= 4.0 * sigma,
            "unit {i}: frequency {f}, π {p}, 4σ = {}",
            4.0 * sigma
        );
    }
    // Every draw has exactly n = 3 units, so the frequencies add up to 3.
    let total: f64 = freq.iter().sum();
    assert!((total - 3.0).abs() < 1e-9, "Σ frequencies = {total}");
    assert!(report["seconds_per_draw"].as_f64().unwrap() >= 0.0);
}

#[test]
fn sample_every_pips_design_and_numpy_choice_needs_n() {
    let dir = TempDir::new().unwrap();
    let pi = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2];
    let file = write_vector(&dir, "pi.json", &pi);
    for method in ["brewer", "minimum-support", "systematic"] {
        let report = json_of(&[
            "sample",
            "--method",
            method,
            "--draws",
            "2000",
            "--pi",
            path_arg(&file),
        ]);
        assert_eq!(report["n"], 3, "{method}");
        let total: f64 = numbers(&report, "frequencies").iter().sum();
        assert!(
            (total - 3.0).abs() < 1e-9,
            "{method}: Σ frequencies = {total}"
        );
    }
    let message = error_of(&[
        "sample",
        "--method",
        "numpy-choice",
        "--draws",
        "100",
        "--pi",
        path_arg(&file),
    ]);
    assert!(message.contains("n"), "{message}");
    let report = json_of(&[
        "sample",
        "--method",
        "numpy-choice",
        "--draws",
        "2000",
        "--n",
        "3",
        "--pi",
        path_arg(&file),
    ]);
    assert_eq!(report["n"], 3);
    let total: f64 = numbers(&report, "frequencies").iter().sum();
    assert!((total - 3.0).abs() < 1e-9, "Σ frequencies = {total}");
}

#[test]
fn bad_input_is_a_one_line_error_with_exit_code_2() {
    let dir = TempDir::new().unwrap();
    let a = shuffled_a(&dir);
    let a = path_arg(&a);
    let not_json = write_json(&dir, "bad.json", "10, 5, 3");
    let not_numbers = write_json(&dir, "strings.json", r#"["10", "5"]"#);
    let negative = write_vector(&dir, "neg.json", &[3.0, -1.0, 2.0]);
    let empty = write_json(&dir, "empty.json", "[]");
    let fractional = write_vector(&dir, "frac.json", &[0.5, 0.7]);
    let above_one = write_vector(&dir, "big.json", &[1.5, 0.5]);
    let pi = write_vector(&dir, "pi.json", &[0.9, 0.7, 0.5, 0.4, 0.3, 0.2]);
    let missing = dir.path().join("missing.json");

    let probs = |strategy: &str, size: &[&str], file: &Path| {
        let mut args = vec!["probs", "--strategy", strategy];
        args.extend_from_slice(size);
        args.extend_from_slice(&["--spectrum", path_arg(file)]);
        error_of(&args)
    };
    let sample = |method: &str, file: &Path| {
        error_of(&[
            "sample",
            "--method",
            method,
            "--draws",
            "10",
            "--pi",
            path_arg(file),
        ])
    };

    let m = probs("unbiased", &["--n", "1"], &not_json);
    assert!(m.contains("bad.json") && m.contains("JSON"), "{m}");
    let m = probs("unbiased", &["--n", "1"], &not_numbers);
    assert!(m.contains("JSON array of numbers"), "{m}");
    let m = probs("unbiased", &["--n", "1"], &negative);
    assert!(m.contains("-1") && m.contains("non-negative"), "{m}");
    let m = probs("unbiased", &["--n", "1"], &empty);
    assert!(m.contains("empty"), "{m}");
    let m = probs("unbiased", &["--n", "1"], &missing);
    assert!(m.contains("missing.json"), "{m}");
    let m = sample("conditional-poisson", &not_json);
    assert!(m.contains("JSON"), "{m}");
    let m = sample("conditional-poisson", &negative);
    assert!(m.contains("non-negative"), "{m}");

    // Σπ must be an integer sample size.
    let m = sample("conditional-poisson", &fractional);
    assert!(m.contains("Σπ") && m.contains("integer"), "{m}");
    let m = sample("brewer", &fractional);
    assert!(m.contains("integer"), "{m}");
    let m = sample("systematic", &above_one);
    assert!(m.contains("1.5"), "{m}");

    // n out of range.
    for size in [
        &["--n", "0"][..],
        &["--n", "7"],
        &["--keep-ratio", "0"],
        &["--keep-ratio", "1.5"],
    ] {
        let m = probs("unbiased", size, Path::new(a));
        assert!(
            m.contains("--n") || m.contains("--keep-ratio"),
            "{size:?}: {m}"
        );
    }
    let m = error_of(&[
        "sample",
        "--method",
        "conditional-poisson",
        "--draws",
        "10",
        "--n",
        "4",
        "--pi",
        path_arg(&pi),
    ]);
    assert!(m.contains('4') && m.contains('3'), "{m}");
    let m = error_of(&[
        "sample",
        "--method",
        "conditional-poisson",
        "--draws",
        "0",
        "--pi",
        path_arg(&pi),
    ]);
    assert!(m.contains("--draws"), "{m}");
    let m = probs("collective", &["--n", "2", "--clients", "0"], Path::new(a));
    assert!(m.contains("--clients"), "{m}");

    // Unknown names list the valid ones.
    let m = probs("bogus", &["--n", "2"], Path::new(a));
    assert!(m.contains("bogus"), "{m}");
    for name in STRATEGIES {
        assert!(m.contains(name), "`{name}` missing from: {m}");
    }
    let m = probs("prism-wallenius+scaled", &["--n", "2"], Path::new(a));
    assert!(m.contains("prism-wallenius+scaled"), "{m}");
    let m = sample("bogus-sampler", &pi);
    assert!(m.contains("bogus-sampler"), "{m}");
    for name in [
        "conditional-poisson",
        "brewer",
        "minimum-support",
        "systematic",
        "numpy-choice",
    ] {
        assert!(m.contains(name), "`{name}` missing from: {m}");
    }
}

/// `fedshard widths`, by hand: the digits CNN's `conv0` has 16 channels in 2 GroupNorm groups of
/// 8; r = 0.25 keeps ⌈0.25 · 8⌉ = 2 of each. FedRolex in round 3 starts its window at unit
/// (3 − 1) mod 8 = 2 of each group: channels {2, 3} and {10, 11}; HeteroFL and FjORD keep
/// {0, 1} and {8, 9} in any round, and FjORD draws each batch's level from {0.2, 0.25}.
/// `fc0` (128 units, one group) at r = 0.25 keeps 32. The CNN's ONNX export, its widths traced
/// through its graph, keeps the same units, and a conv2 channel is 2·2 = 4 inputs of fc0.
#[test]
fn widths_prints_the_units_each_strategy_keeps() {
    let onnx = json_of(&[
        "widths",
        "config/onnx-digits-cnn.toml",
        "--strategy",
        "fedrolex",
        "--keep-ratio",
        "0.25",
        "--round",
        "3",
    ]);
    let conv2 = onnx["widths"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["width"] == "conv2"))
        .unwrap_or_else(|| panic!("conv2 in {onnx}"));
    let fc0_input = serde_json::json!({"tensor": "fc0.weight", "axis": 1, "block": 4});
    assert!(
        conv2["axes"]
            .as_array()
            .is_some_and(|a| a.contains(&fc0_input)),
        "{conv2}"
    );
    let conv0 = onnx["widths"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["width"] == "conv0"))
        .unwrap_or_else(|| panic!("conv0 in {onnx}"));
    assert_eq!(numbers(conv0, "kept"), vec![2.0, 3.0, 10.0, 11.0]);
    let kept = |strategy: &str, round: &str| {
        let report = json_of(&[
            "widths",
            "config/digits-cnn.toml",
            "--strategy",
            strategy,
            "--keep-ratio",
            "0.25",
            "--round",
            round,
        ]);
        let widths = report["widths"].as_array().expect("widths").clone();
        let of = |name: &str| -> Vec<f64> {
            let w = widths
                .iter()
                .find(|w| w["width"] == name)
                .unwrap_or_else(|| panic!("width {name} in {report}"));
            numbers(w, "kept")
        };
        let levels = report.get("levels").map(|_| numbers(&report, "levels"));
        (of("conv0"), of("fc0").len(), levels)
    };
    assert_eq!(
        kept("fedrolex", "3"),
        (vec![2.0, 3.0, 10.0, 11.0], 32, None)
    );
    assert_eq!(kept("heterofl", "3"), (vec![0.0, 1.0, 8.0, 9.0], 32, None));
    assert_eq!(
        kept("fjord", "3"),
        (vec![0.0, 1.0, 8.0, 9.0], 32, Some(vec![0.2, 0.25]))
    );
    let err = error_of(&[
        "widths",
        "config/digits-cnn.toml",
        "--strategy",
        "fjordd",
        "--keep-ratio",
        "0.25",
    ]);
    assert!(err.contains("heterofl, fedrolex, fjord"), "{err}");
}
