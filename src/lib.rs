//! fedshard: federated learning for heterogeneous clients.
//!
//! This crate holds everything that touches files, tensors or the user: the command line,
//! configuration, datasets and local training. The mathematics lives in
//! [`fedshard_strategies`].

pub mod cli;
pub mod oneshot;
