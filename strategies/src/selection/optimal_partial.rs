//! Optimal client sampling with partial training (Dabaja & El-Azouzi; docs/algorithms.md §2.2–2.3).
//!
//! Clients are included independently with probabilities `p_k` that minimise the variance of the
//! inverse-probability estimate `Ĝ = Σ_{k∈A} (n_k/p_k) U_k` of `G = Σ_k n_k U_k`,
//! `Σ_k a_k² (1/p_k − 1)` with `a_k = n_k ‖U_k‖`, under the expected budget `Σ_k r_k p_k = m`.

use super::{ClientSelector, ClientStats, Selection, independent_draws, validate_clients};
use crate::rng::ChaCha20Rng;
use crate::{Result, StrategyError};

/// Relative slack of the threshold test of §2.3 step 4, so that a `ρ` equal to `θ` up to
/// rounding is accepted on either side of the boundary (both prefixes are optimal then).
const THRESHOLD_SLACK: f64 = 1e-12;

/// The variance-optimal inclusion probabilities of docs/algorithms.md §2.2, computed by the
/// `O(K log K)` algorithm of §2.3, and the threshold `θ`.
///
/// With `a_k = n_k ‖U_k‖`, `ρ_k = a_k / √r_k` and `R = Σ r_k`: `p_k = min(1, ρ_k/θ)` where `θ`
/// solves `Σ r_k min(1, ρ_k/θ) = m`. The clients are sorted by `ρ` ascending (the corrected
/// key, §2.6: the note's `√r_k a_k` is wrong), prefix sums `SR_l = Σ_{j≤l} r_(j)` and
/// `SB_l = Σ_{j≤l} √r_(j) a_(j)` give `θ_l = SB_l / (m − R + SR_l)`, and the first `l` with
/// `ρ_(l) ≤ θ_l ≤ ρ_(l+1)` is the set `S` of clients with `p < 1`.
///
/// Edge cases (§2.3), in this order:
/// * `m ≥ R`: everyone is included, `p = 1`, and `θ = 0` is returned (any `θ ≤ min ρ` fits).
/// * `r_k = 0` (a free client): `p_k = 1`; it costs no budget.
/// * `a_k = 0` (no data or a zero update): `p_k = 0`; it contributes nothing.
/// * `Σ_{a_k>0, r_k>0} r_k ≤ m`: all those clients get `p_k = 1`, the leftover budget is left
///   unused, and `θ = 0`.
///
/// Then `Σ r_k p_k = m` holds except in the last two edge cases. Errors on inputs of different
/// lengths or none, on non-finite or negative samples or norms, on keep ratios outside
/// `[0, 1]`, and unless `budget` is finite and `> 0`.
pub fn optimal_partial_probabilities(
    samples: &[f64],
    norms: &[f64],
    keep_ratios: &[f64],
    budget: f64,
) -> Result<(Vec<f64>, f64)> {
    let k = samples.len();
    if k == 0 {
        return Err(StrategyError::invalid(
            "clients",
            "no clients to select from",
        ));
    }
    if norms.len() != k || keep_ratios.len() != k {
        return Err(StrategyError::invalid(
            "client statistics",
            format!(
                "{k} sample counts, {} update norms and {} keep ratios; need one of each per client",
                norms.len(),
                keep_ratios.len()
            ),
        ));
    }
    for (what, values) in [("client samples", samples), ("client update norm", norms)] {
        if let Some((i, v)) = values
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || **v < 0.0)
        {
            return Err(StrategyError::invalid(
                what,
                format!("client {i} has {v}; it must be finite and non-negative"),
            ));
        }
    }
    if let Some((i, r)) = keep_ratios
        .iter()
        .enumerate()
        .find(|(_, r)| !(0.0..=1.0).contains(*r))
    {
        return Err(StrategyError::invalid(
            "client keep ratio",
            format!("client {i} has keep ratio {r}; it must be in [0, 1]"),
        ));
    }
    if !budget.is_finite() || budget <= 0.0 {
        return Err(StrategyError::invalid(
            "selection budget",
            format!("{budget}; the expected budget m must be finite and > 0"),
        ));
    }

    let total_ratio: f64 = keep_ratios.iter().sum();
    if budget >= total_ratio {
        return Ok((vec![1.0; k], 0.0));
    }

    let a: Vec<f64> = samples.iter().zip(norms).map(|(n, u)| n * u).collect();
    let mut p = vec![0.0; k];
    // The clients that compete for the budget: positive cost and positive contribution.
    let mut competing: Vec<usize> = Vec::with_capacity(k);
    for i in 0..k {
        if keep_ratios[i] == 0.0 {
            p[i] = 1.0;
        } else if a[i] > 0.0 {
            competing.push(i);
        }
    }
    let competing_ratio: f64 = competing.iter().map(|&i| keep_ratios[i]).sum();
    if competing_ratio <= budget {
        for &i in &competing {
            p[i] = 1.0;
        }
        return Ok((p, 0.0));
    }

    let rho: Vec<f64> = (0..k).map(|i| a[i] / keep_ratios[i].sqrt()).collect();
    competing.sort_by(|&i, &j| rho[i].total_cmp(&rho[j]));

    let mut prefix_ratio = 0.0;
    let mut prefix_weight = 0.0;
    let mut theta = None;
    for (l, &i) in competing.iter().enumerate() {
        prefix_ratio += keep_ratios[i];
        prefix_weight += keep_ratios[i].sqrt() * a[i];
        let den = budget - competing_ratio + prefix_ratio;
        if den <= 0.0 {
            continue;
        }
        let theta_l = prefix_weight / den;
        let fits_below = rho[i] <= theta_l * (1.0 + THRESHOLD_SLACK);
        let fits_above = competing
            .get(l + 1)
            .is_none_or(|&next| rho[next] >= theta_l * (1.0 - THRESHOLD_SLACK));
        if fits_below && fits_above {
            theta = Some((l + 1, theta_l));
            break;
        }
    }
    let Some((below, theta)) = theta else {
        return Err(StrategyError::invalid(
            "client statistics",
            "no threshold θ satisfies the test of docs/algorithms.md §2.3 (numerically degenerate input)",
        ));
    };
    for (l, &i) in competing.iter().enumerate() {
        p[i] = if l < below {
            (rho[i] / theta).min(1.0)
        } else {
            1.0
        };
    }
    Ok((p, theta))
}

/// `E‖Ĝ − G‖² = Σ_k a_k² (1/p_k − 1)` with `a_k = n_k ‖U_k‖`, the variance of the
/// inverse-probability estimate under independent (Poisson) inclusion (docs/algorithms.md §2.1), the
/// objective [`optimal_partial_probabilities`] minimises. A client with `a_k = 0` contributes 0
/// whatever its `p_k`; `p_k = 0` with `a_k > 0` gives `+∞`.
pub fn poisson_sampling_variance(contributions: &[f64], probabilities: &[f64]) -> f64 {
    contributions
        .iter()
        .zip(probabilities)
        .map(|(&a, &p)| {
            if a == 0.0 {
                0.0
            } else {
                a * a * (1.0 / p - 1.0)
            }
        })
        .sum()
}

/// The optimal-partial selector (`optimal-partial`): probabilities from
/// [`optimal_partial_probabilities`], realised by independent Bernoulli(`p_k`) draws (§2.4),
/// so the number of participants is random and only its cost `Σ r_k p_k = m` is fixed in
/// expectation. Needs every client's update norm (a two-phase round).
#[derive(Debug, Clone, Copy, Default)]
pub struct OptimalPartialSelector;

impl ClientSelector for OptimalPartialSelector {
    fn name(&self) -> &'static str {
        "optimal-partial"
    }

    fn needs_update_norms(&self) -> bool {
        true
    }

    fn probabilities(&self, clients: &[ClientStats], budget: f64) -> Result<Vec<f64>> {
        validate_clients(clients)?;
        let norms = clients
            .iter()
            .map(|c| {
                c.update_norm.ok_or_else(|| {
                    StrategyError::invalid(
                        "client update norm",
                        format!(
                            "client {} did not report one; optimal-partial needs it",
                            c.id
                        ),
                    )
                })
            })
            .collect::<Result<Vec<f64>>>()?;
        let samples: Vec<f64> = clients.iter().map(|c| c.samples).collect();
        let ratios: Vec<f64> = clients.iter().map(|c| c.keep_ratio).collect();
        Ok(optimal_partial_probabilities(&samples, &norms, &ratios, budget)?.0)
    }

    /// One uniform per client, in `clients` order, whatever its `p_k`, so the stream position
    /// does not depend on the probabilities; client k is chosen iff `u_k < p_k`.
    fn select(
        &self,
        clients: &[ClientStats],
        budget: f64,
        rng: &mut ChaCha20Rng,
    ) -> Result<Selection> {
        Ok(independent_draws(self.probabilities(clients, budget)?, rng))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_cases() {
        // Budget covers everyone.
        let (p, _) =
            optimal_partial_probabilities(&[1.0, 2.0], &[1.0, 1.0], &[0.5, 0.5], 1.0).unwrap();
        assert_eq!(p, vec![1.0, 1.0]);
        // a = 0 -> p = 0; the rest fits in the budget.
        let (p, theta) =
            optimal_partial_probabilities(&[1.0, 0.0, 3.0], &[1.0, 1.0, 1.0], &[1.0; 3], 2.0)
                .unwrap();
        assert_eq!(p, vec![1.0, 0.0, 1.0]);
        assert_eq!(theta, 0.0);
        // A free client is always in and costs nothing.
        let (p, _) =
            optimal_partial_probabilities(&[1.0, 1.0, 1.0], &[1.0; 3], &[0.0, 1.0, 1.0], 1.0)
                .unwrap();
        assert_eq!(p[0], 1.0);
        assert!((p[1] - 0.5).abs() < 1e-15 && (p[2] - 0.5).abs() < 1e-15);
        assert!(optimal_partial_probabilities(&[1.0], &[1.0], &[1.0], 0.0).is_err());
        assert!(optimal_partial_probabilities(&[1.0], &[1.0], &[1.5], 0.5).is_err());
        assert!(optimal_partial_probabilities(&[1.0], &[], &[1.0], 0.5).is_err());
    }

    #[test]
    fn selector_requires_norms() {
        let c = [ClientStats {
            id: 7,
            samples: 1.0,
            keep_ratio: 1.0,
            update_norm: None,
        }];
        assert!(OptimalPartialSelector.probabilities(&c, 0.5).is_err());
    }
}
