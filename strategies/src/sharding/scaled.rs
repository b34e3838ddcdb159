//! The "+Scaled" modifier (docs/algorithms.md §1.4, paper §4): every selected term of a client gets
//! the same multiplier `ω = √(Σ_all λ² / Σ_{i∈I} λ²)`, so `‖Ŵ‖_F = ‖W‖_F` at send time. Applied
//! to Top-n or to a PriSM draw.

use super::Marginals;
use super::top_n::{check_layer, indicator};
use crate::Result;

/// `ω = √(Σ_{k=1..N} λ_k² / Σ_{k∈I} λ_k²)` (docs/algorithms.md §1.4), the norm-preserving multiplier
/// of index set `indices` (0-based positions in `spectrum`, expected distinct).
///
/// Defined as `1.0` when the selected terms carry no energy (`Σ_{k∈I} λ_k² = 0`, including an
/// all-zero spectrum or an empty `I`) or so little that the ratio is not representable: scaling
/// zero terms cannot restore the norm, and 1 leaves them as they are.
///
/// # Panics
/// If an index is `≥ N`.
pub fn multiplier(spectrum: &[f64], indices: &[usize]) -> f64 {
    // Divide by the largest value first so neither sum under- or overflows needlessly.
    let scale = spectrum.iter().fold(0.0_f64, |m, &l| m.max(l.abs()));
    if !(scale > 0.0 && scale.is_finite()) {
        return 1.0;
    }
    let total: f64 = spectrum.iter().map(|l| (l / scale).powi(2)).sum();
    let selected: f64 = indices.iter().map(|&i| (spectrum[i] / scale).powi(2)).sum();
    let omega = (total / selected).sqrt();
    if selected > 0.0 && omega.is_finite() {
        omega
    } else {
        1.0
    }
}

/// Top-n + Scaled (docs/algorithms.md §1.4): `π = 1{i ≤ n}`, `ω_i = ω` of [`multiplier`] for
/// `I = {1..n}` on the kept terms (0 on the others, never sent). Expected (= deterministic)
/// discrepancy `Σ_{i>n} λ_i² + (ω − 1)² Σ_{i≤n} λ_i²`, the orthogonal-terms identity of
/// [`crate::metrics::realised_discrepancy`].
///
/// Errors unless the spectrum is valid and `1 ≤ n ≤ N`.
pub fn top_n_marginals(spectrum: &[f64], n: usize) -> Result<Marginals> {
    check_layer(spectrum, n)?;
    let head: Vec<usize> = (0..n).collect();
    let omega = multiplier(spectrum, &head);
    let mut m = indicator(spectrum, n);
    for w in &mut m.multipliers[..n] {
        *w = omega;
    }
    let kept: f64 = spectrum[..n].iter().map(|l| l * l).sum();
    let dropped: f64 = spectrum[n..].iter().map(|l| l * l).sum();
    m.expected_discrepancy = Some(dropped + (omega - 1.0).powi(2) * kept);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [f64; 6] = [10.0, 5.0, 3.0, 2.0, 1.0, 0.5];

    #[test]
    fn oracle_of_section_1_4() {
        // λ = A, I = {1, 3} (1-based) → ω = √(139.25 / 109) = 1.130276.
        assert!((multiplier(&A, &[0, 2]) - 1.130276).abs() < 1e-6);
        assert!((multiplier(&A, &[0, 2]) - (139.25_f64 / 109.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn zero_energy_cases_are_one() {
        assert_eq!(multiplier(&[0.0, 0.0], &[0]), 1.0);
        assert_eq!(multiplier(&[1.0, 0.0], &[1]), 1.0);
        assert_eq!(multiplier(&[1.0, 0.0], &[]), 1.0);
        assert_eq!(multiplier(&[2.0, 1.0], &[0, 1]), 1.0);
    }

    #[test]
    fn top_n_scaled_preserves_the_norm() {
        // n = 2: ω = √(139.25/125); ‖Ŵ‖² = ω² · 125 = 139.25.
        let m = top_n_marginals(&A, 2).unwrap();
        let omega = (139.25_f64 / 125.0).sqrt();
        assert!((m.multipliers[0] - omega).abs() < 1e-12);
        assert_eq!(m.multipliers[2], 0.0);
        let expected = 14.25 + (omega - 1.0).powi(2) * 125.0;
        assert!((m.expected_discrepancy.unwrap() - expected).abs() < 1e-12);
        assert!(top_n_marginals(&A, 0).is_err());
    }
}
