//! Client-level differential privacy end to end (docs/privacy.md): the shipped config is
//! accounted as what it runs, a reduced form of it learns and writes its ε, the noise comes
//! from the seed, async buffers run privately, and a config whose sampling the accountant
//! cannot bound is refused with its reason.

mod common;

use fedshard::config::Config;
use fedshard_protocol::uplink::fedpm::{MASK_HIGH, MASK_LOW};
use fedshard_strategies::privacy::Sampling;
use std::path::Path;

const SHIPPED: &str = "config/digits-cnn-dp.toml";

fn shipped() -> Config {
    Config::load(Path::new(SHIPPED)).expect("the shipped DP config loads")
}

/// The shipped config, reduced for a debug build: 200 clients, 60 expected per round, six
/// rounds (the learning rate stays: the cosine schedule follows the rounds).
fn reduced(rounds: u64) -> Config {
    let text = std::fs::read_to_string(SHIPPED)
        .unwrap()
        .replace("clients = 1000", "clients = 200")
        .replace("clients_per_round = 200", "clients_per_round = 60")
        .replace("rounds = 40", &format!("rounds = {rounds}"));
    Config::parse(&text, Path::new("reduced.toml")).expect("the reduced config is valid")
}

/// FedPM's global model is mask probabilities: a private FedPM run keeps them in FedPM's own
/// range [0.01, 0.99] (the noised mean is projected back; the evaluation checks [0, 1] every
/// round) and reports its ε.
#[test]
fn a_private_fedpm_run_keeps_its_mask_probabilities_in_range() {
    let text = std::fs::read_to_string(SHIPPED)
        .unwrap()
        .replace(
            "kind = \"neural\"\n\n[model.network]\narchitecture = \"digits-cnn\"\nclasses = 10",
            "kind = \"fedpm\"\nhidden = [32]",
        )
        .replace("clients = 1000", "clients = 200")
        .replace("clients_per_round = 200", "clients_per_round = 60")
        .replace("rounds = 40", "rounds = 8");
    let config = Config::parse(&text, Path::new("fedpm-dp.toml")).expect("FedPM with [privacy]");
    let privacy = config.privacy.as_ref().expect("[privacy]");
    let (low, high) = (MASK_LOW, MASK_HIGH);
    assert_eq!(privacy.settings(&config).domain, Some((low, high)));
    let dir = tempfile::tempdir().unwrap();
    let (_, model, summary) = common::run_in(dir.path(), &config);
    assert_eq!(summary.per_round.len(), 8);
    assert!(summary.per_round.iter().all(|r| r.privacy.is_some()));
    let values = model.tensors.iter().flat_map(|t| &t.data);
    assert!(values.clone().all(|v| (low..=high).contains(v)));
    // The projection was needed: some probability sits on a bound.
    assert!(values.clone().any(|v| *v == low || *v == high));
}

#[test]
fn the_shipped_config_is_accounted_as_the_poisson_sampling_it_runs() {
    let config = shipped();
    let privacy = config.privacy.as_ref().expect("[privacy]");
    let settings = privacy.settings(&config);
    assert_eq!(settings.sampling, Sampling::Poisson { rate: 0.2 });
    assert_eq!(settings.expected_updates, 200.0);
    assert!(settings.delta < 1.0 / 1000.0, "δ below 1/N");
}

/// Six rounds of 60 expected clients out of 200 with z = 1 and an adaptive clip: the model
/// learns (well above the 10% of chance), each round records ε, ε grows, and `summary.json`'s
/// privacy block names the mechanism.
#[test]
fn a_reduced_private_run_learns_and_reports_what_it_spent() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, summary) = common::run_in(dir.path(), &reduced(6));
    let rounds = &summary.per_round;
    assert_eq!(rounds.len(), 6);
    let last = rounds.last().unwrap();
    assert!(last.accuracy > 0.3, "accuracy {}", last.accuracy);
    let eps: Vec<f64> = rounds.iter().map(|r| r.privacy.unwrap().epsilon).collect();
    assert!(eps.windows(2).all(|w| w[0] < w[1]), "{eps:?}");

    let json: serde_json::Value = serde_json::to_value(&summary).expect("summary serialises");
    let block = &json["privacy"];
    assert_eq!(block["sampling"], "poisson");
    assert_eq!(block["rate"], 0.3);
    assert_eq!(block["rounds"], 6);
    assert_eq!(block["delta"], 1e-4);
    assert_eq!(block["noise_multiplier"], 1.0);
    assert_eq!(block["epsilon"], eps[5]);
    let line = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert!(line.contains("\"privacy\":{\"epsilon\":"), "{line}");
}

/// With `target_epsilon` the run stops before the round whose release would pass it: every
/// recorded ε is within the target, and the next round's would not be.
#[test]
fn a_target_epsilon_stops_the_run_before_it_is_passed() {
    let mut config = reduced(6);
    let settings = config.privacy.as_ref().unwrap().settings(&config);
    let accountant = settings.accountant().unwrap();
    let after = |rounds| accountant.epsilon(rounds, 1e-4).epsilon;
    let target = (after(3) + after(4)) / 2.0;
    config.privacy.as_mut().unwrap().target_epsilon = Some(target);
    let (_, summary) = fedshard::federation::run_to_end(&config).expect("runs");
    assert_eq!(summary.per_round.len(), 3);
    assert!(summary.privacy.unwrap().epsilon <= target);
}

/// A private run stopped after two rounds (by its target ε) and resumed ends with the model
/// bytes of the uninterrupted run: the adaptive clip norm comes back from the records, the
/// noise from the seed and the round.
#[test]
fn a_resumed_private_run_ends_with_the_uninterrupted_model() {
    let config = reduced(4);
    let whole = tempfile::tempdir().unwrap();
    let (_, straight, _) = common::run_in(whole.path(), &config);

    let settings = config.privacy.as_ref().unwrap().settings(&config);
    let accountant = settings.accountant().unwrap();
    let mut stopped = config.clone();
    let target = (accountant.epsilon(2, 1e-4).epsilon + accountant.epsilon(3, 1e-4).epsilon) / 2.0;
    stopped.privacy.as_mut().unwrap().target_epsilon = Some(target);
    let split = tempfile::tempdir().unwrap();
    let (_, _, first) = common::run_in(split.path(), &stopped);
    assert_eq!(first.per_round.len(), 2);
    let (resumed, model, summary) = common::run_in(split.path(), &config);
    assert!(resumed);
    assert_eq!(summary.per_round.len(), 4);
    assert!(model == straight, "the resumed run's model differs");
}

/// The same seed gives the same model bytes (the noise is drawn from the run's streams), and
/// the next seed another.
#[test]
fn the_noise_comes_from_the_seed() {
    common::assert_reproducible(&reduced(2));
}

/// A buffered async run adds noise to each buffer and accounts it without sampling (a fixed
/// clip: with a buffer of 10, adaptive clipping's default count noise σ_b = 10/20 would take
/// all of z = 1, which the config refuses).
#[test]
fn async_buffers_are_private_and_accounted_without_amplification() {
    let text = std::fs::read_to_string(SHIPPED)
        .unwrap()
        .replace("clients = 1000", "clients = 60")
        .replace("clients_per_round = 200", "clients_per_round = 20")
        .replace("rounds = 40", "rounds = 3")
        .replace("adaptive_quantile = 0.5\n", "")
        .replace("selector = \"poisson\"", "selector = \"uniform\"")
        .replace(
            "deadline_ms = 120000",
            "deadline_ms = 120000\nmode = \"async\"\nconcurrency = 20\nbuffer = 10",
        );
    let config = Config::parse(&text, Path::new("async.toml")).expect("valid");
    let (_, summary) = fedshard::federation::run_to_end(&config).expect("runs");
    let privacy = summary.privacy.expect("privacy block");
    assert_eq!(privacy.sampling, Sampling::None);
    assert_eq!(privacy.rounds, 3);
    for r in &summary.per_round {
        let clients: std::collections::BTreeSet<_> = r.client_uplink_bits.keys().collect();
        assert_eq!(
            clients.len(),
            r.successes,
            "one update per client per buffer"
        );
    }
    assert!(privacy.epsilon > 0.0 && privacy.epsilon.is_finite());
}

/// What the accountant cannot bound is refused before anything runs, with the field and why.
#[test]
fn unaccountable_sampling_is_refused_with_its_reason() {
    let base = std::fs::read_to_string(SHIPPED).unwrap();
    let refused = |from: &str, to: &str| {
        let text = base.replacen(from, to, 1);
        assert_ne!(text, base, "{from}");
        let err = Config::parse(&text, Path::new("bad.toml")).unwrap_err();
        format!("{err:#}")
    };
    let optimal = refused(
        "selector = \"poisson\"\naggregator = \"uniform\"",
        "selector = \"optimal-partial\"\naggregator = \"inverse-probability\"",
    );
    assert!(optimal.contains("bad.toml"), "{optimal}");
    assert!(optimal.contains("field `federation.selector`"), "{optimal}");
    assert!(optimal.contains("update norms"), "{optimal}");
    let fedavg = refused("aggregator = \"uniform\"", "aggregator = \"fedavg\"");
    assert!(fedavg.contains("field `federation.aggregator`"), "{fedavg}");
    let over = refused(
        "selector = \"poisson\"",
        "selector = \"uniform\"\nover_commit = 1.5",
    );
    assert!(over.contains("field `federation.over_commit`"), "{over}");
    let delta = refused("delta = 1e-4", "delta = 2");
    assert!(delta.contains("field `privacy.delta`"), "{delta}");
    let count = refused(
        "adaptive_quantile = 0.5",
        "adaptive_quantile = 0.5\nclipped_count_stddev = 0.4",
    );
    assert!(count.contains("privacy.clipped_count_stddev"), "{count}");
    let stray = refused("adaptive_quantile = 0.5", "clip_learning_rate = 0.1");
    assert!(stray.contains("privacy.clip_learning_rate"), "{stray}");
}
