//! The client side of federated SGLD (docs/algorithms.md §4.9): one minibatch gradient of the
//! client's share of the potential,
//! `H_c = (|D_c|/B) Σ_{j ∈ batch} ∇(−ln p(y_j | x_j, θ)) + ∇(−ln p(θ)) / N`,
//! with the Gaussian prior of weight decay `λ` (`−ln p(θ) = (λ/2) Σ ‖W‖²` over the affine and
//! convolutional weights, as [`add_frobenius_decay`]; biases have a flat prior) shared equally by
//! the `N` clients, so that `κ Σ_{c ∈ C}` of the shares is the whole prior.
//!
//! No second training loop: this is one step of the ordinary trainer ([`cohort::train`]) on the
//! minibatch, without momentum, at learning rate `|D_c|` and weight decay `λ/(N |D_c|)`:
//! `θ − |D_c| (∇ mean CE + λ W/(N |D_c|)) = θ − H_c`. The output `θ − H_c` goes to the uplink,
//! which reads `H_c = sent − out` and sends `y_c ~ N(H_c, σ² I)`; the server's step size `η`
//! lives there, not here. The minibatch is the first batch of `B = recipe.batch_size` examples
//! the ordinary trainer would draw in that round (the `(seed, round, client)` stream of
//! [`Purpose::Training`]); the recipe's learning rate, epochs and momentum do not apply.
//!
//! [`add_frobenius_decay`]: crate::train::neural::add_frobenius_decay
//! [`cohort::train`]: crate::train::cohort::train

use crate::models::kernels::TrainingBackend;
use crate::models::network::Network;
use crate::train::cohort::{self, Member, Trained};
use crate::train::neural::{Examples, Rows};
use burn::module::AutodiffModule;
use fedshard_protocol::task::{Recipe, TrainError, TrainTask};
use fedshard_strategies::rng::{Purpose, stream};

/// The recipe of the single step: learning rate `|D_c|`, weight decay `λ/(N |D_c|)`, one
/// epoch over the minibatch in one batch, no momentum, no ClipLR, no proximal term (the step is
/// a gradient of the potential, not local training).
pub fn potential_step_recipe(recipe: &Recipe, examples: usize, population: usize) -> Recipe {
    let size = examples as f64;
    Recipe {
        learning_rate: size,
        epochs: 1,
        batch_size: recipe.batch_size.min(examples).max(1),
        momentum: 0.0,
        weight_decay: recipe.weight_decay / (population as f64 * size),
        clip_lr: None,
        proximal_mu: 0.0,
    }
}

/// `θ − H_c` for the client that holds `examples`, from the model the task sends; returns the
/// client's tensors after the step and the minibatch's mean cross-entropy.
pub fn potential_step<B: TrainingBackend, N: Network>(
    network: &N,
    examples: &dyn Examples,
    task: &TrainTask,
    device: &B::Device,
) -> Result<Trained, TrainError>
where
    N::Module<B>: AutodiffModule<B>,
{
    let scaling = task.uplink.langevin.ok_or(TrainError::MissingCohort)?;
    scaling.check().map_err(TrainError::Scaling)?;
    if examples.is_empty() {
        return Err(TrainError::NoSamples);
    }
    if task.recipe.batch_size == 0 {
        return Err(TrainError::ZeroBatchSize);
    }
    let recipe = potential_step_recipe(&task.recipe, examples.len(), scaling.population);
    let mut order: Vec<usize> = (0..examples.len()).collect();
    crate::data::shuffle(
        &mut order,
        &mut stream(task.seed, task.round, task.client, Purpose::Training),
    );
    order.truncate(recipe.batch_size);
    let batch = Rows {
        examples,
        rows: order,
    };
    let member = Member {
        dense: &task.dense,
        shards: &task.shards,
        width: task.width.as_ref(),
        examples: &batch,
        seed: task.seed,
        round: task.round,
        client: task.client,
        variates: None,
    };
    cohort::train::<B, N>(network, &recipe, &[member], device)
        .pop()
        .expect("one result per member")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::net::Architecture;
    use crate::train::neural::{CpuTraining, LocalMethod, NeuralClient};
    use fedshard_protocol::model::{ModelState, NamedTensor};
    use fedshard_protocol::task::LocalTrainer;
    use fedshard_protocol::uplink::{Compressor, Uplink};
    use fedshard_strategies::compression::LangevinScaling;

    /// Two examples in 2 dimensions, classes 0 and 1.
    struct Two;

    impl Examples for Two {
        fn len(&self) -> usize {
            2
        }
        fn width(&self) -> usize {
            2
        }
        fn targets_per_row(&self) -> usize {
            1
        }
        fn fill(&self, samples: &[usize], x: &mut Vec<f32>, y: &mut Vec<i64>) {
            for &i in samples {
                x.extend_from_slice(if i == 0 { &[1.0, 0.0] } else { &[0.0, 2.0] });
                y.push(i as i64);
            }
        }
    }

    #[test]
    fn a_minibatch_step_scales_the_mean_loss_to_the_clients_data() {
        // |D_c| = 180, B = 64, λ = 5, N = 10: the step (lr 180) on mean CE + (λ'/2)‖W‖² with
        // λ' = 5/1800 is (180/64) Σ_batch ∇CE_j + (5/10) W.
        let recipe = Recipe {
            batch_size: 64,
            weight_decay: 5.0,
            ..Recipe::default()
        };
        let step = potential_step_recipe(&recipe, 180, 10);
        assert_eq!(step.learning_rate, 180.0);
        assert!((step.weight_decay - 5.0 / 1800.0).abs() < 1e-15);
        assert_eq!((step.epochs, step.batch_size, step.momentum), (1, 64, 0.0));
        // A client with fewer examples than B uses them all.
        assert_eq!(potential_step_recipe(&recipe, 30, 10).batch_size, 30);
    }

    #[test]
    fn the_step_is_the_scaled_gradient_of_the_potential_share() {
        // Softmax regression 2 → 2 with W = [[0.5, −0.5], [0.25, 1]] and zero biases, both
        // examples in the batch (B = |D_c| = 2), λ = 3, N = 4. With p_i = softmax(W x_i):
        // H = Σ_i (p_i − e_{y_i}) x_iᵀ + (λ/N) W for W, Σ_i (p_i − e_{y_i}) for the bias.
        let w = [0.5f32, -0.5, 0.25, 1.0];
        let dense = ModelState::new(vec![
            NamedTensor::new("fc0.weight", vec![2, 2], w.to_vec()).unwrap(),
            NamedTensor::new("fc0.bias", vec![2], vec![0.0, 0.0]).unwrap(),
        ])
        .unwrap();
        let mut task = TrainTask {
            round: 1,
            client: 0,
            seed: 7,
            dense,
            width: None,
            shards: Vec::new(),
            recipe: Recipe {
                learning_rate: 123.0,
                epochs: 9,
                batch_size: 2,
                momentum: 0.9,
                weight_decay: 3.0,
                clip_lr: None,
                proximal_mu: 0.0,
            },
            uplink: Uplink {
                compressor: Compressor::Sgld,
                langevin: Some(LangevinScaling::new(1e-3, 4, 2).unwrap()),
                ..Uplink::default()
            },
            variates: None,
        };
        let client = NeuralClient::<CpuTraining> {
            architecture: Architecture::Mlp {
                inputs: 2,
                hidden: Vec::new(),
                classes: 2,
            },
            examples: Box::new(Two),
            device: Default::default(),
            method: LocalMethod::Sgld,
        };
        let out = client.train(&task).unwrap();

        // The expected gradient, by hand in f64. W is stored outputs × inputs: logit k of x is
        // Σ_i W[k][i] x_i.
        let w64: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        let mut grad_w = [0.0f64; 4];
        let mut grad_b = [0.0f64; 2];
        for (x, y) in [([1.0, 0.0], 0usize), ([0.0, 2.0], 1)] {
            let logits: Vec<f64> = (0..2)
                .map(|k| w64[2 * k] * x[0] + w64[2 * k + 1] * x[1])
                .collect();
            let norm: f64 = logits.iter().map(|l| l.exp()).sum();
            for k in 0..2 {
                let residual = logits[k].exp() / norm - f64::from(u8::from(k == y));
                grad_b[k] += residual;
                for i in 0..2 {
                    grad_w[2 * k + i] += residual * x[i];
                }
            }
        }
        let h_w: Vec<f64> = (0..4).map(|j| grad_w[j] + 3.0 / 4.0 * w64[j]).collect();
        let trained = |name: &str| &out.dense.get(name).expect("trained tensor").data;
        for j in 0..4 {
            let got = f64::from(w[j]) - f64::from(trained("fc0.weight")[j]);
            assert!((got - h_w[j]).abs() < 1e-5, "W[{j}]: {got} vs {}", h_w[j]);
        }
        for (k, (b, want)) in trained("fc0.bias").iter().zip(grad_b).enumerate() {
            let got = -f64::from(*b);
            assert!((got - want).abs() < 1e-5, "b[{k}]: {got} vs {want}");
        }

        // Without its cohort the task cannot be run.
        task.uplink.langevin = None;
        assert!(matches!(
            client.train(&task),
            Err(TrainError::MissingCohort)
        ));
    }
}
