//! The fold every aggregator shares: the global parameters as blocks, each result as the blocks
//! it trained, and the weighted move of each block towards its holders (docs/algorithms.md §1.1
//! step 5 for sharded layers, §2.4 for inverse-probability weights).

use super::RoundOutcome;
use crate::{Result, StrategyError};

/// One block a client trained: the index of the global block and the client's new values.
pub type BlockUpdate<'a> = (usize, &'a [f32]);

/// A finished round as [`super::Aggregator::aggregate_fit`] sees it: who succeeded and who
/// failed (with the weights' inputs), and what each success trained.
#[derive(Debug, Clone, Copy)]
pub struct FitRound<'a> {
    pub outcome: RoundOutcome<'a>,
    /// One entry per `outcome.results`, in that order: the blocks the result trained.
    pub updates: &'a [Vec<BlockUpdate<'a>>],
}

/// What an aggregator did with a round.
#[derive(Debug, Clone, PartialEq)]
pub enum Fit {
    /// The global blocks were moved.
    Updated,
    /// The aggregator declined to move the model; the blocks are untouched. The text says why.
    NoUpdate(String),
}

/// How a weighted fold scales the sum of the holders' changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Divide by the holders' total weight: each block moves to its holders' weighted mean.
    Mean,
    /// Keep the weighted sum: the unbiased inverse-probability estimator (§2.4).
    Sum,
}

/// Moves every global block by its holders' weighted changes:
/// `x ← x + Σ_c w_c (x_c − x) / (Σ_c w_c for Scale::Mean)`, accumulated in f64, results folded
/// in the order given (the caller sorts them, so arrival order never matters). A block no
/// result holds keeps its exact bits.
///
/// Everything is checked before anything is written (one weight per result, each finite and
/// ≥ 0; block indices in range and not repeated within a result; the right lengths; finite
/// values), so on error `global` is untouched.
pub fn fold_weighted(
    global: &mut [&mut [f32]],
    updates: &[Vec<BlockUpdate<'_>>],
    weights: &[f64],
    scale: Scale,
) -> Result<()> {
    if weights.len() != updates.len() {
        return Err(StrategyError::invalid(
            "aggregation weights",
            format!("{} weights for {} results", weights.len(), updates.len()),
        ));
    }
    let mut holders: Vec<Vec<(f64, &[f32])>> = vec![Vec::new(); global.len()];
    for (r, (blocks, &w)) in updates.iter().zip(weights).enumerate() {
        if !w.is_finite() || w < 0.0 {
            return Err(StrategyError::invalid(
                "aggregation weights",
                format!("result {r} has weight {w}; weights must be finite and non-negative"),
            ));
        }
        for &(b, values) in blocks {
            let Some(target) = global.get(b) else {
                return Err(StrategyError::invalid(
                    "block update",
                    format!(
                        "result {r} trained block {b}, but there are {}",
                        global.len()
                    ),
                ));
            };
            if values.len() != target.len() {
                return Err(StrategyError::invalid(
                    "block update",
                    format!(
                        "result {r} has {} values for block {b} of {}",
                        values.len(),
                        target.len()
                    ),
                ));
            }
            if let Some(v) = values.iter().find(|v| !v.is_finite()) {
                return Err(StrategyError::invalid(
                    "block update",
                    format!("result {r} holds the non-finite value {v} in block {b}"),
                ));
            }
            holders[b].push((w, values));
        }
    }
    for (r, blocks) in updates.iter().enumerate() {
        let mut seen: Vec<usize> = blocks.iter().map(|(b, _)| *b).collect();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(StrategyError::invalid(
                "block update",
                format!("result {r} trained block {} twice", w[0]),
            ));
        }
    }
    for (target, contributions) in global.iter_mut().zip(&holders) {
        fold_block(target, contributions, scale);
    }
    Ok(())
}

/// One block: `x ← x + s Σ_c w_c (x_c − x)` with `s = 1/Σ w_c` for [`Scale::Mean`] (a block whose
/// holders weigh nothing stays) and `s = 1` for [`Scale::Sum`].
fn fold_block(target: &mut [f32], contributions: &[(f64, &[f32])], scale: Scale) {
    if contributions.is_empty() {
        return;
    }
    let s = match scale {
        Scale::Mean => {
            let total: f64 = contributions.iter().map(|(w, _)| w).sum();
            if total <= 0.0 {
                return;
            }
            1.0 / total
        }
        Scale::Sum => 1.0,
    };
    for (k, x) in target.iter_mut().enumerate() {
        let old = f64::from(*x);
        let delta: f64 = contributions
            .iter()
            .map(|(w, c)| w * (f64::from(c[k]) - old))
            .sum();
        *x = (old + s * delta) as f32;
    }
}
