//! DP-FedAvg's clipping (McMahan et al. 2018, Algorithm 1): each client's change is scaled into
//! the ball of radius `C` before it is summed, and the sum gets Gaussian noise of `z·C`; with
//! adaptive clipping `C` follows a quantile of the clients' norms (Andrew et al. 2021)
//! (docs/algorithms.md §6.1–6.2).

use crate::rng::ChaCha20Rng;
use crate::{Result, StrategyError};
use rand_distr::{Distribution, StandardNormal};

/// The factor `min(1, C / ‖Δ‖)` that scales a change of norm `norm` into the ball of radius
/// `clip_norm` (McMahan et al. 2018, `ClipFn`); 1 for a zero change.
pub fn clip_factor(norm: f64, clip_norm: f64) -> f64 {
    if norm > clip_norm {
        clip_norm / norm
    } else {
        1.0
    }
}

/// Adds independent `N(0, std²)` noise to every value, drawn in order from `rng`.
pub fn add_gaussian_noise(values: &mut [f64], std: f64, rng: &mut ChaCha20Rng) {
    for v in values {
        let z: f64 = StandardNormal.sample(rng);
        *v += std * z;
    }
}

/// The noise multiplier `z_Δ` of the update sum when a run's total multiplier `z` is shared with
/// the clipped-count query of adaptive clipping, whose noise is `σ_b`:
/// `z_Δ = (z⁻² − (2σ_b)⁻²)^{−1/2}` (Andrew et al. 2021, Sec. 3.1). The two Gaussian queries
/// (sensitivities `C` and ½ for the centred bits) together are then one Gaussian mechanism of
/// multiplier `z`, which is what the accountant is told. Needs `2σ_b > z`.
pub fn update_noise_multiplier(z: f64, count_stddev: f64) -> Result<f64> {
    let rest = z.powi(-2) - (2.0 * count_stddev).powi(-2);
    if rest.is_nan() || rest <= 0.0 {
        return Err(StrategyError::invalid(
            "clipped count noise",
            format!(
                "σ_b = {count_stddev} spends the whole noise multiplier z = {z}: adaptive \
                 clipping needs σ_b above z / 2 = {} so that the count leaves noise for the \
                 updates (z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), Andrew et al. 2021)",
                z / 2.0
            ),
        ));
    }
    Ok(rest.powf(-0.5))
}

/// Adaptive clipping to the `quantile`-th quantile of the clients' update norms, by the
/// geometric update of Andrew et al. (2021, Sec. 2.2 and Algorithm 1):
/// `C ← C · exp(−η_C (b̃ − γ))`, where `b̃ = (Σ_i 1[‖Δ_i‖ ≤ C] + N(0, σ_b²)) / m` is the noised
/// fraction of the `m` expected clients whose change was not clipped.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdaptiveClip {
    /// γ, the target fraction of unclipped updates.
    pub quantile: f64,
    /// η_C.
    pub learning_rate: f64,
    /// σ_b, the noise of the count.
    pub count_stddev: f64,
}

impl AdaptiveClip {
    /// The next clip norm after a round in which `unclipped` of the updates had a norm at most
    /// `clip_norm`, over a fixed denominator of `expected` clients, with the count's noise drawn
    /// from `rng`. Returns the next norm and the noised fraction `b̃`.
    pub fn next(
        &self,
        clip_norm: f64,
        unclipped: usize,
        expected: f64,
        rng: &mut ChaCha20Rng,
    ) -> (f64, f64) {
        let z: f64 = StandardNormal.sample(rng);
        let fraction = (unclipped as f64 + self.count_stddev * z) / expected;
        (
            clip_norm * (-self.learning_rate * (fraction - self.quantile)).exp(),
            fraction,
        )
    }
}
