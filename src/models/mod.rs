//! Models: multinomial logistic regression on plain numbers, and the neural models (burn
//! modules with factorized layers) built from and exported to named tensors.
//!
//! Nothing here reads files or knows how data was partitioned: a model sees a
//! [`crate::data::Dataset`] and a seed, and exchanges its parameters as a [`ModelState`].

pub mod blocks;
pub mod builder;
pub mod cct;
pub mod char_transformer;
pub mod cnn;
pub mod kernels;
pub mod layers;
pub mod mlp;
pub mod net;
pub mod resnet;
pub mod softmax;
pub mod tensors;

pub use tensors::{ModelState, NamedTensor};

use thiserror::Error;

/// Why a model state, an update or a training call was rejected.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    /// A tensor's data length does not match the product of its shape.
    #[error("tensor {name:?} has shape {shape:?} ({expected} values) but holds {actual} values")]
    DataLength {
        name: String,
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    /// Two states do not have the same tensors, or a tensor has the wrong shape.
    #[error("tensor {name:?}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// Two states hold different numbers of tensors.
    #[error("expected {expected} tensors, found {found}")]
    TensorCount { expected: usize, found: usize },
    /// The data does not fit the model (feature dimension, classes).
    #[error("data does not fit the model: {0}")]
    DataMismatch(String),
    /// A training hyper-parameter is outside its domain.
    #[error("invalid {name} = {value}: {expected}")]
    InvalidConfig {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// Parameters or a loss became NaN or infinite.
    #[error("non-finite values: {0}")]
    NonFinite(String),
    /// A model state is malformed (missing tensor, wrong length, non-finite value).
    #[error(transparent)]
    State(#[from] fedshard_actors::model::ModelError),
}

/// Result of the model layer.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
