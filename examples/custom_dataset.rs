//! Bring your own data: rows built in memory (a synthetic three-class problem of Gaussian
//! blobs), partitioned by the program itself with label skew, fed to a federation through the
//! `Examples` trait, and learned by a shipped MLP. Exits non-zero unless held-out accuracy
//! reaches 85%.
//!
//! Run: `cargo run --release --example custom_dataset` (CI runs it through tests/examples.rs).

use fedshard::config::Settings;
use fedshard::federation::{self, Own};
use fedshard_training::models::net::Architecture;
use fedshard_training::train::neural::Examples;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// Features per row and classes.
const WIDTH: usize = 8;
const CLASSES: usize = 3;

/// Labelled rows held in memory: the program's own type, read by the runtime through
/// [`Examples`] only.
struct Blobs {
    features: Vec<[f32; WIDTH]>,
    labels: Vec<usize>,
}

impl Examples for Blobs {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn width(&self) -> usize {
        WIDTH
    }

    /// One class per row (a sequence model would give one per position).
    fn targets_per_row(&self) -> usize {
        1
    }

    /// Appends the rows `samples` (indices into this set) to a batch.
    fn fill(&self, samples: &[usize], x: &mut Vec<f32>, y: &mut Vec<i64>) {
        for &i in samples {
            x.extend_from_slice(&self.features[i]);
            y.push(self.labels[i] as i64);
        }
    }
}

impl Blobs {
    /// `n` rows, class `k` drawn with probability `weights[k]`: the class's centre (3 along
    /// axis k) plus standard Gaussian noise on every feature, so the classes overlap a little.
    fn draw(n: usize, weights: [f64; CLASSES], rng: &mut ChaCha8Rng) -> anyhow::Result<Self> {
        let noise = Normal::new(0.0f32, 1.0)?;
        let classes = rand_distr::weighted::WeightedIndex::new(weights)?;
        let (mut features, mut labels) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let k = classes.sample(rng);
            let mut row = [0.0f32; WIDTH];
            for (j, v) in row.iter_mut().enumerate() {
                *v = noise.sample(rng) + if j == k { 3.0 } else { 0.0 };
            }
            features.push(row);
            labels.push(k);
        }
        Ok(Self { features, labels })
    }
}

const SETTINGS: &str = r#"
[run]
name = "custom-dataset"
seed = 11
rounds = 4

[training]
learning_rate = 0.05
momentum = 0.5
epochs = 1
batch_size = 16

[federation]
clients_per_round = 6
aggregator = "fedavg"
"#;

/// Held-out accuracy the run must reach (the classes' overlap allows about 96%).
const MIN_ACCURACY: f64 = 0.85;

pub fn main() -> anyhow::Result<()> {
    let settings = Settings::parse(SETTINGS)?;
    let mut rng = ChaCha8Rng::seed_from_u64(settings.run.seed);
    // Six clients with label skew: client c sees mostly class c mod 3.
    let clients = (0..6)
        .map(|c| -> anyhow::Result<Box<dyn Examples>> {
            let mut weights = [0.1; CLASSES];
            weights[c % CLASSES] = 0.8;
            Ok(Box::new(Blobs::draw(120, weights, &mut rng)?))
        })
        .collect::<anyhow::Result<_>>()?;
    let test = Blobs::draw(300, [1.0; CLASSES], &mut rng)?;
    let own = Own {
        network: Architecture::Mlp {
            inputs: WIDTH,
            hidden: vec![32],
            classes: CLASSES,
        },
        clients,
        test: Box::new(test),
    };
    let (federation, trainers) = own.federation(&settings)?;
    let (_, summary) = federation::run(federation, trainers)?;
    let accuracy = summary.final_accuracy;
    println!(
        "custom dataset: held-out accuracy {accuracy:.3} after {} rounds",
        summary.rounds_completed
    );
    anyhow::ensure!(
        accuracy >= MIN_ACCURACY,
        "accuracy {accuracy:.3} is below {MIN_ACCURACY}"
    );
    Ok(())
}
