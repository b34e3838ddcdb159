//! Local training for the runtime: [`LocalTrainer`] and [`Evaluator`] implementations that wire
//! the model code (`crate::models`) to the data (`crate::data`).

pub mod factorized_softmax;
pub mod neural;
pub mod ridge;

use crate::config::{Config, ModelKind};
use crate::data::Dataset;
use crate::models::softmax;
use fedshard_actors::model::{ModelState, NamedTensor};
use fedshard_actors::trainer::{Evaluation, Evaluator, LocalTrainer, TrainOutput, TrainTask};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use rand::Rng;

pub use ridge::{RidgeClient, RidgeEvaluator, synthetic_clients};

/// The initial global model: softmax weights Glorot-uniform (a factorised layer initialised
/// at exactly zero would never move: both factor gradients vanish), zero bias; ridge at zero.
///
/// # Panics
/// For a neural model whose `[model.network]` is missing or cannot be built, which
/// [`Config::validate`] rules out.
pub fn initial_model(config: &Config, seed: u64) -> ModelState {
    match config.model.kind {
        ModelKind::Neural => {
            let net = config
                .model
                .network
                .as_ref()
                .unwrap_or_else(|| unreachable!("validated: a neural model has a network"));
            net.initial_state(seed)
                .unwrap_or_else(|e| unreachable!("validated: the network builds ({e})"))
                .0
        }
        ModelKind::Softmax => {
            let (classes, dim) = (10, 64);
            let mut rng = stream(seed, 0, 0, Purpose::Init);
            // Glorot-uniform bound sqrt(6 / (fan_in + fan_out)).
            let bound = (6.0 / (classes + dim) as f64).sqrt();
            let weight = (0..classes * dim)
                .map(|_| ((2.0 * uniform(&mut rng) - 1.0) * bound) as f32)
                .collect();
            ModelState::new(vec![
                NamedTensor {
                    name: "bias".into(),
                    shape: vec![classes],
                    data: vec![0.0; classes],
                },
                NamedTensor {
                    name: "weight".into(),
                    shape: vec![classes, dim],
                    data: weight,
                },
            ])
            .unwrap_or_else(|e| unreachable!("two distinct tensor names: {e}"))
        }
        ModelKind::Ridge => {
            ModelState::new(vec![NamedTensor::zeros("weight", vec![1, config.data.dim])])
                .unwrap_or_else(|e| unreachable!("one tensor: {e}"))
        }
    }
}

/// The seed a trainer uses for (run seed, round, client).
pub fn local_seed(task: &TrainTask) -> u64 {
    stream(task.seed, task.round, task.client, Purpose::Training).next_u64()
}

/// A client training softmax regression, densely or with its weight as a spectral shard.
pub struct SoftmaxClient {
    pub data: Dataset,
}

impl LocalTrainer for SoftmaxClient {
    fn samples(&self) -> u64 {
        self.data.len() as u64
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, String> {
        let recipe = &task.recipe;
        match task.shards.as_slice() {
            [] => {
                let cfg = softmax::SgdConfig {
                    lr: recipe.learning_rate,
                    epochs: recipe.epochs,
                    batch_size: recipe.batch_size,
                    momentum: recipe.momentum,
                    weight_decay: recipe.weight_decay,
                };
                let report = softmax::train(&task.dense, &self.data, &cfg, local_seed(task))
                    .map_err(|e| e.to_string())?;
                Ok(TrainOutput {
                    dense: report.state,
                    shards: vec![],
                    samples: self.samples(),
                    loss: report.mean_loss,
                })
            }
            [shard] => {
                let mut dense = task.dense.clone();
                let mut shard = shard.clone();
                let bias = dense
                    .get_mut("bias")
                    .ok_or("the softmax model has no `bias` tensor")?;
                let mut model = factorized_softmax::FactorizedSoftmax {
                    bias: &mut bias.data,
                    shard: &mut shard,
                };
                let samples: Vec<usize> = (0..self.data.len()).collect();
                let mut rng = stream(task.seed, task.round, task.client, Purpose::Training);
                let loss =
                    factorized_softmax::train(&mut model, &self.data, &samples, recipe, &mut rng);
                if !loss.is_finite() {
                    return Err(format!("local training diverged (loss {loss})"));
                }
                Ok(TrainOutput {
                    dense,
                    shards: vec![shard],
                    samples: self.samples(),
                    loss,
                })
            }
            _ => Err("the softmax model shards only its `weight`".into()),
        }
    }
}

/// Held-out accuracy and cross-entropy of the global softmax model.
pub struct SoftmaxEvaluator {
    pub test: Dataset,
}

impl Evaluator for SoftmaxEvaluator {
    fn evaluate(&self, model: &ModelState) -> Evaluation {
        match softmax::evaluate(model, &self.test) {
            Ok(e) => Evaluation {
                accuracy: e.accuracy,
                loss: e.mean_loss,
            },
            Err(e) => {
                tracing::error!("evaluation failed: {e}");
                Evaluation {
                    accuracy: f64::NAN,
                    loss: f64::NAN,
                }
            }
        }
    }
}
