//! Folding weight-space changes: `W ← W + Σ_c w_c s_c ΔW_c`, each change formed by its update
//! against the task it was trained from, scaled by the aggregator's weight `w_c` and a per-update
//! factor `s_c`.
//!
//! Two folds take this form. A buffered asynchronous aggregate (FedBuff, Nguyen et al. 2022),
//! whose updates were trained from different model versions, with `s_c = s(τ_c)` the staleness
//! weight; and a private release (DP-FedAvg), which must clip each update's change in the full
//! weight space, with `s_c = 1` in a synchronous round.
//!
//! Only a normalised [`super::Weighting`] whose weights do not depend on how the clients were
//! selected can fold changes: its `w_c` sum to 1 over the buffer, as FedBuff's mean does.
//! Inclusion probabilities have no meaning when idle clients are drawn one at a time, and the
//! FESC weights are derived for one-shot estimators of the optimum, not for changes from
//! different versions, so those aggregators say no ([`super::Aggregator::folds_changes`]).

use super::{Fit, RoundOutcome};
use crate::Result;

/// One update as an aggregator folds its change: it adds `scale` × the weight-space change it
/// asks for to `change` (one f64 vector per global block, in block order). The update forms
/// the change itself, against the task it was trained from, because only it knows that basis.
pub trait WeightChange {
    fn add_scaled(&self, change: &mut [Vec<f64>], scale: f64) -> Result<()>;
}

/// The updates of one aggregate as [`super::Aggregator::aggregate_changes`] sees them: a full
/// buffer, or a private round's answers.
#[derive(Clone, Copy)]
pub struct ChangeRound<'a> {
    /// The results, in the order they are folded.
    pub outcome: RoundOutcome<'a>,
    /// `s_c` of each result, in results order: s(τ_c) in a buffer, 1 in a round.
    pub scales: &'a [f64],
    /// The change of each result, in results order.
    pub changes: &'a [&'a dyn WeightChange],
}

/// `x ← x + Σ_c w_c s_c ΔW_c`, accumulated in f64 in results order; a value no change touches
/// keeps its exact bits.
pub fn fold_changes(
    global: &mut [&mut [f32]],
    round: &ChangeRound<'_>,
    weights: &[f64],
) -> Result<Fit> {
    let mut change: Vec<Vec<f64>> = global.iter().map(|b| vec![0.0; b.len()]).collect();
    for ((c, &w), &s) in round.changes.iter().zip(weights).zip(round.scales) {
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
