//! Client-level differential privacy (docs/algorithms.md §6): the privacy accountant, written
//! from the papers, and the arithmetic of DP-FedAvg's clipping.
//!
//! * [`rdp`]: the Rényi DP of one round under each way fedshard samples clients — Poisson
//!   (Mironov, Talwar, Zhang 2019), a fixed-size sample without replacement (Wang, Balle,
//!   Kasiviswanathan 2019) and every client at once (the Gaussian mechanism).
//! * [`conversion`]: RDP to `(ε, δ)` (Balle et al. 2020; Canonne, Kamath, Steinke 2020).
//! * [`Accountant`]: a run's mechanism, composed over the rounds that ran.
//! * [`clipping`]: the clip factor, and the adaptive clip norm of Andrew et al. (2021) with the
//!   noise its count spends.
//!
//! Not here: the weight-space changes themselves and the noise drawn into them, which the
//! round engine (`fedshard-actors`) forms from the clients' tensors.

pub mod clipping;
pub mod conversion;
mod logspace;
pub mod rdp;

pub use clipping::{AdaptiveClip, add_gaussian_noise, clip_factor, update_noise_multiplier};
pub use conversion::{Epsilon, epsilon};

use crate::{Result, StrategyError};
use serde::{Deserialize, Serialize};

/// The orders `α` at which RDP is tracked: dp-accounting's default grid (1.1 to 10.9 by 0.1,
/// 11 to 63, then 128, 256, 512, 1024), so that our ε and its are minimised over the same
/// orders.
pub fn default_orders() -> Vec<f64> {
    let mut orders: Vec<f64> = (1..100).map(|x| 1.0 + f64::from(x) / 10.0).collect();
    orders.extend((11..64).map(f64::from));
    orders.extend([128.0, 256.0, 512.0, 1024.0]);
    orders
}

/// How the clients whose updates make up one release were chosen, which fixes both the
/// neighbouring relation the guarantee is stated under and the amplification it gets.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "sampling", rename_all = "snake_case")]
pub enum Sampling {
    /// Every client independently with probability `rate` (Poisson sampling). Neighbours add or
    /// remove one client, which moves the sum of clipped updates by at most the clip norm.
    Poisson { rate: f64 },
    /// `sample_size` of the `population` clients, uniformly without replacement. The population
    /// size is public and neighbours replace one client by another (substitution), which moves
    /// the sum of clipped updates by up to twice the clip norm.
    WithoutReplacement {
        population: usize,
        sample_size: usize,
    },
    /// No amplification claimed: every release is counted as if every client were in it
    /// (buffered asynchronous rounds, whose buffer holds whoever answered first, each client at
    /// most once). Neighbours replace one client's data (substitution, twice the clip norm).
    None,
}

impl Sampling {
    /// The ℓ₂ sensitivity of the sum of clipped updates under this sampling's neighbouring
    /// relation, in clip norms: 1 for add-or-remove, 2 for substitution.
    pub fn sensitivity(&self) -> f64 {
        match self {
            Sampling::Poisson { .. } => 1.0,
            Sampling::WithoutReplacement { .. } | Sampling::None => 2.0,
        }
    }

    /// The RDP of one release at order `alpha` when the noise's standard deviation is
    /// `noise_multiplier` clip norms.
    pub fn rdp(&self, noise_multiplier: f64, alpha: f64) -> f64 {
        let sigma = noise_multiplier / self.sensitivity();
        match *self {
            Sampling::Poisson { rate } => rdp::poisson_subsampled_gaussian(rate, sigma, alpha),
            Sampling::WithoutReplacement {
                population,
                sample_size,
            } => {
                let gamma = sample_size as f64 / population as f64;
                rdp::without_replacement_gaussian(gamma, sigma, alpha)
            }
            Sampling::None => rdp::gaussian(sigma, alpha),
        }
    }
}

/// The privacy loss of a run: one mechanism (a sampling and a noise multiplier), composed over
/// however many releases ran. RDP composes by addition (Mironov 2017, Proposition 1), so `T`
/// releases cost `T · ε₁(α)` at every order; [`Accountant::epsilon`] converts that to `(ε, δ)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Accountant {
    sampling: Sampling,
    noise_multiplier: f64,
    orders: Vec<f64>,
    /// `ε₁(α)` of one release at each of `orders`.
    per_release: Vec<f64>,
}

impl Accountant {
    /// The accountant of releases sampled by `sampling` with Gaussian noise of
    /// `noise_multiplier` clip norms (for adaptive clipping, the combined multiplier of the
    /// update sum and the count, [`update_noise_multiplier`]).
    pub fn new(sampling: Sampling, noise_multiplier: f64) -> Result<Self> {
        if !(noise_multiplier.is_finite() && noise_multiplier > 0.0) {
            return Err(StrategyError::invalid(
                "noise multiplier",
                format!("{noise_multiplier}; it must be a positive number"),
            ));
        }
        match sampling {
            Sampling::Poisson { rate } if !(rate > 0.0 && rate <= 1.0) => {
                return Err(StrategyError::invalid(
                    "sampling rate",
                    format!("{rate}; it must be in (0, 1]"),
                ));
            }
            Sampling::WithoutReplacement {
                population,
                sample_size,
            } if sample_size == 0 || sample_size > population => {
                return Err(StrategyError::invalid(
                    "sample size",
                    format!("{sample_size} of {population}; it must be in 1..=population"),
                ));
            }
            _ => {}
        }
        let orders = default_orders();
        let per_release = orders
            .iter()
            .map(|&a| sampling.rdp(noise_multiplier, a))
            .collect();
        Ok(Self {
            sampling,
            noise_multiplier,
            orders,
            per_release,
        })
    }

    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }

    /// `(ε, δ)`-DP after `releases` releases, at `delta`.
    pub fn epsilon(&self, releases: u64, delta: f64) -> Epsilon {
        let rdp: Vec<f64> = self
            .per_release
            .iter()
            .map(|r| r * releases as f64)
            .collect();
        epsilon(&self.orders, &rdp, delta)
    }
}

#[cfg(test)]
mod tests;
