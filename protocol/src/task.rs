//! What a client is asked to do and what it returns, and the trait that does the work.
//!
//! The runtime never looks inside local training: a [`LocalTrainer`] (implemented in `fedshard`
//! for each model family) receives a [`TrainTask`] and returns a [`TrainOutput`]. Both are plain
//! serde data, so the same task can cross a process boundary unchanged.

use crate::model::ModelState;
use crate::uplink::Uplink;
use crate::width::WidthSlice;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A client's identity, stable across rounds and restarts.
pub type ClientId = u64;

/// The local recipe for one round (docs/algorithms.md §1.7): the one type for both the `[training]`
/// table of a config (which flattens it, so the defaults below are the config's) and the message
/// a client receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    /// Learning rate. In a config, the base rate; in a task, already annealed by the server's
    /// schedule for that round.
    #[serde(default = "default_learning_rate")]
    pub learning_rate: f64,
    #[serde(default = "default_epochs")]
    pub epochs: usize,
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// Weight decay on dense tensors; Frobenius decay on the effective weight of sharded layers.
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f64,
    /// ClipLR threshold τ: gradients of factor column i are scaled by min(1, τ/ω_i). Only the
    /// +ClipLR strategies clip; a task carries `None` under every other strategy.
    #[serde(default)]
    pub clip_lr: Option<f64>,
    /// FedProx's μ (Li et al., MLSys 2020): local training minimises the loss plus
    /// `(μ/2) ‖w − w⁰‖²`, `w⁰` the values the task sent; 0 (the default) is plain local SGD.
    #[serde(default)]
    pub proximal_mu: f64,
}

impl Default for Recipe {
    fn default() -> Self {
        Self {
            learning_rate: default_learning_rate(),
            epochs: default_epochs(),
            batch_size: default_batch_size(),
            momentum: default_momentum(),
            weight_decay: default_weight_decay(),
            clip_lr: None,
            proximal_mu: 0.0,
        }
    }
}

fn default_learning_rate() -> f64 {
    0.1
}
fn default_epochs() -> usize {
    1
}
fn default_batch_size() -> usize {
    32
}
fn default_momentum() -> f64 {
    0.9
}
fn default_weight_decay() -> f64 {
    1e-4
}

/// The ClipLR threshold τ of the +ClipLR strategies when a config does not set one.
pub const DEFAULT_CLIP_LR: f64 = 10.0;

/// One sharded layer as a client receives and returns it: the columns `I` of the factors
/// `U' = [√λ_i u_i]` and `V' = [√λ_i v_i]` and the frozen multipliers `ω_I`
/// (docs/algorithms.md §1.1 step 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerShard {
    /// The global tensor this shard factorises.
    pub name: String,
    /// Shape of that tensor; it is sharded as the matrix `(shape[0], Π shape[1..])`.
    pub shape: Vec<usize>,
    /// Term indices `I`, ascending, into the layer's spectrum (descending singular values).
    pub indices: Vec<usize>,
    /// `n × rows`, row j = u'_{I_j}.
    pub left: Vec<f32>,
    /// `n × cols`, row j = v'_{I_j}.
    pub right: Vec<f32>,
    /// ω_{I_j}, frozen during local training.
    pub multipliers: Vec<f32>,
}

impl LayerShard {
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    pub fn cols(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
}

/// Everything a client needs for one round of local training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainTask {
    pub round: u64,
    pub client: ClientId,
    /// Seed of the run; the trainer derives its streams from (seed, round, client).
    pub seed: u64,
    /// The tensors trained densely (everything not sharded).
    pub dense: ModelState,
    /// The sharded layers, one shard each.
    pub shards: Vec<LayerShard>,
    /// Under a width strategy, the units of every width this client keeps: `dense` is the
    /// global model cut to them (docs/algorithms.md §8).
    #[serde(default)]
    pub width: Option<WidthSlice>,
    pub recipe: Recipe,
    /// How to send the update back (the identity encoding unless a compressor is configured).
    #[serde(default)]
    pub uplink: Uplink,
    /// Under SCAFFOLD, the control variates that correct every local step (`None`: plain
    /// local steps).
    #[serde(default)]
    pub variates: Option<Variates>,
}

/// SCAFFOLD's control variates for one client's round (Karimireddy et al., ICML 2020,
/// Algorithm 1; docs/algorithms.md §12): every local step follows `g_i(y) − c_i + c` instead of
/// the client's own gradient `g_i(y)`, so that clients on skewed data drift less from the
/// direction of the whole population. Both live in the dense weight space of the task's
/// tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variates {
    /// `c`, the server's, as of the round's model.
    pub server: ModelState,
    /// `c_i`, the client's own, which only its host keeps (the server never learns it): the
    /// host lends it just before the client trains. `None` in what the server sends, and for a
    /// client's first round under SCAFFOLD (a zero variate).
    pub client: Option<ModelState>,
}

/// The result of local training: the same tensors and shard indices as the task, updated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainOutput {
    pub dense: ModelState,
    pub shards: Vec<LayerShard>,
    /// Mean training loss over the round.
    pub loss: f64,
    /// Under SCAFFOLD, the change of the client's control variate, `Δc_i = c_i⁺ − c_i` with
    /// option II's `c_i⁺ = c_i − c + (x − y)/(K η)` (Algorithm 1, line 12): what the client
    /// sends beside its update and adds to its own variate. `None` without variates.
    pub control: Option<ModelState>,
}

/// An error of a trainer's own making that the runtime only reports: a task that does not fit
/// the trainer's model, a backend failure, an uplink encoding that failed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a client's local training failed; the server reports it as a failed client.
#[derive(Debug, Error)]
pub enum TrainError {
    /// The task's tensors do not fit the trainer's model (a tensor missing or of another shape,
    /// a shard the model cannot hold), or the model could not be built or exported.
    #[error("{0}")]
    Model(#[source] BoxError),
    /// The task asks for something this trainer does not do.
    #[error("{trainer} cannot train this task: {what}")]
    Unsupported { trainer: &'static str, what: String },
    #[error("the client has no training samples")]
    NoSamples,
    #[error("recipe.batch_size must be at least 1")]
    ZeroBatchSize,
    /// An SGLD task without the round's cohort (`uplink.langevin`).
    #[error("an SGLD task carries the round's cohort")]
    MissingCohort,
    /// An SGLD task whose scaling (step, population, cohort) is invalid.
    #[error("{0}")]
    Scaling(#[source] fedshard_strategies::StrategyError),
    /// The mean training loss of the round is NaN or infinite.
    #[error("local training diverged (mean loss {mean_loss})")]
    Diverged { mean_loss: f64 },
    /// A fault injector failed the task on purpose.
    #[error("injected error")]
    Injected,
    /// The work [`LocalTrainer::train_then`] runs after training (encoding the uplink) failed.
    #[error("{0}")]
    Finish(#[source] BoxError),
}

/// Why an evaluation of a model failed.
#[derive(Debug, Error)]
pub enum EvalError {
    /// The model's tensors do not fit the evaluator's architecture. Transparent: the cause is
    /// the whole message, and a chain that printed both would say it twice.
    #[error(transparent)]
    Model(BoxError),
    #[error("the test set is empty")]
    EmptyTestSet,
}

/// One task's local work, as a client hands it to [`LocalTrainer::start`]: it reports its own
/// result.
pub type Work = Box<dyn FnOnce() + Send + 'static>;

/// A client's local training. Implementations hold the client's data shard.
pub trait LocalTrainer: Send + Sync + 'static {
    /// Number of local training samples D_c. The server's registry takes D_c from the same
    /// partition of the config, never from what a client reports.
    fn samples(&self) -> u64;
    /// Trains on the task. An `Err` is reported to the server as a failed client; a panic is
    /// caught by the client actor, reported, and the actor is restarted.
    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError>;

    /// Trains, then runs `finish` on the output as part of the same local work: the client
    /// actor encodes its uplink message there. Why: a wrapper that schedules or stretches a
    /// client's computation (the core pool, a straggler's slow-down) must cover the encoding
    /// too, which for KLMS can cost as much as training; it overrides this method. `finish`
    /// may change the output (a fault injector corrupts it before it is encoded); its error
    /// comes back as [`TrainError::Finish`].
    fn train_then(
        &self,
        task: &TrainTask,
        finish: &mut (dyn FnMut(&mut TrainOutput) -> Result<(), BoxError> + Send),
    ) -> Result<TrainOutput, TrainError> {
        let mut output = self.train(task)?;
        finish(&mut output).map_err(TrainError::Finish)?;
        Ok(output)
    }

    /// Starts `work` (this client's local work for one task: [`Self::train_then`] and the
    /// client actor's handling of its result) where it should run, or hands it back for a
    /// thread of its own: the default, since a trainer may block (sleep out a simulated
    /// straggler's delay, wait for its cohort, read a socket). A trainer whose work only
    /// computes starts it on the process's pool of one thread per core
    /// (`fedshard_training::train::slots::OnACore`): it would queue for a core there anyway,
    /// and a blocking thread per client and round only added a hand-off, a quarter of the
    /// runtime's cost per client (docs/performance.md, "Orchestration overhead").
    fn start(&self, work: Work) -> Option<Work> {
        Some(work)
    }

    /// Whether the client leaves after training `task`, before its update is sent: only fault
    /// injection's `dropout` says so (a real client never announces it), so that dropouts are
    /// exercised where they matter, inside a secure round's session.
    fn drops_out(&self, _task: &TrainTask) -> bool {
        false
    }
}

/// Held-out evaluation of the global model on the server.
pub trait Evaluator: Send + Sync + 'static {
    fn evaluate(&self, model: &ModelState) -> Result<Evaluation, EvalError>;
}

/// Test accuracy and mean loss of a model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub accuracy: f64,
    pub loss: f64,
}
