//! FedAvg weights.

use super::{RoundOutcome, SumWeight, Weighting, result_samples, validate_weights};
use crate::{Result, StrategyError};

/// `w_c = n_c / Σ_results n` (FedAvg; the "federated" baseline of docs/algorithms.md §3.2).
#[derive(Debug, Clone, Copy, Default)]
pub struct FedAvg;

/// `n_c / Σ n` for finite non-negative `samples` with a positive sum; shared with
/// [`super::Spectral`].
pub(super) fn sample_weights(samples: &[f64]) -> Result<Vec<f64>> {
    let total: f64 = samples.iter().sum();
    if total <= 0.0 {
        return Err(StrategyError::invalid(
            "result samples",
            "the results hold no samples; FedAvg weights are undefined",
        ));
    }
    Ok(samples.iter().map(|n| n / total).collect())
}

impl Weighting for FedAvg {
    fn name(&self) -> &'static str {
        "fedavg"
    }

    /// Normalised weights of the results alone: FedBuff's mean.
    fn folds_changes(&self) -> bool {
        true
    }

    /// Each client premultiplies its change by its weight before the sum.
    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Ok(SumWeight::Samples)
    }

    fn weights(&self, round: &RoundOutcome) -> Result<Vec<f64>> {
        let w = sample_weights(&result_samples(round, false)?)?;
        validate_weights(&w, round.results.len(), true)?;
        Ok(w)
    }
}
