//! **fedshard-strategies**: the mathematics of fedshard (sharding probabilities, samplers,
//! selectors, aggregators, compressors), pure and synchronous.
//! May depend on: no workspace crate; faer, rand, rand_chacha, serde, thiserror (no async, no burn).
//!
//! The mathematics of fedshard, pure and synchronous.
//!
//! Everything here is computed from numbers alone: singular spectra become inclusion
//! probabilities and multipliers (spectral sharding, `sharding`), inclusion probabilities become
//! index sets (`sampling`), client statistics become selection probabilities and aggregation
//! weights. The formulas follow `docs/algorithms.md`; each function's doc comment cites the section
//! and equation it implements.
//!
//! Not here: tensors, files, actors, async code or anything a user types. Those live in
//! `fedshard-actors` and `fedshard`.

pub mod aggregation;
pub mod compression;
pub mod error;
pub mod fesc;
pub mod metrics;
pub mod privacy;
pub mod registry;
pub mod rng;
pub mod sampling;
pub mod selection;
pub mod server_optimizer;
pub mod sharding;
pub mod spectrum;
pub mod svd;

pub use error::{Result, StrategyError};
