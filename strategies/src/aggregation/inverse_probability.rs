//! Inverse-probability (Horvitz–Thompson) weights for sampled clients.

use super::{RoundOutcome, Scale, SumWeight, Weighting, result_samples, validate_weights};
use crate::{Result, StrategyError};

/// `w_c = n_c / (p_c Σ_population n)`: with these weights `Σ_c w_c U_c` is an unbiased estimate
/// of the population average `Σ_k n_k U_k / Σ_k n_k` under independent selection with
/// probabilities `p_k` (docs/algorithms.md §2.4, `Δ = (1/Σ_j n_j) Σ_{k∈A} (n_k/p_k) U_k`).
///
/// The weights do **not** sum to 1 (only their expectation does); [`super::validate_weights`]
/// is called with `normalised = false`. Failed clients break the unbiasedness (they are treated
/// as not selected). Requires `0 < p_c ≤ 1` and a positive `population_samples`.
#[derive(Debug, Clone, Copy, Default)]
pub struct InverseProbability;

impl Weighting for InverseProbability {
    fn name(&self) -> &'static str {
        "inverse-probability"
    }

    /// The weights are unbiased only as a sum (§2.4): they do not add up to 1.
    fn scale(&self) -> Scale {
        Scale::Sum
    }

    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Err(
            "its weights n_c / (p_c Σ n) are summed, not averaged, and are not wired to secure \
             aggregation",
        )
    }

    fn weights(&self, round: &RoundOutcome) -> Result<Vec<f64>> {
        let samples = result_samples(round, false)?;
        let total = round.population_samples;
        if !total.is_finite() || total <= 0.0 {
            return Err(StrategyError::invalid(
                "population samples",
                format!("{total}; Σ n over the registered clients must be finite and > 0"),
            ));
        }
        let w = round
            .results
            .iter()
            .zip(samples)
            .map(|(c, n)| {
                let p = c.inclusion_probability;
                if p > 0.0 && p <= 1.0 {
                    Ok(n / (p * total))
                } else {
                    Err(StrategyError::invalid(
                        "inclusion probability",
                        format!("client {} has p = {p}; it must be in (0, 1]", c.client),
                    ))
                }
            })
            .collect::<Result<Vec<f64>>>()?;
        validate_weights(&w, round.results.len(), false)?;
        Ok(w)
    }
}
