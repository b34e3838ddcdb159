//! Why a network could not be built, loaded from a task or exported back.

use crate::models::layers::FactorError;
use fedshard_protocol::task::{EvalError, TrainError};
use thiserror::Error;

/// A model that does not fit its description or its task: each variant names the tensor or
/// layer and what was expected of it.
#[derive(Debug, Error)]
pub enum NetError {
    /// The tensors do not make a valid [`ModelState`](fedshard_protocol::model::ModelState).
    #[error(transparent)]
    State(#[from] fedshard_protocol::model::ModelError),
    #[error("the task has no tensor `{name}`")]
    MissingTensor { name: String },
    #[error("the task carries tensors this model does not have: {}", names.join(", "))]
    UnknownTensors { names: Vec<String> },
    #[error("tensor `{name}` has shape {found:?}, the model expects {expected:?}")]
    TensorShape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor `{name}` holds {value}, not a mask probability in [0, 1]")]
    NotAProbability { name: String, value: f32 },
    #[error("`{name}` is a first or last layer and is never sharded")]
    NeverSharded { name: String },
    #[error("shard `{name}` has shape {found:?}, the model expects {expected:?}")]
    ShardShape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("shard `{name}`: {source}")]
    Factors { name: String, source: FactorError },
    #[error("`{name}`: {channels} channels do not split into {groups} groups")]
    Groups {
        name: String,
        channels: usize,
        groups: usize,
    },
    #[error("`{name}`: width {width} does not split into {heads} heads")]
    Heads {
        name: String,
        width: usize,
        heads: usize,
    },
    /// A masked network's description (`inputs`, `conv`, `hidden`, `classes`) is not one a
    /// network can have.
    #[error("masked network: {0}")]
    MaskedShape(String),
    #[error("the masked network has {trained} layers, the description {described}")]
    LayerCount { trained: usize, described: usize },
    /// A trained parameter could not be read back from the backend.
    #[error("reading {what}: {cause}")]
    Read { what: String, cause: String },
    /// The tasks of a cohort do not share one sub-model shape (a shard in one task and not in
    /// another, or shards of different term counts): they cannot train as one computation.
    #[error("the cohort's tasks differ at `{name}`: {what}")]
    Cohort { name: String, what: String },
    #[error("the trained model lost {0}")]
    Lost(String),
    /// A model this backend cannot train as it is (the reason says what and where it can).
    #[error("{0}")]
    Unsupported(String),
}

impl From<NetError> for TrainError {
    fn from(e: NetError) -> Self {
        TrainError::Model(Box::new(e))
    }
}

impl From<NetError> for EvalError {
    fn from(e: NetError) -> Self {
        EvalError::Model(Box::new(e))
    }
}
