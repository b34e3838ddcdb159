//! FedPM local training and evaluation (docs/algorithms.md §4.6): the global model is the mask
//! probability θ of every weight of a [`MaskedNetwork`]; the frozen weights `w_init` come from
//! the run seed, never from the wire.
//!
//! A client sets its scores `s = logit(clamp(θ_global, 0.01, 0.99))`, trains them with Adam
//! (learning rate from the recipe, 0.1 in the reference; β = (0.9, 0.999), ε = 1e-8 as PyTorch,
//! no weight decay) for the recipe's epochs and batch size, sampling a fresh mask
//! `m ~ Bern(sigmoid(s))` for every batch, and returns `θ_local = sigmoid(s)` under the task's
//! tensor names. The server's FedAvg of those θ is BayesAgg with λ₀ = 1 reset every round; a
//! compressor between the two replaces θ_local by a coded mask sample.
//!
//! Two deliberate differences from the reference: Adam starts fresh every round (the
//! reference keeps each client's Adam state between the rounds it is picked; here a client is
//! stateless, as every other trainer, so any node can host it), and the layers have no biases
//! (see [`crate::models::masked`]). The momentum and weight decay of the recipe do not apply.

use crate::models::kernels::{Kernels, TrainingBackend};
use crate::models::masked::{MaskDraw, MaskedNet, MaskedNetwork};
use crate::train::batches::{self, LocalSteps};
use crate::train::neural::{Examples, cross_entropy};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::{
    EvalError, Evaluation, Evaluator, LocalTrainer, Recipe, TrainError, TrainOutput, TrainTask,
};
use fedshard_strategies::rng::{Purpose, stream};

/// Adam's ε: PyTorch's default, which the reference uses (burn's default is 1e-5). The score
/// gradients are small (scaled by θ·θ(1−θ) and by the ±c weights), and a larger ε damps them.
const ADAM_EPSILON: f32 = 1e-8;

/// Trains the scores of `net` on `examples` following `recipe` (Adam at
/// `recipe.learning_rate`, `recipe.epochs` × batches of `recipe.batch_size`); returns the
/// trained network and the mean cross-entropy over all steps. The batch order comes from the
/// `(seed, round, client)` stream of [`Purpose::Training`], the masks from that of
/// [`Purpose::FedpmMasks`], so a client's round is reproducible bit for bit.
pub fn train_scores<B: TrainingBackend>(
    net: MaskedNet<B>,
    examples: &dyn Examples,
    recipe: &Recipe,
    seed: u64,
    round: u64,
    client: u64,
    device: &B::Device,
) -> Result<(MaskedNet<B>, f64), TrainError> {
    let steps = LocalSteps::new(examples, recipe, seed, round, client)?;
    if examples.targets_per_row() != 1 {
        return Err(TrainError::Unsupported {
            trainer: "FedPM",
            what: "examples with several targets (it trains classifiers)".into(),
        });
    }
    let mut optimizer = AdamConfig::new()
        .with_epsilon(ADAM_EPSILON)
        .init::<B, MaskedNet<B>>();
    let mut mask_rng = stream(seed, round, client, Purpose::FedpmMasks);
    steps.run(net, device, |net: MaskedNet<B>, inputs, targets| {
        let weights = net.sampled_weights(&mut MaskDraw::Train(&mut mask_rng));
        let loss = cross_entropy(net.forward(inputs, &weights), targets);
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        (optimizer.step(recipe.learning_rate, net, grads), loss)
    })
}

/// A FedPM client: its examples and the network shape, on backend `B`.
pub struct FedpmClient<B: AutodiffBackend> {
    pub network: MaskedNetwork,
    pub examples: Box<dyn Examples>,
    pub device: B::Device,
}

impl<B: TrainingBackend> LocalTrainer for FedpmClient<B> {
    fn samples(&self) -> u64 {
        self.examples.len() as u64
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
        if let Some(shard) = task.shards.first() {
            return Err(TrainError::Unsupported {
                trainer: "FedPM",
                what: format!("a shard of `{}` (FedPM shards nothing)", shard.name),
            });
        }
        if task.variates.is_some() {
            return Err(TrainError::Unsupported {
                trainer: "FedPM",
                what: "SCAFFOLD's control variates (FedPM trains mask scores, not weights)".into(),
            });
        }
        let layers = self.network.layers()?;
        let net = self
            .network
            .load::<B>(&task.dense, task.seed, &self.device)?;
        let (net, loss) = train_scores(
            net,
            self.examples.as_ref(),
            &task.recipe,
            task.seed,
            task.round,
            task.client,
            &self.device,
        )?;
        Ok(TrainOutput {
            dense: net.export_theta(&layers)?,
            shards: Vec::new(),
            loss,
            control: None,
        })
    }
}

/// Held-out accuracy and mean cross-entropy of `w_init ⊙ m` with one mask `m ~ Bern(θ)` of
/// the global θ (the reference's final model), drawn from the `(seed, 0, 0)` stream of
/// [`Purpose::FedpmEvalMask`]: the same uniforms every round, so two evaluations of the same θ
/// agree and the mask changes only where θ moved across its uniform.
pub struct FedpmEvaluator<B: Backend> {
    pub network: MaskedNetwork,
    pub examples: Box<dyn Examples>,
    /// The run seed, which fixes `w_init` and the evaluation mask.
    pub seed: u64,
    pub device: B::Device,
    /// Rows per forward pass.
    pub batch_size: usize,
}

impl<B: Kernels> Evaluator for FedpmEvaluator<B> {
    fn evaluate(&self, model: &ModelState) -> Result<Evaluation, EvalError> {
        let net = self.network.load::<B>(model, self.seed, &self.device)?;
        let mut rng = stream(self.seed, 0, 0, Purpose::FedpmEvalMask);
        let weights = net.sampled_weights(&mut MaskDraw::Eval(&mut rng));
        batches::evaluate::<B>(
            self.examples.as_ref(),
            self.batch_size,
            &self.device,
            |inputs, targets| (net.forward(inputs, &weights), targets),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Dataset;
    use crate::models::masked::MaskedLayer;
    use crate::train::neural::{Cpu, CpuTraining};
    use burn::tensor::{Int, Tensor, TensorData};

    type B = CpuTraining;

    fn one_layer() -> MaskedNetwork {
        MaskedNetwork {
            inputs: 2,
            conv: vec![],
            hidden: vec![],
            classes: 2,
        }
    }

    fn theta_state(network: &MaskedNetwork, theta: f32) -> ModelState {
        let mut state = network.initial_state(0).unwrap();
        for t in &mut state.tensors {
            t.data.iter_mut().for_each(|v| *v = theta);
        }
        state
    }

    /// The gradient of the scores of a 2 → 2 masked layer at θ = 0.5 on one example, with the
    /// mask drawn from the stream of `mask_seed`; also the frozen weights and `w_init ⊙ m`.
    fn score_gradient(
        seed: u64,
        x: [f32; 2],
        label: i64,
        mask_seed: u64,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let network = one_layer();
        let device = Default::default();
        let net: MaskedNet<B> = network
            .load(&theta_state(&network, 0.5), seed, &device)
            .unwrap();
        let mut rng = stream(mask_seed, 0, 0, Purpose::FedpmMasks);
        let weights = net.sampled_weights(&mut MaskDraw::Train(&mut rng));
        let inputs = Tensor::<B, 2>::from_data(TensorData::new(x.to_vec(), [1, 2]), &device);
        let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![label], [1]), &device);
        let loss = cross_entropy(net.forward(inputs, &weights), targets);
        let grads = loss.backward();
        let layer: &MaskedLayer<B> = &net.fcs[0];
        let g = layer
            .scores
            .grad(&grads)
            .unwrap()
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        let w = layer.weight.clone().into_data().into_vec::<f32>().unwrap();
        let effective = weights[0].clone().into_data().into_vec::<f32>().unwrap();
        (g, w, effective)
    }

    #[test]
    fn the_straight_through_gradient_favours_weights_that_help() {
        // One input x = (1, 0): only column 0 matters. The loss falls when the logit of the
        // true class 0 rises, i.e. when weight (0, 0) is kept if it is +c and dropped if it is
        // −c; so s₀₀ must move up (negative gradient) exactly when w₀₀ > 0, whatever the mask,
        // and with the reference's rule |∂L/∂s| = |∂L/∂m| · θ · θ(1 − θ) ≠ 0.
        for seed in 0..8 {
            let (g, w, effective) = score_gradient(seed, [1.0, 0.0], 0, seed + 100);
            // The closed form: logits (ŵ₀₀, ŵ₁₀), p = softmax; ∂L/∂m₀₀ = (p₀ − 1) w₀₀,
            // ∂L/∂m₁₀ = p₁ w₁₀, times θ·θ(1 − θ) = 1/8 at θ = ½.
            let (z0, z1) = (f64::from(effective[0]), f64::from(effective[2]));
            let p0 = 1.0 / (1.0 + (z1 - z0).exp());
            let expected = [
                (p0 - 1.0) * f64::from(w[0]) / 8.0,
                (1.0 - p0) * f64::from(w[2]) / 8.0,
            ];
            for (got, want) in [g[0], g[2]].into_iter().zip(expected) {
                assert!(
                    (f64::from(got) - want).abs() < 1e-6,
                    "seed {seed}: {got} vs {want}"
                );
            }
            assert!(g[0] != 0.0, "seed {seed}: zero gradient");
            assert_eq!(g[0] < 0.0, w[0] > 0.0, "seed {seed}: g {g:?}, w {w:?}");
            // Row 1 feeds the wrong class: it is pushed the other way.
            assert_eq!(g[2] < 0.0, w[2] < 0.0, "seed {seed}: g {g:?}, w {w:?}");
            // Column 1 sees a zero input and gets no gradient.
            assert_eq!((g[1], g[3]), (0.0, 0.0));
        }
    }

    /// Four points, two classes, separable by the sign of the first feature.
    fn toy() -> Dataset {
        Dataset::new(
            vec![1.0, 0.3, 0.8, -0.5, -1.0, 0.4, -0.7, -0.2],
            vec![0, 0, 1, 1],
            2,
            2,
        )
        .unwrap()
    }

    fn task(network: &MaskedNetwork, seed: u64, epochs: usize) -> TrainTask {
        TrainTask {
            round: 1,
            client: 3,
            seed,
            dense: theta_state(network, 0.5),
            width: None,
            shards: vec![],
            recipe: Recipe {
                learning_rate: 0.1,
                epochs,
                batch_size: 2,
                ..Recipe::default()
            },
            uplink: Default::default(),
            variates: None,
        }
    }

    #[test]
    fn training_moves_theta_inside_the_unit_interval_and_is_deterministic() {
        let network = MaskedNetwork {
            inputs: 2,
            conv: vec![],
            hidden: vec![8],
            classes: 2,
        };
        let client = FedpmClient::<B> {
            network: network.clone(),
            examples: Box::new(toy()),
            device: Default::default(),
        };
        let long = task(&network, 5, 400);
        let a = client.train(&long).unwrap();
        let b = client.train(&long).unwrap();
        assert_eq!(a, b, "same task, same result, bit for bit");
        assert!(a.shards.is_empty());
        assert_eq!(a.dense.tensors.len(), 2);
        let mut moved = 0;
        for (t, start) in a.dense.tensors.iter().zip(&long.dense.tensors) {
            assert_eq!((&t.name, &t.shape), (&start.name, &start.shape));
            assert!(t.data.iter().all(|&p| p > 0.0 && p < 1.0), "{}", t.name);
            moved += t.data.iter().filter(|&&p| (p - 0.5).abs() > 0.1).count();
        }
        assert!(moved > 0, "400 epochs at lr 0.1 move some θ");
        // Another client id draws other masks and batches.
        let other = TrainTask {
            client: 4,
            ..long.clone()
        };
        assert_ne!(client.train(&other).unwrap().dense, a.dense);
    }

    #[test]
    fn a_trained_mask_fits_the_toy_and_the_evaluator_is_deterministic() {
        let network = MaskedNetwork {
            inputs: 2,
            conv: vec![],
            hidden: vec![16],
            classes: 2,
        };
        let client = FedpmClient::<B> {
            network: network.clone(),
            examples: Box::new(toy()),
            device: Default::default(),
        };
        let trained = client.train(&task(&network, 9, 200)).unwrap();
        let evaluator = FedpmEvaluator::<Cpu> {
            network,
            examples: Box::new(toy()),
            seed: 9,
            device: Default::default(),
            batch_size: 3,
        };
        let first = evaluator.evaluate(&trained.dense).unwrap();
        assert_eq!(first, evaluator.evaluate(&trained.dense).unwrap());
        assert!(first.accuracy >= 0.75, "{first:?}");
        assert!(first.loss.is_finite());
    }

    #[test]
    fn tasks_the_network_cannot_take_are_refused() {
        let network = one_layer();
        let client = FedpmClient::<B> {
            network: network.clone(),
            examples: Box::new(toy()),
            device: Default::default(),
        };
        let mut bad = task(&network, 1, 1);
        bad.dense.tensors[0].shape = vec![1, 4];
        assert!(
            client
                .train(&bad)
                .unwrap_err()
                .to_string()
                .contains("has shape [1, 4]")
        );
        let mut bad = task(&network, 1, 1);
        bad.dense.tensors[0].name = "fc9.weight".into();
        let e = client.train(&bad).unwrap_err().to_string();
        assert!(e.contains("fc9.weight"), "{e}");
        let mut bad = task(&network, 1, 1);
        bad.dense.tensors[0].data[0] = f32::NAN;
        assert!(
            client
                .train(&bad)
                .unwrap_err()
                .to_string()
                .contains("not a mask probability")
        );
        bad.dense.tensors[0].data[0] = 1.5;
        assert!(
            client
                .train(&bad)
                .unwrap_err()
                .to_string()
                .contains("not a mask probability")
        );
    }
}
