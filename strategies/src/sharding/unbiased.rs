//! The Unbiased strategy (docs/algorithms.md §1.2; paper Theorem 3.1, Algorithm 1).
//!
//! With Horvitz–Thompson multipliers `ω_i = 1/π_i` the estimator `Ŵ = Σ_{i∈I} ω_i λ_i u_i v_iᵀ`
//! is unbiased and `E‖W − Ŵ‖²_F = Σ λ_i² (1/π_i − 1)` (Eq. 4). Minimising it subject to
//! `Σπ = n`, `0 ≤ π ≤ 1` gives the water-filling `π_i = min(1, λ_i / s)`.

use super::Marginals;
use super::top_n::{NEGLIGIBLE_RATIO, check_layer, effective_spectrum};
use crate::Result;

/// Inclusion probabilities, HT multipliers and the minimal Eq. 4 error of the Unbiased strategy
/// (docs/algorithms.md §1.2).
///
/// With `Λ_t = Σ_{l>t} λ_l` (1-based), `t* = min{t < n : λ_{t+1} < Λ_t/(n − t)}` (the smallest
/// feasible `t`; the paper's sweep over all feasible `t` picks the same one), then `π_i = 1` for
/// `i ≤ t*` and `π_i = (n − t*) λ_i / Λ_{t*}` after, `ω_i = 1/π_i`, and the error is the closed
/// form `E* = Λ_{t*}²/(n − t*) − Σ_{i>t*} λ_i²`.
///
/// Edge cases (§1.2), all with finite outputs:
/// * `n = N`: `π = ω = 1`, error 0.
/// * Zero singular values (and values `≤ λ_1·1e-150`, treated as zero) get `π = 0`, `ω = 0`.
/// * Numerical rank `r ≤ n` (no feasible `t`; the paper's Algorithm 1 assumes `λ_{n+1} > 0`):
///   `π = 1` on the `r` positive values and the remaining `n − r` slots are spread uniformly over
///   the `N − r` zero values, `π = (n − r)/(N − r)`, with `ω = 1/π` there (they contribute
///   nothing to `Ŵ`); error 0.
///
/// Errors unless the spectrum is valid and `1 ≤ n ≤ N`.
pub fn marginals(spectrum: &[f64], n: usize) -> Result<Marginals> {
    check_layer(spectrum, n)?;
    let big_n = spectrum.len();
    if n == big_n {
        return Ok(Marginals {
            inclusion_probabilities: vec![1.0; big_n],
            multipliers: vec![1.0; big_n],
            expected_discrepancy: Some(0.0),
        });
    }
    let (lambda, rank) = effective_spectrum(spectrum);
    if rank <= n {
        let fill = (n - rank) as f64 / (big_n - rank) as f64;
        let pi: Vec<f64> = (0..big_n)
            .map(|i| if i < rank { 1.0 } else { fill })
            .collect();
        let omega = pi
            .iter()
            .map(|&p| if p > 0.0 { 1.0 / p } else { 0.0 })
            .collect();
        return Ok(Marginals {
            inclusion_probabilities: pi,
            multipliers: omega,
            expected_discrepancy: Some(0.0),
        });
    }
    // tail[t] = Λ_t = Σ_{l ≥ t} λ_l (0-based), summed from the small end for accuracy.
    let mut tail = vec![0.0; big_n + 1];
    for i in (0..big_n).rev() {
        tail[i] = tail[i + 1] + lambda[i];
    }
    // λ_{n+1} > 0 makes t = n − 1 feasible in exact arithmetic; it is the fallback when
    // rounding (λ_{n+1} ≪ λ_n) hides that.
    let t = (0..n)
        .find(|&t| lambda[t] < tail[t] / (n - t) as f64)
        .unwrap_or(n - 1);
    let level = tail[t] / (n - t) as f64; // λ_i / π_i for i > t*
    let pi: Vec<f64> = lambda
        .iter()
        .enumerate()
        .map(|(i, &l)| if i < t { 1.0 } else { (l / level).min(1.0) })
        .collect();
    let omega: Vec<f64> = pi
        .iter()
        .map(|&p| if p > 0.0 { 1.0 / p } else { 0.0 })
        .collect();
    let squares_after: f64 = lambda[t..].iter().map(|l| l * l).sum();
    let error = (tail[t] * tail[t] / (n - t) as f64 - squares_after).max(0.0);
    Ok(Marginals {
        inclusion_probabilities: pi,
        multipliers: omega,
        expected_discrepancy: Some(error),
    })
}

/// Eq. 4: `E‖W − Ŵ‖²_F = Σ_i λ_i² (1/π_i − 1)` for any `π` with HT multipliers `ω = 1/π`
/// (docs/algorithms.md §1.2), the objective the Unbiased strategy minimises.
///
/// Terms with `λ_i = 0` (or `≤ λ_1·1e-150`, the strategies' zero rule) contribute 0 whatever
/// their `π_i`. A term with `λ_i > 0` but `π_i = 0` is never sent, so no unbiased estimator
/// exists: the result is `+∞` in that case (the only non-finite output).
///
/// # Panics
/// If `spectrum` and `pi` differ in length.
pub fn discrepancy(spectrum: &[f64], pi: &[f64]) -> f64 {
    assert_eq!(spectrum.len(), pi.len(), "one probability per term");
    let floor = spectrum.iter().fold(0.0_f64, |m, &l| m.max(l)) * NEGLIGIBLE_RATIO;
    spectrum
        .iter()
        .zip(pi)
        .map(|(&l, &p)| {
            if l <= floor {
                0.0
            } else if p > 0.0 {
                l * l * (1.0 / p - 1.0)
            } else {
                f64::INFINITY
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_equal_to_rank_fills_nothing() {
        // Rank 2 = n: the positives are certain, zeros never drawn, error 0.
        let m = marginals(&[3.0, 1.0, 0.0, 0.0], 2).unwrap();
        assert_eq!(m.inclusion_probabilities, vec![1.0, 1.0, 0.0, 0.0]);
        assert_eq!(m.multipliers, vec![1.0, 1.0, 0.0, 0.0]);
        assert_eq!(m.expected_discrepancy, Some(0.0));
    }

    #[test]
    fn rank_below_n_spreads_the_rest_over_zeros() {
        // Rank 1, n = 2, N = 4: one slot left for three zero terms → π = 1/3 each.
        let m = marginals(&[3.0, 0.0, 0.0, 0.0], 2).unwrap();
        let third = 1.0 / 3.0;
        assert_eq!(m.inclusion_probabilities, vec![1.0, third, third, third]);
        assert!((m.multipliers[1] - 3.0).abs() < 1e-12);
        assert_eq!(m.expected_discrepancy, Some(0.0));
        // All-zero spectrum: uniform n/N.
        let m = marginals(&[0.0; 4], 1).unwrap();
        assert_eq!(m.inclusion_probabilities, vec![0.25; 4]);
    }

    #[test]
    fn zero_values_are_never_sampled_when_rank_exceeds_n() {
        let m = marginals(&[4.0, 2.0, 2.0, 0.0], 1).unwrap();
        assert_eq!(m.inclusion_probabilities, vec![0.5, 0.25, 0.25, 0.0]);
        assert_eq!(m.multipliers, vec![2.0, 4.0, 4.0, 0.0]);
        // Eq. 4: 16·1 + 4·3 + 4·3 = 40 = Λ²/1 − Σλ² = 64 − 24.
        assert_eq!(m.expected_discrepancy, Some(40.0));
        assert_eq!(
            discrepancy(&[4.0, 2.0, 2.0, 0.0], &m.inclusion_probabilities),
            40.0
        );
    }

    #[test]
    fn tiny_tail_stays_finite() {
        // λ_{n+1} so small that Λ_{n−1} rounds to λ_n: the fallback t = n − 1 still applies.
        let m = marginals(&[1.0, 1e-20, 1e-140], 1).unwrap();
        assert!(m.multipliers.iter().all(|w| w.is_finite()));
        let sum: f64 = m.inclusion_probabilities.iter().sum();
        assert!((sum - 1.0).abs() < 1e-12);
        let m = marginals(&[1.0, 1e-200], 1).unwrap();
        assert_eq!(m.inclusion_probabilities, vec![1.0, 0.0]);
    }

    #[test]
    fn discrepancy_edge_cases() {
        assert_eq!(discrepancy(&[1.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(discrepancy(&[1.0, 1.0], &[1.0, 0.0]), f64::INFINITY);
    }
}
