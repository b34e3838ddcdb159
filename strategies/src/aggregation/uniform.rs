//! Equal weights.

use super::{RoundOutcome, SumWeight, Weighting, result_samples, validate_weights};
use crate::Result;

/// `w_c = 1/m` for the `m` results, whatever their sizes.
#[derive(Debug, Clone, Copy, Default)]
pub struct UniformWeights;

impl Weighting for UniformWeights {
    fn name(&self) -> &'static str {
        "uniform"
    }

    /// Normalised weights of the results alone: FedBuff's mean.
    fn folds_changes(&self) -> bool {
        true
    }

    /// Each client premultiplies its change by its weight before the sum.
    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Ok(SumWeight::Uniform)
    }

    fn weights(&self, round: &RoundOutcome) -> Result<Vec<f64>> {
        let m = result_samples(round, false)?.len();
        let w = vec![1.0 / m as f64; m];
        validate_weights(&w, m, true)?;
        Ok(w)
    }
}
