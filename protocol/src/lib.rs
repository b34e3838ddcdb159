//! **fedshard-protocol**: the data that crosses a wire (models, tasks, shard plans, payloads)
//! and the pure functions that build and check it.
//! May depend on: `fedshard-strategies`, `fedshard-bits`; serde, bincode, thiserror, crc32fast (no
//! actors, no async, no burn).
//!
//! The data that crosses a wire between fedshard nodes, and the pure functions that produce and
//! check it: model states ([`model`]), what a client is asked to do and returns ([`task`]), the
//! shards a round hands out ([`shard_plan`]), and encoded updates ([`payload`]); what goes wrong
//! is an [`Error`]. Files written to be read back (a checkpoint, a model) carry a checked header
//! ([`stored`]).
//!
//! No actors, no async, no tensors library: a client process links this crate and
//! `fedshard-training` without the server's runtime.

pub mod bounded;
pub mod error;
pub mod model;
pub mod payload;
pub mod shard_plan;
pub mod stored;
pub mod task;
pub mod uplink;
pub mod width;
pub mod work;

pub use error::Error;
