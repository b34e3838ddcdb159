//! The PriSM baseline and its "+Wallenius" variant (docs/algorithms.md §1.5).
//!
//! PriSM draws `n` distinct terms with NumPy's `choice(N, n, replace=False, p)` and selection
//! weights `p_i ∝ λ_i^k`; that draw lives in `sampling`. Its marginal inclusion probabilities
//! have no closed form, so wherever a `π` is needed (ANME §1.9, and the multipliers `ω = 1/π` of
//! PriSM + Wallenius) this module uses Fog's Wallenius approximation with odds `λ_i^k`
//! ([`super::wallenius::mean_inclusion`]). It only approximates NumPy's frequencies
//! (0.9894 vs 0.9736 for the top term in docs/algorithms.md's check).

use super::Marginals;
use super::top_n::check_layer;
use super::wallenius::mean_inclusion;
use crate::Result;
use crate::spectrum::kept_terms;

/// PriSM's sharpness exponent `k` (docs/algorithms.md §1.5, from the PriSM run scripts):
/// 4 for keep ratios `r ≤ 0.2`, else 2.5.
pub fn exponent(keep_ratio: f64) -> f64 {
    if keep_ratio <= 0.2 { 4.0 } else { 2.5 }
}

/// PriSM's selection weights `p_i = λ_i^k / Σ_j λ_j^k` (docs/algorithms.md §1.5), the `p` given to
/// NumPy-style `choice`. Computed as `(λ_i/λ_1)^k` normalised so large spectra do not overflow.
///
/// An all-zero spectrum gives the uniform `1/N`; an empty one an empty vector. Expects a spectrum
/// accepted by [`crate::spectrum::check_sorted`]; negative or non-finite values count as 0.
pub fn selection_weights(spectrum: &[f64], exponent: f64) -> Vec<f64> {
    let odds = relative_odds(spectrum, exponent);
    let total: f64 = odds.iter().sum();
    if total > 0.0 {
        odds.iter().map(|w| w / total).collect()
    } else {
        vec![1.0 / spectrum.len() as f64; spectrum.len()]
    }
}

/// `(λ_i / λ_max)^k ∈ [0, 1]`, with negative or non-finite values as 0.
fn relative_odds(spectrum: &[f64], exponent: f64) -> Vec<f64> {
    let clean = |l: f64| if l.is_finite() && l > 0.0 { l } else { 0.0 };
    let largest = spectrum.iter().fold(0.0_f64, |m, &l| m.max(clean(l)));
    if largest == 0.0 {
        return vec![0.0; spectrum.len()];
    }
    spectrum
        .iter()
        .map(|&l| (clean(l) / largest).powf(exponent))
        .collect()
}

/// PriSM marginals (docs/algorithms.md §1.5, §1.9): `π` = Fog's Wallenius mean with odds `λ^k`,
/// `k = exponent(keep_ratio)`, and `ω = 1` on every term (PriSM trains the drawn terms as they
/// are). No closed-form discrepancy (`None`).
///
/// `π` is the Wallenius *approximation* of the inclusion probabilities, used for ANME; the actual
/// draw is NumPy-style `choice` with [`selection_weights`], not a design with these marginals.
///
/// Errors unless the spectrum is valid, `1 ≤ n ≤ N` and `keep_ratio ∈ (0, 1]`.
pub fn marginals(spectrum: &[f64], n: usize, keep_ratio: f64) -> Result<Marginals> {
    let pi = wallenius_pi(spectrum, n, keep_ratio)?;
    Ok(Marginals {
        multipliers: vec![1.0; pi.len()],
        inclusion_probabilities: pi,
        expected_discrepancy: None,
    })
}

/// PriSM + Wallenius marginals (docs/algorithms.md §1.5; paper §4): the same `π` as [`marginals`]
/// with approximately-unbiased multipliers `ω_i = 1/π_i` (0 where `π_i = 0`, never sent).
/// No closed-form discrepancy (`None`): `π` only approximates the real draw.
///
/// Errors unless the spectrum is valid, `1 ≤ n ≤ N` and `keep_ratio ∈ (0, 1]`.
pub fn wallenius_marginals(spectrum: &[f64], n: usize, keep_ratio: f64) -> Result<Marginals> {
    let pi = wallenius_pi(spectrum, n, keep_ratio)?;
    Ok(Marginals {
        multipliers: pi
            .iter()
            .map(|&p| if p > 0.0 { 1.0 / p } else { 0.0 })
            .collect(),
        inclusion_probabilities: pi,
        expected_discrepancy: None,
    })
}

fn wallenius_pi(spectrum: &[f64], n: usize, keep_ratio: f64) -> Result<Vec<f64>> {
    check_layer(spectrum, n)?;
    kept_terms(spectrum.len(), keep_ratio)?; // validates keep_ratio ∈ (0, 1], rejects NaN
    mean_inclusion(&relative_odds(spectrum, exponent(keep_ratio)), n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponent_follows_the_run_scripts() {
        assert_eq!(exponent(0.1), 4.0);
        assert_eq!(exponent(0.2), 4.0);
        assert_eq!(exponent(0.4), 2.5);
        assert_eq!(exponent(0.8), 2.5);
    }

    #[test]
    fn zero_spectrum_is_uniform() {
        assert_eq!(selection_weights(&[0.0; 4], 4.0), vec![0.25; 4]);
        assert!(selection_weights(&[], 4.0).is_empty());
        assert_eq!(selection_weights(&[2.0, 0.0], 2.5), vec![1.0, 0.0]);
    }

    #[test]
    fn wallenius_multipliers_invert_pi() {
        let m = wallenius_marginals(&[4.0, 2.0, 1.0, 0.0], 2, 0.5).unwrap();
        assert_eq!(m.inclusion_probabilities[3], 0.0);
        assert_eq!(m.multipliers[3], 0.0);
        for (p, w) in m.inclusion_probabilities[..3].iter().zip(&m.multipliers) {
            assert!((p * w - 1.0).abs() < 1e-12);
        }
        let plain = marginals(&[4.0, 2.0, 1.0, 0.0], 2, 0.5).unwrap();
        assert_eq!(plain.multipliers, vec![1.0; 4]);
        assert!(marginals(&[4.0, 2.0], 1, 0.0).is_err());
        assert!(marginals(&[4.0, 2.0], 1, f64::NAN).is_err());
    }
}
