//! The scaling rule of federated SGLD with KLMS (docs/algorithms.md §4.9): how a client's Gaussian
//! message is spread so that the server's step carries exactly the Langevin noise.
//!
//! The host is `θ ← θ − η Σ_{n=1..N} H_n(θ) + √(2η) ξ`. With `C` of the `N` clients in a round,
//! the server applies `θ ← θ − η κ Σ_{c ∈ C_t} y_c` with `κ = N/C` (unbiased for the full sum),
//! and each client sends `y_c ~ N(μ_c, σ² I)`, `μ_c = H_c`, with `σ² = 2 / (η κ² C)`, so the
//! aggregate's noise variance is `(η κ)² C σ² = 2η` per coordinate and the server adds none.
//! This is neither the paper's `p = N(0, √(2/(γ C²)) I)` nor the reference's variance
//! `2/(η C²)` plus a second `√(2η) ξ` at the server (§4.9, §4.12).

use crate::error::{Result, StrategyError};
use serde::{Deserialize, Serialize};

/// The step `η` and the cohort (`N` clients, `C` participants) of one SGLD round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LangevinScaling {
    /// `η`, the server's step size.
    pub step: f64,
    /// `N`, the clients in the population.
    pub population: usize,
    /// `C`, the clients asked to train this round.
    pub participants: usize,
}

impl LangevinScaling {
    /// Validates `η > 0` finite and `1 ≤ C ≤ N`.
    pub fn new(step: f64, population: usize, participants: usize) -> Result<Self> {
        let scaling = Self {
            step,
            population,
            participants,
        };
        scaling.check()?;
        Ok(scaling)
    }

    /// The checks of [`Self::new`], for a value that came over the wire.
    pub fn check(&self) -> Result<()> {
        if !(self.step > 0.0 && self.step.is_finite()) {
            return Err(StrategyError::invalid(
                "SGLD step η",
                format!("{}; expected a finite η > 0", self.step),
            ));
        }
        if self.participants == 0 || self.participants > self.population {
            return Err(StrategyError::invalid(
                "SGLD cohort",
                format!(
                    "C = {} participants of N = {} clients; expected 1 ≤ C ≤ N",
                    self.participants, self.population
                ),
            ));
        }
        Ok(())
    }

    /// `κ = N / C`.
    pub fn kappa(&self) -> f64 {
        self.population as f64 / self.participants as f64
    }

    /// `σ² = 2 / (η κ² C)`: the variance of each coordinate of a client's message.
    pub fn noise_variance(&self) -> f64 {
        let kappa = self.kappa();
        2.0 / (self.step * kappa * kappa * self.participants as f64)
    }

    /// `η κ C = η N`: the move of a decoded value per unit of a client's `y`, so that the
    /// equal-weight mean over the `C` clients of `θ − η κ C y_c` is `θ − η κ Σ_c y_c`.
    pub fn decoded_scale(&self) -> f64 {
        self.step * self.kappa() * self.participants as f64
    }

    /// The noise variance per coordinate of the equal-weight mean of `arrived` decoded values:
    /// `(η κ C)² σ² / arrived = 2η · C / arrived`, which is `2η` when every participant arrives.
    /// With fewer, the drift stays unbiased (the mean rescales to `κ' = N / arrived`) and the
    /// noise is inflated by `C / arrived`.
    pub fn aggregate_noise_variance(&self, arrived: usize) -> f64 {
        let scale = self.decoded_scale();
        scale * scale * self.noise_variance() / arrived as f64
    }

    /// The prior's share of each client (`1/N`): a client adds `∇(−ln p(θ)) / N` to its
    /// `H_c`, so that `κ Σ_{c ∈ C}` of the shares is the whole prior gradient.
    pub fn prior_share(&self) -> f64 {
        1.0 / self.population as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aggregate_carries_exactly_the_langevin_noise() {
        // η = 1e-5 (the reference's), N = 100, C = 10: κ = 10, σ² = 2/(1e-5 · 100 · 10) = 200.
        let s = LangevinScaling::new(1e-5, 100, 10).unwrap();
        assert_eq!(s.kappa(), 10.0);
        assert!((s.noise_variance() - 200.0).abs() < 1e-9);
        assert!((s.decoded_scale() - 1e-3).abs() < 1e-15);
        assert!((s.aggregate_noise_variance(10) - 2e-5).abs() < 1e-15);
        // Half the participants lost: twice the noise.
        assert!((s.aggregate_noise_variance(5) - 4e-5).abs() < 1e-15);
        // Full participation: κ = 1, σ² = 2/(η N).
        let full = LangevinScaling::new(0.5, 4, 4).unwrap();
        assert_eq!(full.kappa(), 1.0);
        assert!((full.noise_variance() - 1.0).abs() < 1e-15);
        assert_eq!(full.prior_share(), 0.25);
    }

    #[test]
    fn a_cohort_outside_one_to_n_or_a_bad_step_is_refused() {
        assert!(LangevinScaling::new(1e-3, 4, 0).is_err());
        assert!(LangevinScaling::new(1e-3, 4, 5).is_err());
        assert!(LangevinScaling::new(0.0, 4, 2).is_err());
        assert!(LangevinScaling::new(f64::NAN, 4, 2).is_err());
    }
}
