//! Robust aggregation end to end (docs/algorithms.md §9): the digits CNN learns with the
//! coordinate-wise median folding every round, the shipped Multi-Krum config folds every round,
//! and a robust aggregator under secure aggregation or differential privacy is refused before
//! anything runs, naming `federation.aggregator` and saying why.

use fedshard::config::Config;
use fedshard::federation;
use std::path::Path;

/// `path` as text with `aggregator = "<from>"` replaced by `aggregator = <to>` and `rounds` set.
fn edited(path: &str, from: &str, to: &str, rounds: u64) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path).expect("shipped config");
    let from = format!("aggregator = \"{from}\"");
    assert!(text.contains(&from), "{path}: {from}");
    let text = text
        .replace(&from, &format!("aggregator = {to}"))
        .replace("rounds = 40", &format!("rounds = {rounds}"));
    Config::parse(&text, Path::new("robust.toml"))
}

/// Runs `config` in process; every round must have moved the model (none declined), and the
/// final accuracy is returned.
fn every_round_folds(config: &Config) -> f64 {
    let (fed, trainers) = federation::in_process(config).expect("federation builds");
    let (_, summary) = federation::run(fed, trainers).expect("the run completes");
    assert_eq!(summary.rounds_completed, config.run.rounds);
    for record in &summary.per_round {
        assert!(record.model_updated, "round {} declined", record.round);
        assert_eq!(record.successes, 10, "round {}", record.round);
    }
    summary.final_accuracy
}

/// The main job's federation (60% of the clients train spectral shards at r = 0.5) with the
/// median of the ten changes as its fold: after 4 rounds it is above the 10% of chance (0.24
/// on our machine; a median of label-skewed clients learns slower than FedAvg's mean).
#[test]
fn the_median_learns_the_digits_cnn() {
    let config = edited("config/digits-cnn.toml", "fedavg", "\"median\"", 4).expect("valid");
    let accuracy = every_round_folds(&config);
    eprintln!("digits CNN, median, 4 rounds: {accuracy}");
    assert!(accuracy > 0.15, "final accuracy {accuracy}");
}

/// `config/digits-cnn-byzantine-krum.toml` as shipped (Multi-Krum, f = 1, m = 9) folds each of
/// its rounds of ten updates and learns (0.26 after 3 rounds on our machine).
#[test]
fn the_shipped_krum_config_folds_every_round() {
    let path = "config/digits-cnn-byzantine-krum.toml";
    let text = std::fs::read_to_string(path)
        .expect("shipped")
        .replace("rounds = 40", "rounds = 3");
    let config = Config::parse(&text, Path::new(path)).expect("valid");
    let accuracy = every_round_folds(&config);
    eprintln!("digits CNN, Multi-Krum f = 1, m = 9, 3 rounds: {accuracy}");
    assert!(accuracy > 0.15, "final accuracy {accuracy}");
}

/// A secure sum shows the server no update, and DP-FedAvg would replace the robust statistic
/// by its noised mean: both refused, by field and reason.
#[test]
fn secure_aggregation_and_privacy_refuse_robust_aggregators() {
    let krum = "{ kind = \"krum\", f = 1, m = 1 }";
    let secure = edited("config/digits-cnn-secagg.toml", "fedavg", krum, 2).unwrap_err();
    let secure = format!("{secure:#}");
    assert!(
        secure.contains("field `federation.aggregator`") && secure.contains("only their sum"),
        "{secure}"
    );
    for robust in ["\"median\"", "{ kind = \"trimmed-mean\", beta = 0.1 }"] {
        let private = edited("config/digits-cnn-dp.toml", "uniform", robust, 2).unwrap_err();
        let private = format!("{private:#}");
        assert!(
            private.contains("field `federation.aggregator`")
                && private.contains("robust statistic of the individual updates"),
            "{private}"
        );
    }
}
