//! Local training of the neural models with burn (docs/algorithms.md §1.7, docs/design.md, "One round"
//! steps 4–5): a client builds its sub-model from the task, trains it for E epochs with SGD
//! (momentum, fresh state every round), Frobenius decay on every effective weight and ClipLR on
//! the factors of its shards, and exports the trained tensors.

use crate::models::kernels::{self, Cohort, Kernels, TrainingBackend};
use crate::models::layers::Weight;
use crate::models::net::Architecture;
use crate::models::network::{Forward, Network};
use crate::train::batches;
use crate::train::cohort::{self, Member, Trained};
use crate::train::sgld;
use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::{Participant, ShardingPolicy, dense_part, plan_shards};
use fedshard_protocol::task::{
    BoxError, EvalError, Evaluation, Evaluator, LayerShard, LocalTrainer, TrainError, TrainOutput,
    TrainTask,
};
use std::collections::HashSet;

/// Training examples as the models see them: rows of `width` floats and, per row,
/// `targets_per_row` class targets.
pub trait Examples: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn width(&self) -> usize;
    /// 1 for classifiers; the context length for next-character prediction at every position.
    fn targets_per_row(&self) -> usize;
    /// Appends the rows and targets of `samples` to `x` and `y`.
    fn fill(&self, samples: &[usize], x: &mut Vec<f32>, y: &mut Vec<i64>);
}

impl Examples for crate::data::Dataset {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn width(&self) -> usize {
        self.dim
    }
    fn targets_per_row(&self) -> usize {
        1
    }
    fn fill(&self, samples: &[usize], x: &mut Vec<f32>, y: &mut Vec<i64>) {
        for &i in samples {
            x.extend_from_slice(&self.features[i * self.dim..(i + 1) * self.dim]);
            y.push(i64::from(self.labels[i]));
        }
    }
}

/// Some samples of another example set, in the order given: a minibatch, a benchmark's slice,
/// a client drawn from a pool. `E` is how the set is held (a reference, an `Arc`).
pub struct Rows<E> {
    pub examples: E,
    pub rows: Vec<usize>,
}

impl<E, T> Examples for Rows<E>
where
    E: std::ops::Deref<Target = T> + Send + Sync,
    T: Examples + ?Sized,
{
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn width(&self) -> usize {
        self.examples.width()
    }
    fn targets_per_row(&self) -> usize {
        self.examples.targets_per_row()
    }
    fn fill(&self, samples: &[usize], x: &mut Vec<f32>, y: &mut Vec<i64>) {
        let rows: Vec<usize> = samples.iter().map(|&k| self.rows[k]).collect();
        self.examples.fill(&rows, x, y);
    }
}

/// Next-character prediction windows over an encoded text: sample k starts at `starts[k]` and
/// is `text[s..s+context]` with targets `text[s+1..s+context+1]` (every position predicts the
/// character after it). Explicit starts let a test set sample windows of many clients' texts,
/// concatenated, without a window crossing from one text into the next.
#[derive(Debug, Clone, PartialEq)]
pub struct CharWindows {
    pub text: Vec<u8>,
    pub starts: Vec<usize>,
    pub context: usize,
}

impl CharWindows {
    /// Every window of one text.
    pub fn all(text: Vec<u8>, context: usize) -> Self {
        let starts = (0..text.len().saturating_sub(context)).collect();
        Self {
            text,
            starts,
            context,
        }
    }
}

impl Examples for CharWindows {
    fn len(&self) -> usize {
        self.starts.len()
    }
    fn width(&self) -> usize {
        self.context
    }
    fn targets_per_row(&self) -> usize {
        self.context
    }
    fn fill(&self, samples: &[usize], x: &mut Vec<f32>, y: &mut Vec<i64>) {
        for &k in samples {
            let i = self.starts[k];
            let window = &self.text[i..=i + self.context];
            x.extend(window[..self.context].iter().map(|&c| f32::from(c)));
            y.extend(window[1..].iter().map(|&c| i64::from(c)));
        }
    }
}

/// Mean cross-entropy of `logits` (`rows × classes`) against `targets` (`rows`).
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let rows = targets.dims()[0];
    log_softmax(logits, 1)
        .gather(1, targets.reshape([rows, 1]))
        .mean()
        .neg()
}

/// The gradient of the Frobenius decay `(μ/2) Σ ‖Ŵ‖²_F` over every affine and convolutional
/// weight of the model, in closed form (docs/algorithms.md §1.7): `μ W` for a dense weight;
/// for a shard Ŵ = Uᵀ Ω V (U `n × c_out`, V `n × c_in`), `μ Ω (V Vᵀ) Ω U` for U and
/// `μ Ω (U Uᵀ) Ω V` for V, for each client of the model's cohort. The shards' terms are added
/// to `grads` here; the dense weights' `μ W` is returned for the optimizer's step, which adds
/// it in the same pass as the momentum ([`Kernels::sgd_step`]: on the CPU a separate pass was
/// 3–4% of a ResNet-18 or CCT step), or [`DenseDecay::add_to`] adds it to `grads`.
///
/// Why not through autodiff: recorded as a loss term, the decay of a shard with many terms cost
/// more than the layer's own forward and backward at the federated batch sizes (two Gram
/// products forward and four more backward, each a graph node); here it is two Gram products
/// and two `n × n` by `n × c` products, and a dense weight's is part of the step.
#[must_use = "the dense weights' decay is the optimizer's to add"]
pub fn add_frobenius_decay<B: TrainingBackend>(
    net: &impl Forward<B>,
    grads: &mut GradientsParams,
    mu: f64,
) -> DenseDecay {
    let mut dense = DenseDecay {
        mu,
        weights: HashSet::new(),
    };
    if mu == 0.0 {
        return dense;
    }
    for weight in net.weights() {
        match weight {
            Weight::Dense(w) => {
                dense.weights.insert(w.id);
            }
            Weight::Factorized(f) => {
                let [clients, n] = f.omega.dims();
                // Each client's Gram products are its own: one row of dimension 0 per client.
                let each = Cohort::stacked(clients);
                let (u, v) = (f.u.val().inner(), f.v.val().inner());
                let omega = f.omega.clone().inner().reshape([clients, n, 1]);
                let scaled_u = kernels::scale_rows(u.clone(), omega.clone());
                let scaled_v = kernels::scale_rows(v.clone(), omega.clone());
                let gram_u = kernels::cohort_affine(u.clone(), u, None, &each);
                let gram_v = kernels::cohort_affine(v.clone(), v, None, &each);
                let rows = omega.mul_scalar(mu);
                // linear(G, Xᵀ) = G · X, with the transposed factor read in place.
                let d_u = kernels::cohort_affine(gram_v, scaled_u.swap_dims(1, 2), None, &each);
                let d_v = kernels::cohort_affine(gram_u, scaled_v.swap_dims(1, 2), None, &each);
                for (id, d) in [(f.u.id, d_u), (f.v.id, d_v)] {
                    let decay = kernels::scale_rows(d, rows.clone());
                    replace_grad(grads, id, |g| match g {
                        Some(g) => g + decay,
                        None => decay,
                    });
                }
            }
        }
    }
    dense
}

/// The Frobenius decay `μ W` of a model's dense weights ([`add_frobenius_decay`]), which its
/// optimizer adds to their gradients.
#[derive(Debug)]
pub struct DenseDecay {
    mu: f64,
    weights: HashSet<ParamId>,
}

impl DenseDecay {
    /// `μ` for parameter `id` if it is a dense weight, else 0.
    pub fn of(&self, id: &ParamId) -> f64 {
        if self.weights.contains(id) {
            self.mu
        } else {
            0.0
        }
    }

    /// Adds `μ W` to the gradient of each dense weight of `net`, for an optimizer that does
    /// not take the decay in its step (FjORD's, on the server's tensors).
    pub fn add_to<B: TrainingBackend>(&self, net: &impl Forward<B>, grads: &mut GradientsParams) {
        for weight in net.weights() {
            if let Weight::Dense(w) = weight {
                let mu = self.of(&w.id);
                if mu != 0.0 {
                    // g + μ w in one pass (in g's buffer on the CPU).
                    replace_grad(grads, w.id, |g| match g {
                        Some(g) => kernels::add_scaled(g, w.val().inner(), mu),
                        None => w.val().inner().mul_scalar(mu),
                    });
                }
            }
        }
    }
}

/// The gradient of `id` (if it has one) replaced by `total` of it.
fn replace_grad<B: burn::tensor::backend::Backend>(
    grads: &mut GradientsParams,
    id: burn::module::ParamId,
    total: impl FnOnce(Option<Tensor<B, 3>>) -> Tensor<B, 3>,
) {
    let total = total(grads.remove::<B, 3>(id));
    grads.register(id, total);
}

/// Scales the gradient of term i of every shard's U and V by `min(1, τ/ω_i)`.
pub fn clip_lr<B: TrainingBackend>(net: &impl Forward<B>, grads: &mut GradientsParams, tau: f64) {
    for weight in net.weights() {
        if let Weight::Factorized(f) = weight {
            let scale = f.clip_scale(tau).inner();
            for id in [f.u.id, f.v.id] {
                if let Some(g) = grads.remove::<B::InnerBackend, 3>(id) {
                    grads.register(id, kernels::scale_rows(g, scale.clone()));
                }
            }
        }
    }
}

/// What the runtime would send one client in round 1 at `keep_ratio`: the dense tensors and
/// the Unbiased/CPS shards of the `shardable` layers (everything dense at `keep_ratio = 1`).
/// For benchmarks and tests that train a sub-model outside a federation; the error is the
/// sharding plan's.
pub fn single_client_task(
    state: &ModelState,
    shardable: &[String],
    keep_ratio: f64,
    seed: u64,
) -> Result<(ModelState, Vec<LayerShard>), BoxError> {
    let (dense, mut shards) = round_tasks(state, shardable, keep_ratio, 1, seed)?;
    Ok((dense, shards.remove(0)))
}

/// What the runtime would send clients `0..clients` in round 1, all at `keep_ratio`: the dense
/// tensors, the same for all, and each client's own Unbiased/CPS shards (one sub-model shape,
/// different singular terms), from one sharding plan, so each layer is factorised once. Each
/// client samples its terms from its own stream: client 0's task is [`single_client_task`]'s.
pub fn round_tasks(
    state: &ModelState,
    shardable: &[String],
    keep_ratio: f64,
    clients: usize,
    seed: u64,
) -> Result<(ModelState, Vec<Vec<LayerShard>>), BoxError> {
    if keep_ratio >= 1.0 {
        return Ok((state.clone(), vec![vec![]; clients]));
    }
    let policy = ShardingPolicy {
        strategy: "unbiased".parse()?,
        sampler: Default::default(),
        layers: shardable.to_vec(),
    };
    let participants: Vec<Participant> = (0..clients as u64)
        .map(|client| Participant { client, keep_ratio })
        .collect();
    let mut plan = plan_shards(state, &policy, &participants, seed, 1)?;
    let shards = participants
        .iter()
        .map(|p| plan.shards.remove(&p.client).unwrap_or_default())
        .collect();
    Ok((dense_part(state, Some(&policy)), shards))
}

/// What a [`NeuralClient`]'s local work is, chosen with the run's uplink when the client is
/// built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalMethod {
    /// Local training: `recipe.epochs` of SGD with momentum, Frobenius decay and ClipLR
    /// ([`cohort::train`]).
    Sgd,
    /// Federated SGLD's client step (docs/algorithms.md §4.9): one step on the client's share
    /// of the potential ([`sgld::potential_step`]), not local training. The round's scaling
    /// (step, population, cohort) comes with each task's uplink.
    Sgld,
}

/// A client training a neural network on its own examples with backend `B`: a shipped
/// [`Architecture`] or a program's own [`Network`].
pub struct NeuralClient<B: AutodiffBackend, N = Architecture> {
    pub architecture: N,
    pub examples: Box<dyn Examples>,
    pub device: B::Device,
    pub method: LocalMethod,
}

impl<B: TrainingBackend, N> NeuralClient<B, N> {
    /// Which tasks this client can train in one computation with others: those of clients of
    /// the same architecture and device (the caller's concern: one run's clients share them)
    /// whose keys are equal. `None` for a client that trains alone (federated SGLD's one
    /// step; FjORD's ordered dropout, whose every batch has its own width).
    pub fn cohort_key(&self, task: &TrainTask) -> Option<CohortKey> {
        let alone =
            self.method != LocalMethod::Sgd || self.member(task).ordered_dropout().is_some();
        (!alone).then(|| CohortKey::of(task))
    }

    /// This client's member of a cohort for `task`.
    pub fn member<'a>(&'a self, task: &'a TrainTask) -> Member<'a> {
        Member {
            dense: &task.dense,
            shards: &task.shards,
            width: task.width.as_ref(),
            examples: self.examples.as_ref(),
            seed: task.seed,
            round: task.round,
            client: task.client,
            variates: task.variates.as_ref(),
        }
    }
}

/// What the tasks of one cohort share: the recipe and the sub-model shape (which layers are
/// sharded, and with how many terms; under a width strategy, the kept units of every width
/// and the keep ratio, which the scaler divides by).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CohortKey {
    /// The recipe's numbers, floats by their bits.
    recipe: [u64; 7],
    shards: Vec<(String, usize)>,
    /// Kept units of each width by name, and the keep ratio's bits; `None` at full width.
    width: Option<(Vec<(String, usize)>, u64)>,
}

impl CohortKey {
    pub(crate) fn of(task: &TrainTask) -> Self {
        let r = &task.recipe;
        Self {
            recipe: [
                r.learning_rate.to_bits(),
                r.epochs as u64,
                r.batch_size as u64,
                r.momentum.to_bits(),
                r.weight_decay.to_bits(),
                r.clip_lr.map_or(u64::MAX, f64::to_bits),
                r.proximal_mu.to_bits(),
            ],
            shards: task
                .shards
                .iter()
                .map(|s| (s.name.clone(), s.multipliers.len()))
                .collect(),
            width: task
                .width
                .as_ref()
                .map(|w| (w.widths().into_iter().collect(), w.keep_ratio.to_bits())),
        }
    }
}

impl From<Trained> for TrainOutput {
    fn from(t: Trained) -> Self {
        TrainOutput {
            dense: t.dense,
            shards: t.shards,
            loss: t.loss,
            control: t.control,
        }
    }
}

impl<B: TrainingBackend, N: Network> LocalTrainer for NeuralClient<B, N>
where
    N::Module<B>: AutodiffModule<B>,
{
    fn samples(&self) -> u64 {
        self.examples.len() as u64
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
        let trained = match self.method {
            LocalMethod::Sgd => cohort::train::<B, N>(
                &self.architecture,
                &task.recipe,
                &[self.member(task)],
                &self.device,
            )
            .pop()
            .expect("one result per member")?,
            LocalMethod::Sgld if task.variates.is_some() => {
                return Err(TrainError::Unsupported {
                    trainer: "SGLD",
                    what: "SCAFFOLD's control variates (its one step is the potential's own \
                           gradient)"
                        .into(),
                });
            }
            LocalMethod::Sgld => sgld::potential_step::<B, N>(
                &self.architecture,
                self.examples.as_ref(),
                task,
                &self.device,
            )?,
        };
        Ok(trained.into())
    }
}

/// Held-out accuracy and mean cross-entropy of the global model, on the inference backend.
///
/// For the character model only the last position of each window is scored, which is the
/// LEAF definition of a sample (80 characters → the next one).
pub struct NeuralEvaluator<B: Backend, N = Architecture> {
    pub architecture: N,
    pub examples: Box<dyn Examples>,
    pub device: B::Device,
    /// Rows per forward pass.
    pub batch_size: usize,
}

impl<B: Kernels, N: Network> Evaluator for NeuralEvaluator<B, N> {
    fn evaluate(&self, model: &ModelState) -> Result<Evaluation, EvalError> {
        let (net, _) = self
            .architecture
            .load_cohort::<B>(&[(model, &[], None)], &self.device)?;
        let per_row = self.examples.targets_per_row();
        batches::evaluate::<B>(
            self.examples.as_ref(),
            self.batch_size,
            &self.device,
            |inputs, targets| {
                let rows = inputs.dims()[0];
                let logits = net.forward(inputs, &Cohort::single(rows));
                if per_row == 1 {
                    return (logits, targets);
                }
                let classes = logits.dims()[1];
                (
                    logits
                        .reshape([rows, per_row, classes])
                        .slice([0..rows, per_row - 1..per_row])
                        .reshape([rows, classes]),
                    targets
                        .reshape([rows, per_row])
                        .slice([0..rows, per_row - 1..per_row])
                        .reshape([rows]),
                )
            },
        )
    }
}

/// The CPU backends: burn's ndarray, with autodiff for training.
pub type Cpu = burn::backend::NdArray<f32>;
pub type CpuTraining = burn::backend::Autodiff<Cpu>;
