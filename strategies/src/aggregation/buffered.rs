//! Buffered asynchronous aggregates (FedBuff, Nguyen et al. 2022): the updates of a buffer were
//! trained from different model versions, so each is folded as the change it asks for in the
//! full weight space, scaled by the aggregator's weight and by its staleness weight s(τ):
//! `W ← W + Σ_c w_c s(τ_c) ΔW_c`.
//!
//! Only a normalised [`super::Weighting`] whose weights do not depend on how the clients were
//! selected can fold a buffer: its `w_c` sum to 1 over the buffer, as FedBuff's mean does.
//! Inclusion probabilities have no meaning when idle clients are drawn one at a time, and the
//! FESC weights are derived for one-shot estimators of the optimum, not for changes from
//! different versions, so those aggregators say no ([`super::Aggregator::folds_buffered`]).

use super::{Fit, RoundOutcome};
use crate::Result;

/// One buffered update as an aggregator folds it: it adds `scale` × the weight-space change it
/// asks for to `change` (one f64 vector per global block, in block order). The update forms
/// the change itself, against the task it was trained from, because only it knows that basis.
pub trait WeightChange {
    fn add_scaled(&self, change: &mut [Vec<f64>], scale: f64) -> Result<()>;
}

/// A full buffer as [`super::Aggregator::aggregate_buffered`] sees it.
#[derive(Clone, Copy)]
pub struct BufferedRound<'a> {
    /// The buffered results, in the order they are folded; `failures` is empty.
    pub outcome: RoundOutcome<'a>,
    /// s(τ_c) of each result, in results order.
    pub staleness: &'a [f64],
    /// The change of each result, in results order.
    pub changes: &'a [&'a dyn WeightChange],
}

/// `x ← x + Σ_c w_c s_c ΔW_c`, accumulated in f64 in results order; a value no change touches
/// keeps its exact bits.
pub fn fold_changes(
    global: &mut [&mut [f32]],
    round: &BufferedRound<'_>,
    weights: &[f64],
) -> Result<Fit> {
    let mut change: Vec<Vec<f64>> = global.iter().map(|b| vec![0.0; b.len()]).collect();
    for ((c, &w), &s) in round.changes.iter().zip(weights).zip(round.staleness) {
        c.add_scaled(&mut change, w * s)?;
    }
    for (block, delta) in global.iter_mut().zip(&change) {
        for (x, &d) in block.iter_mut().zip(delta) {
            if d != 0.0 {
                *x = (f64::from(*x) + d) as f32;
            }
        }
    }
    Ok(Fit::Updated)
}
