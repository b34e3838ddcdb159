//! FESC weights as an aggregator.

use super::{RoundOutcome, SumWeight, Weighting, result_samples, validate_weights};
use crate::fesc::{fesc_weights, water_filling};
use crate::{Result, StrategyError};

/// FESC (docs/algorithms.md §3.2): [`fesc_weights`] of the results' sample sizes; only the `K`
/// largest results get a positive weight. Needs every result to have `n > 0`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fesc;

impl Weighting for Fesc {
    fn name(&self) -> &'static str {
        "fesc"
    }

    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Err("its weights depend on which clients answered, known only after the sum")
    }

    fn weights(&self, round: &RoundOutcome) -> Result<Vec<f64>> {
        let w = fesc_weights(&result_samples(round, true)?)?.weights;
        validate_weights(&w, round.results.len(), true)?;
        Ok(w)
    }
}

/// Oracle FESC (docs/algorithms.md §3.2, last paragraph): [`water_filling`] with the true
/// `a_i = tr Var(θ̂_i)` and `b_i = ‖E θ̂_i − θ*‖²`, known only in simulation.
///
/// `a` and `b` are keyed by **results order**: entry `i` belongs to `round.results[i]`, so the
/// caller builds them for the results it is about to aggregate (failures excluded).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FescOracle {
    /// Variance `a_i > 0` of each result's estimator.
    pub a: Vec<f64>,
    /// Squared bias `b_i` of each result's estimator.
    pub b: Vec<f64>,
}

impl Weighting for FescOracle {
    fn name(&self) -> &'static str {
        "fesc-oracle"
    }

    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Err("its weights depend on which clients answered, known only after the sum")
    }

    fn weights(&self, round: &RoundOutcome) -> Result<Vec<f64>> {
        let m = result_samples(round, false)?.len();
        if self.a.len() != m || self.b.len() != m {
            return Err(StrategyError::invalid(
                "oracle quantities",
                format!(
                    "{} variances and {} biases for {m} results; need one of each per result",
                    self.a.len(),
                    self.b.len()
                ),
            ));
        }
        let w = water_filling(&self.a, &self.b)?.weights;
        validate_weights(&w, m, true)?;
        Ok(w)
    }
}
