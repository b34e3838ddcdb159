//! End-to-end federations in one process: learning, determinism, faults and malformed updates.

use fedshard::config::Config;
use fedshard::federation;
use fedshard_actors::model::ModelState;
use fedshard_actors::record::Summary;
use std::path::Path;

const DIGITS: &str = r#"
[run]
name = "test-digits"
seed = 7
rounds = 15

[data]
dataset = "digits"
clients = 12
alpha = 1.0
size_sigma = 0.3
min_samples = 20

[model]
kind = "softmax"
sharded_layers = ["weight"]

[training]
learning_rate = 0.1
epochs = 2

[federation]
clients_per_round = 6
strategy = "unbiased"
keep_ratios = [{ ratio = 1.0, share = 0.5 }, { ratio = 0.4, share = 0.5 }]
deadline_ms = 20000
"#;

fn config(text: &str) -> Config {
    Config::parse(text, Path::new("test.toml")).expect("valid test config")
}

fn run(config: &Config) -> (ModelState, Summary) {
    federation::run_to_end(config).expect("run completes")
}

#[test]
fn a_sharded_digits_federation_learns() {
    let (_, summary) = run(&config(DIGITS));
    assert_eq!(summary.rounds_completed, 15);
    // Chance is 0.1 on ten balanced classes.
    assert!(
        summary.final_accuracy > 0.6,
        "final accuracy {}",
        summary.final_accuracy
    );
    let first = summary.per_round[0].accuracy;
    assert!(
        summary.final_accuracy > first,
        "accuracy fell: {first} -> {}",
        summary.final_accuracy
    );
    assert!(
        summary
            .per_round
            .iter()
            .all(|r| r.model_updated && r.uplink_bits > 0)
    );
    // Half the clients hold 40% of the weight: the round reports a positive ANME.
    assert!(summary.per_round.iter().any(|r| r.anme > 0.0));
}

#[test]
fn same_config_and_seed_give_the_same_model_bytes() {
    let mut c = config(DIGITS);
    c.run.rounds = 3;
    let (a, _) = run(&c);
    let (b, _) = run(&c);
    assert_eq!(a.to_bytes(), b.to_bytes());
    c.run.seed += 1;
    let (other, _) = run(&c);
    assert_ne!(a.to_bytes(), other.to_bytes());
}

fn with_faults(kinds: &str, rate: f64) -> Config {
    let text = format!("{DIGITS}\n[faults]\nrate = {rate}\nkinds = [{kinds}]\ndelay_ms = 1500\n")
        .replace("deadline_ms = 20000", "deadline_ms = 700")
        .replace("rounds = 15", "rounds = 8");
    config(&text)
}

#[test]
fn thirty_percent_failing_clients_are_counted_and_the_run_completes() {
    let (_, summary) = run(&with_faults(r#""error", "panic", "timeout""#, 0.3));
    assert_eq!(summary.rounds_completed, 8);
    let failures: usize = summary.per_round.iter().map(|r| r.failures_total()).sum();
    let participants: usize = summary.per_round.iter().map(|r| r.participants).sum();
    assert!(
        failures > 0 && failures < participants,
        "{failures} of {participants}"
    );
    for r in &summary.per_round {
        assert_eq!(
            r.successes + r.failures_total(),
            r.participants,
            "round {}",
            r.round
        );
    }
    let kinds: std::collections::BTreeSet<&str> = summary
        .per_round
        .iter()
        .flat_map(|r| r.failures.keys().map(String::as_str))
        .collect();
    assert!(
        kinds.contains("panic") || kinds.contains("error") || kinds.contains("timeout"),
        "{kinds:?}"
    );
    assert!(
        summary.final_accuracy > 0.3,
        "still learns: {}",
        summary.final_accuracy
    );
}

/// When every client fails, no round may touch the model: it stays bit for bit the initial one.
#[test]
fn failed_clients_never_update_the_model() {
    let c = with_faults(r#""error", "panic", "timeout""#, 1.0);
    let initial = fedshard::train::initial_model(&c, c.run.seed);
    let (model, summary) = run(&c);
    assert_eq!(model.to_bytes(), initial.to_bytes());
    assert!(
        summary
            .per_round
            .iter()
            .all(|r| !r.model_updated && r.successes == 0)
    );
}

#[test]
fn malformed_updates_are_rejected_by_reason_and_never_applied() {
    for (kind, label) in [
        ("non-finite", "non_finite"),
        ("wrong-shape", "shape"),
        ("foreign-indices", "indices"),
    ] {
        let c = with_faults(&format!("\"{kind}\""), 1.0);
        let initial = fedshard::train::initial_model(&c, c.run.seed);
        let (model, summary) = run(&c);
        assert_eq!(model.to_bytes(), initial.to_bytes(), "{kind}");
        for r in &summary.per_round {
            assert_eq!(
                r.rejected.get(label).copied(),
                Some(r.participants),
                "{kind}: {:?}",
                r.rejected
            );
        }
    }
}

#[test]
fn an_aggregate_that_overflows_never_replaces_the_model() {
    let c = with_faults(r#""overflow""#, 1.0);
    let initial = fedshard::train::initial_model(&c, c.run.seed);
    let (model, summary) = run(&c);
    assert_eq!(model.to_bytes(), initial.to_bytes());
    for r in &summary.per_round {
        assert!(!r.model_updated, "round {}", r.round);
        assert_eq!(
            r.successes, r.participants,
            "the updates themselves pass the checks"
        );
        assert_eq!(
            r.rejected.get("non_finite_aggregate").copied(),
            Some(1),
            "{:?}",
            r.rejected
        );
    }
}

#[test]
fn invalid_configs_name_the_field() {
    let cases = [
        (
            DIGITS.replace("clients_per_round = 6", "clients_per_round = -1"),
            "federation.clients_per_round",
        ),
        (
            DIGITS.replace("ratio = 0.4, share = 0.5", "ratio = 0.4, share = 0.7"),
            "federation.keep_ratios",
        ),
        (
            DIGITS.replace("epochs = 2", "epochs = 2\nepocs = 3"),
            "epocs",
        ),
        (
            DIGITS.replace("strategy = \"unbiased\"", "strategy = \"unbaised\""),
            "unbaised",
        ),
        (DIGITS.replace("alpha = 1.0", "alpha = 0.0"), "data.alpha"),
    ];
    for (text, field) in cases {
        let err = format!(
            "{:#}",
            Config::parse(&text, Path::new("bad.toml")).unwrap_err()
        );
        assert!(
            err.contains("bad.toml") && err.contains(field),
            "{field}: {err}"
        );
    }
}

#[test]
fn the_shipped_configs_are_valid() {
    for path in ["config/digits-linear.toml", "config/oneshot-ridge.toml"] {
        Config::load(Path::new(path)).unwrap_or_else(|e| panic!("{path}: {e:#}"));
    }
}

#[test]
fn one_shot_ridge_fesc_beats_fedavg() {
    let text = std::fs::read_to_string("config/oneshot-ridge.toml")
        .unwrap()
        .replace("clients = 500", "clients = 120")
        .replace("clients_per_round = 500", "clients_per_round = 120");
    let fesc = config(&text);
    let (_, s_fesc) = run(&fesc);
    let fedavg = config(&text.replace("aggregator = \"fesc\"", "aggregator = \"fedavg\""));
    let (_, s_fedavg) = run(&fedavg);
    // `accuracy` is R² for regression; the noise alone caps it near 1 − 1/Var(y) ≈ 0.94.
    assert!(
        s_fesc.final_accuracy > 0.8,
        "FESC R² {}",
        s_fesc.final_accuracy
    );
    assert!(
        s_fesc.final_loss < s_fedavg.final_loss,
        "FESC MSE {} vs fedavg {}",
        s_fesc.final_loss,
        s_fedavg.final_loss
    );
}

/// Optimal-partial selection runs the two-phase round of seed 002: every live client trains and
/// reports its update norm, the server samples who uploads with the variance-optimal p_k and
/// aggregates with n_k/p_k weights. The expected number of uploads is the budget m.
#[test]
fn optimal_partial_selection_runs_a_two_phase_round_and_learns() {
    let c = config(
        &DIGITS
            .replace("clients_per_round = 6", "clients_per_round = 4\nselector = \"optimal-partial\"\naggregator = \"inverse-probability\""),
    );
    let (_, summary) = run(&c);
    assert_eq!(summary.rounds_completed, 15);
    let uploads: usize = summary.per_round.iter().map(|r| r.successes).sum();
    let mean = uploads as f64 / 15.0;
    // Σ r_k p_k = 4 with r ∈ {0.4, 1}: between 4 and 10 uploads per round in expectation.
    assert!(
        (2.0..=12.0).contains(&mean),
        "mean uploads per round {mean}"
    );
    assert!(
        summary.per_round.iter().all(|r| r.participants == 12),
        "phase one asks every client"
    );
    assert!(
        summary.final_accuracy > 0.5,
        "final accuracy {}",
        summary.final_accuracy
    );
}
