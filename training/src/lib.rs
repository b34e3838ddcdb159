//! **fedshard-training**: what a client needs to train: burn models with factorised layers,
//! datasets and partitions, the local trainers and evaluators.
//! May depend on: `fedshard-strategies`, `fedshard-protocol`; burn (no actors, no async runtime).
//!
//! Local training for fedshard: everything a client node needs to train its share of the model,
//! and nothing of the runtime that schedules it.
//!
//! [`models`] holds burn networks with factorized (spectrally sharded) layers, [`data`] the
//! datasets and their partitions, and [`train`] the [`fedshard_protocol::task::LocalTrainer`]
//! and evaluator implementations that wire the two together.

pub mod data;
pub mod models;
pub mod oneshot;
pub mod train;
