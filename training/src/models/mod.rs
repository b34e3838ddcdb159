//! Models: the neural models (burn modules with factorized layers) built from and exported to
//! named tensors; softmax regression is the [`mlp::Mlp`] without hidden layers.
//!
//! Nothing here reads files or knows how data was partitioned: a model sees a
//! [`crate::data::Dataset`] and a seed, and exchanges its parameters as a [`ModelState`].

pub mod accepts;
pub mod blocks;
pub mod builder;
pub mod cct;
pub mod char_transformer;
pub mod cnn;
pub mod error;
pub mod kernels;
pub mod layers;
pub mod masked;
pub mod mlp;
pub mod net;
pub mod network;
pub mod onnx;
pub mod resnet;
pub mod shardable;
pub mod tensors;
pub mod widths;

pub use error::NetError;
pub use tensors::{ModelState, NamedTensor};
