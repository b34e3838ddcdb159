//! fedshard: federated learning for heterogeneous clients.
//!
//! This crate holds everything that touches files, tensors or the user: the command line,
//! configuration, datasets, models and local training. The mathematics lives in
//! [`fedshard_strategies`], the actor runtime in [`fedshard_actors`].

pub mod cli;
pub mod compare;
pub mod config;
pub mod data;
pub mod federation;
pub mod models;
pub mod oneshot;
pub mod train;
