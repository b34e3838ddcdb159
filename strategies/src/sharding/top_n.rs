//! Top-n (FedHM) sharding (docs/algorithms.md §1.4): every client receives the `n` largest terms with
//! unit multipliers. It is the Eckart–Young optimum for one client and the fallback of the
//! Collective strategy (`C = 1`, `n = N`, or `λ_n ≥ C λ_{n+1}`, §1.3).
//!
//! This module also holds the argument checks every strategy shares (`check_layer`) and the
//! rule for numerically zero singular values (`effective_spectrum`).

use super::Marginals;
use crate::spectrum::check_sorted;
use crate::{Result, StrategyError};

/// Singular values at most this fraction of `λ_1` are treated as exact zeros (docs/algorithms.md
/// §1.2 edge cases: zero terms are never sampled).
///
/// Why: such a term carries less than `1e-300` of `‖W‖²_F`, far below f64 resolution of any
/// discrepancy, but an inclusion probability proportional to it would be so small that its
/// multiplier `1/π` overflows to infinity.
pub(crate) const NEGLIGIBLE_RATIO: f64 = 1e-150;

/// Validates a layer: `spectrum` sorted non-increasing, finite, non-negative, with `Σλ` and
/// `(Σλ)²` representable; `1 ≤ n ≤ N`.
pub(crate) fn check_layer(spectrum: &[f64], n: usize) -> Result<()> {
    check_sorted(spectrum)?;
    if n == 0 {
        return Err(StrategyError::invalid("n", "n must be ≥ 1"));
    }
    if n > spectrum.len() {
        return Err(StrategyError::invalid(
            "n",
            format!(
                "n = {n} exceeds the number of terms N = {}; n must be ≤ N",
                spectrum.len()
            ),
        ));
    }
    let total: f64 = spectrum.iter().sum();
    if !(total * total).is_finite() {
        return Err(StrategyError::invalid(
            "spectrum",
            "singular values too large: (Σλ)² overflows f64; rescale the layer",
        ));
    }
    Ok(())
}

/// The spectrum with numerically zero values (`λ_i ≤ λ_1 · 1e-150`, see [`NEGLIGIBLE_RATIO`])
/// replaced by exact zeros, and the number of remaining positive values (the numerical rank).
pub(crate) fn effective_spectrum(spectrum: &[f64]) -> (Vec<f64>, usize) {
    let floor = spectrum.first().copied().unwrap_or(0.0) * NEGLIGIBLE_RATIO;
    let values: Vec<f64> = spectrum
        .iter()
        .map(|&l| if l > floor { l } else { 0.0 })
        .collect();
    let rank = values.iter().take_while(|&&l| l > 0.0).count();
    (values, rank)
}

/// `π_i = ω_i = 1{i ≤ n}` (docs/algorithms.md §1.4); the discrepancy is the truncated-SVD error
/// `Σ_{i>n} λ_i²` (Eckart–Young), deterministic.
///
/// Errors unless the spectrum is valid and `1 ≤ n ≤ N`.
pub fn marginals(spectrum: &[f64], n: usize) -> Result<Marginals> {
    check_layer(spectrum, n)?;
    Ok(indicator(spectrum, n))
}

/// Top-n marginals without validation (callers have checked `1 ≤ n ≤ N`).
pub(crate) fn indicator(spectrum: &[f64], n: usize) -> Marginals {
    let head: Vec<f64> = (0..spectrum.len())
        .map(|i| if i < n { 1.0 } else { 0.0 })
        .collect();
    Marginals {
        inclusion_probabilities: head.clone(),
        multipliers: head,
        expected_discrepancy: Some(spectrum[n..].iter().map(|l| l * l).sum()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_head() {
        // Spectrum A, n = 2: π = ω = (1,1,0,0,0,0), error 9 + 4 + 1 + 0.25 = 14.25.
        let m = marginals(&[10.0, 5.0, 3.0, 2.0, 1.0, 0.5], 2).unwrap();
        assert_eq!(
            m.inclusion_probabilities,
            vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(m.multipliers, m.inclusion_probabilities);
        assert_eq!(m.expected_discrepancy, Some(14.25));
        let all = marginals(&[3.0, 1.0], 2).unwrap();
        assert_eq!(all.expected_discrepancy, Some(0.0));
    }

    #[test]
    fn rejects_bad_n_and_spectra() {
        assert!(marginals(&[1.0, 0.5], 0).is_err());
        assert!(marginals(&[1.0, 0.5], 3).is_err());
        assert!(marginals(&[0.5, 1.0], 1).is_err());
        assert!(marginals(&[1e200, 1e200], 1).is_err());
    }

    #[test]
    fn negligible_values_become_zero() {
        let (values, rank) = effective_spectrum(&[1.0, 1e-100, 1e-200, 0.0]);
        assert_eq!(values, vec![1.0, 1e-100, 0.0, 0.0]);
        assert_eq!(rank, 2);
        assert_eq!(effective_spectrum(&[0.0, 0.0]).1, 0);
    }
}
