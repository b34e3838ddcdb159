//! The stand-in for `cuda.rs` in a build without the `cuda` feature: asking for CUDA is an
//! error that says how to get it.

use super::trainers::Gatherer;
use crate::config::CUDA_NOT_BUILT as MISSING;
use fedshard_protocol::task::{Evaluator, LocalTrainer};
use fedshard_training::models::net::Architecture;
use fedshard_training::train::gather::Gathering;
use fedshard_training::train::neural::{Examples, LocalMethod};
use std::sync::Arc;

/// No CUDA queue can exist in this build.
pub type Queue = std::convert::Infallible;

pub fn queue(_: Gathering) -> anyhow::Result<Queue> {
    anyhow::bail!(MISSING)
}

pub fn trainer(
    _: &Architecture,
    _: Box<dyn Examples>,
    _: LocalMethod,
    _: &Gatherer,
) -> anyhow::Result<Arc<dyn LocalTrainer>> {
    anyhow::bail!(MISSING)
}

pub fn evaluator(_: &Architecture, _: Box<dyn Examples>) -> anyhow::Result<Arc<dyn Evaluator>> {
    anyhow::bail!(MISSING)
}
