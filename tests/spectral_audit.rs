//! The sharded round audited end to end against the sharding paper, Sec. 3.1 and 3.3: what the server
//! does to the global model must depend only on what the clients changed.
//!
//! The per-step checks live next to the code: the hand-computed fold and a dense client beside
//! sharded ones (`actors/src/round.rs`), ClipLR's per-term scale and the Frobenius decay on
//! `U Ω Vᵀ` (`tests/neural.rs`), the term-change update of `W` (`strategies/src/svd.rs`).

use fedshard::config::Config;
use fedshard::federation;
use fedshard_protocol::model::ModelState;
use fedshard_strategies::sharding::plan::STRATEGY_NAMES;
use std::path::Path;

/// Every strategy of Table 1.
fn strategies() -> Vec<&'static str> {
    STRATEGY_NAMES
        .split(", ")
        .map(|s| s.split(' ').next().unwrap_or(s))
        .collect()
}

fn digits(strategy: &str, keep_ratios: &str, rounds: usize) -> Config {
    let text = format!(
        r#"
[run]
name = "audit"
seed = 5
rounds = {rounds}

[data]
dataset = "digits"
clients = 8
alpha = 1.0
min_samples = 20

[model]
kind = "neural"
sharded_layers = ["fc1.weight"]

[model.network]
architecture = "mlp"
inputs = 64
hidden = [32, 24]
classes = 10

[training]
learning_rate = 0.1
epochs = 1
batch_size = 32
weight_decay = 0.01

[federation]
clients_per_round = 4
strategy = "{strategy}"
keep_ratios = {keep_ratios}
deadline_ms = 60000
"#
    );
    Config::parse(&text, Path::new("audit.toml")).expect("valid audit config")
}

fn final_model(config: &Config) -> ModelState {
    federation::run_to_end(config).expect("run completes").0
}

const MIXES: [&str; 3] = [
    "[{ ratio = 1.0, share = 1.0 }]",
    "[{ ratio = 0.2, share = 1.0 }]",
    "[{ ratio = 1.0, share = 0.4 }, { ratio = 0.5, share = 0.3 }, { ratio = 0.1, share = 0.3 }]",
];

/// Zero learning rate: every client sends back exactly what it got, so under every strategy
/// and keep-ratio mix (ω ≠ 1, ClipLR, +Scaled, dense and sharded clients together) the global
/// model after two rounds is the initial model, bit for bit. Before the fold moved `W` by the
/// change of its terms, the SVD's rounding reached every sharded weight every round.
#[test]
fn zero_learning_rate_leaves_the_model_bit_identical_under_every_strategy_and_mix() {
    for strategy in strategies() {
        for mix in MIXES {
            let mut config = digits(strategy, mix, 2);
            config.training.recipe.learning_rate = 0.0;
            let initial = federation::initial_model(&config, config.run.seed);
            let after = final_model(&config);
            assert!(
                after.to_bytes() == initial.to_bytes(),
                "{strategy} with keep ratios {mix}: the model moved at lr = 0"
            );
        }
    }
}

/// At keep ratio 1 every strategy keeps every term with ω = 1 (Top-n, PriSM and the samplers
/// all take the whole spectrum; Unbiased's π = 1 gives ω = 1/π = 1; ClipLR never clips; +Scaled
/// multiplies by 1), so every strategy is the dense-factorised run, bit for bit.
#[test]
fn at_keep_ratio_one_every_strategy_is_the_dense_factorised_run() {
    let all = strategies();
    let reference = final_model(&digits("top-n", MIXES[0], 3));
    let initial = federation::initial_model(&digits("top-n", MIXES[0], 3), 5);
    assert!(
        reference.to_bytes() != initial.to_bytes(),
        "the reference run must train"
    );
    for strategy in &all[1..] {
        let model = final_model(&digits(strategy, MIXES[0], 3));
        assert!(
            model.to_bytes() == reference.to_bytes(),
            "{strategy} at r = 1 differs from the dense-factorised (top-n, r = 1) run"
        );
    }
}
