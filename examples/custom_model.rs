//! Bring your own model: a network written in Rust through the training crate's `Builder`,
//! trained in a federation with spectral sharding on the embedded 8×8 digits.
//!
//! The network is an MLP 64 → 96 → 96 → 10 whose middle layer is shardable: half of the
//! clients train only half of its singular terms each round (keep ratio 0.5, the Unbiased
//! strategy), the others the whole model. It must reach 80% held-out accuracy in 5 rounds;
//! the program exits non-zero otherwise.
//!
//! Run: `cargo run --release --example custom_model` (CI runs it through tests/examples.rs).

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use fedshard::config::Settings;
use fedshard::federation::{self, Own};
use fedshard_training::data::{digits, split};
use fedshard_training::models::NetError;
use fedshard_training::models::builder::Builder;
use fedshard_training::models::kernels::{Cohort, Kernels};
use fedshard_training::models::layers::{Affine, Weight};
use fedshard_training::models::network::{Forward, Network};
use fedshard_training::train::neural::Examples;

/// The description every client and the server share: sizes only, no tensors.
#[derive(Debug, Clone)]
struct ShardedMlp {
    hidden: usize,
}

/// The burn module it builds; every layer comes from the builder, so the runtime knows its
/// tensors by name and can send the middle layer as a spectral shard.
#[derive(Module, Debug)]
struct ShardedMlpNet<B: Backend> {
    input: Affine<B>,
    middle: Affine<B>,
    output: Affine<B>,
}

impl Network for ShardedMlp {
    type Module<B: Kernels> = ShardedMlpNet<B>;

    fn input_width(&self) -> usize {
        digits::DIM
    }

    fn build<B: Kernels>(&self, b: &mut Builder<B>) -> Result<ShardedMlpNet<B>, NetError> {
        let h = self.hidden;
        Ok(ShardedMlpNet {
            // (name, inputs, outputs, bias, shardable): first and last layers stay dense, as
            // in the papers; the middle one is factorised W = Σ λ_i u_i v_iᵀ and sharded.
            input: b.affine("input", digits::DIM, h, true, false)?,
            middle: b.affine("middle", h, h, true, true)?,
            output: b.affine("output", h, digits::CLASSES, true, false)?,
        })
    }
}

impl<B: Kernels> Forward<B> for ShardedMlpNet<B> {
    fn forward(&self, x: Tensor<B, 2>, cohort: &Cohort) -> Tensor<B, 2> {
        let h = relu(self.input.forward(x, cohort));
        let h = relu(self.middle.forward(h, cohort));
        self.output.forward(h, cohort)
    }

    fn weights(&self) -> Vec<&Weight<B>> {
        vec![&self.input.weight, &self.middle.weight, &self.output.weight]
    }
}

/// The federation: everything but the model and data, as in a config file.
const SETTINGS: &str = r#"
[run]
name = "custom-model"
seed = 7
rounds = 5

[training]
learning_rate = 0.05
momentum = 0.5
epochs = 2
batch_size = 16

[federation]
clients_per_round = 8
aggregator = "fedavg"
strategy = "unbiased"
keep_ratios = [{ ratio = 1.0, share = 0.5 }, { ratio = 0.5, share = 0.5 }]
"#;

/// Held-out accuracy the run must reach (a dense MLP gets ~95% on these digits).
const MIN_ACCURACY: f64 = 0.80;

pub fn main() -> anyhow::Result<()> {
    let settings = Settings::parse(SETTINGS)?;
    let all = digits::load()?;
    let (train, test) = split::train_test(&all, 0.2, settings.run.seed)?;
    // Eight clients, each a contiguous share of the shuffled training rows.
    let clients = 8;
    let share = train.len() / clients;
    let clients: Vec<Box<dyn Examples>> = (0..clients)
        .map(|c| -> anyhow::Result<Box<dyn Examples>> {
            let rows: Vec<usize> = (c * share..(c + 1) * share).collect();
            Ok(Box::new(train.subset(&rows)?))
        })
        .collect::<anyhow::Result<_>>()?;
    let own = Own {
        network: ShardedMlp { hidden: 96 },
        clients,
        test: Box::new(test),
    };
    let (federation, trainers) = own.federation(&settings)?;
    let sharded = federation
        .config
        .sharding
        .as_ref()
        .map(|s| s.spectral_layers().to_vec());
    anyhow::ensure!(
        sharded == Some(vec!["middle.weight".to_string()]),
        "expected the middle layer sharded, found {sharded:?}"
    );
    let (_, summary) = federation::run(federation, trainers)?;
    let accuracy = summary.final_accuracy;
    println!(
        "custom model: held-out accuracy {accuracy:.3} after {} rounds",
        summary.rounds_completed
    );
    anyhow::ensure!(
        accuracy >= MIN_ACCURACY,
        "accuracy {accuracy:.3} is below {MIN_ACCURACY}"
    );
    Ok(())
}
