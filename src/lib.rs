//! **fedshard**: the command line and everything that touches files or the user: configs,
//! building a federation, `compare`, reports and plots.
//! May depend on: every workspace crate (`strategies`, `protocol`, `training`, `actors`, `cluster`).
//!
//! fedshard: federated learning for heterogeneous clients.
//!
//! This crate holds everything that touches files, tensors or the user: the command line,
//! configuration, building a federation from it, comparisons and the CLI. The mathematics lives in
//! [`fedshard_strategies`], the wire types in [`fedshard_protocol`], models, datasets and local
//! training in [`fedshard_training`], and the actor runtime in [`fedshard_actors`].

pub mod cli;
pub mod compare;
pub mod compare_journal;
pub mod compare_uplink;
pub mod config;
pub mod federation;
pub mod report;
pub mod runtime;
