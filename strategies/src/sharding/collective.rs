//! The Collective strategy (docs/algorithms.md §1.3; paper Theorem 3.2, Algorithm 2, corrected).
//!
//! `C` clients of one group each receive an i.i.d. sample from the same design; the server's
//! target is the average `W̄ = (1/C) Σ_c Ŵ^(c)`. Its expected error is Eq. 7,
//! `Σλ² + Σ λ_i² ω_i π_i (−2 + ω_i/C + ω_i π_i (C−1)/C)`; the optimal multiplier for a given
//! `π_i > 0` is `ω_i = C / (1 + (C−1) π_i)`, and the optimal `π` is the KKT solution
//! `π_i = clip((√C λ_i/s − 1)/(C − 1), 0, 1)` with the scalar `s > 0` fixed by `Σπ = n`: ones
//! on the first `t` terms, `u` interior values, zeros after.

use super::Marginals;
use super::top_n::{check_layer, effective_spectrum, indicator};
use crate::{Result, StrategyError};

/// Optimal inclusion probabilities and multipliers of the Collective strategy for a group of
/// `clients` (docs/algorithms.md §1.3), with `expected_discrepancy = Σλ² + E(t,u)` (Eq. 7 at the
/// optimum).
///
/// Top-n (`π = ω = 1{i ≤ n}`) when `C = 1`, `n = N`, the numerical rank is `≤ n`, or
/// `λ_n ≥ C λ_{n+1}` (the corrected criterion of §1.3: then no interior candidate satisfies
/// F1–F4). Otherwise `s` is located exactly: `f(s) = Σ_i clip(…)` is continuous, decreasing and
/// piecewise of the form `t + (√C S/s − u)/(C − 1)` between the breakpoints `λ_i/√C`, `√C λ_i`;
/// a binary search over the sorted breakpoints finds the piece where `f` crosses `n`
/// (O(N log N)), its `(t, u)` label, and then the closed form
/// `s = √C S_tu / ((n − t)(C − 1) + u)` of §1.3. Boundary (`*`) cases have several labels with
/// the same `π`; any of them is returned.
///
/// Terms with `π = 0` get `ω = 0` (never sent). Values `≤ λ_1·1e-150` count as zero.
///
/// Errors unless the spectrum is valid, `1 ≤ n ≤ N` and `clients ≥ 1`.
pub fn marginals(spectrum: &[f64], n: usize, clients: usize) -> Result<Marginals> {
    check_layer(spectrum, n)?;
    check_clients(clients)?;
    let (lambda, rank) = effective_spectrum(spectrum);
    let c = clients as f64;
    if clients == 1 || n == spectrum.len() || rank <= n || lambda[n - 1] >= c * lambda[n] {
        return Ok(indicator(spectrum, n));
    }
    let root_c = c.sqrt();
    let mut breakpoints: Vec<f64> = lambda[..rank]
        .iter()
        .flat_map(|&l| [l / root_c, l * root_c])
        .collect();
    breakpoints.sort_by(f64::total_cmp);
    breakpoints.dedup();
    let mass = |s: f64| -> f64 {
        lambda[..rank]
            .iter()
            .map(|&l| ((root_c * l / s - 1.0) / (c - 1.0)).clamp(0.0, 1.0))
            .sum()
    };
    // f(first) = rank > n (every positive term certain), f(last) = 0 < n.
    let (mut lo, mut hi) = (0, breakpoints.len() - 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if mass(breakpoints[mid]) >= n as f64 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let inside = 0.5 * (breakpoints[lo] + breakpoints[hi]);
    let ones = lambda.iter().take_while(|&&l| l >= root_c * inside).count();
    let support = lambda.iter().take_while(|&&l| l > inside / root_c).count();
    if ones >= n || support <= ones {
        // Only reachable through rounding at a top-n boundary.
        return Ok(indicator(spectrum, n));
    }
    Ok(candidate(spectrum, &lambda, n, c, ones, support - ones))
}

/// The reference O(N n) sweep of docs/algorithms.md §1.3 (paper Algorithm 2 with the corrected
/// criterion sign and `λ_0 = +∞`): start from top-n with `E = −Σ_{i≤n} λ_i²`, evaluate every
/// `(t, u)` with `0 ≤ t < n`, `n − t + 1 ≤ u ≤ N − t` that satisfies F1 and F2 (all interior
/// `π` in (0, 1), so the candidate is feasible and `E(t,u)` is its Eq. 7 value) and keep the
/// smallest `E(t,u)`. Kept as the cross-check of [`marginals`]; same edge cases and errors.
pub fn marginals_by_sweep(spectrum: &[f64], n: usize, clients: usize) -> Result<Marginals> {
    check_layer(spectrum, n)?;
    check_clients(clients)?;
    let big_n = spectrum.len();
    if clients == 1 || n == big_n {
        return Ok(indicator(spectrum, n));
    }
    let (lambda, _) = effective_spectrum(spectrum);
    let c = clients as f64;
    let root_c = c.sqrt();
    let mut sums = vec![0.0; big_n + 1];
    let mut squares = vec![0.0; big_n + 1];
    for (i, &l) in lambda.iter().enumerate() {
        sums[i + 1] = sums[i] + l;
        squares[i + 1] = squares[i] + l * l;
    }
    let mut best_criterion = -squares[n];
    let mut best = None;
    for t in 0..n {
        for u in (n - t + 1)..=(big_n - t) {
            let total = sums[t + u] - sums[t];
            let s = root_c * total / ((n - t) as f64 * (c - 1.0) + u as f64);
            let f1 = lambda[t] < root_c * s;
            let f2 = lambda[t + u - 1] > s / root_c;
            if !(f1 && f2) {
                continue;
            }
            let criterion =
                -squares[t] - c / (c - 1.0) * ((squares[t + u] - squares[t]) - s / root_c * total);
            if criterion < best_criterion {
                best_criterion = criterion;
                best = Some((t, u));
            }
        }
    }
    Ok(match best {
        Some((t, u)) => candidate(spectrum, &lambda, n, c, t, u),
        None => indicator(spectrum, n),
    })
}

/// The closed form of docs/algorithms.md §1.3 for a given `(t, u)` with `u ≥ 1`, `C ≥ 2`:
/// `s = √C S_tu / ((n − t)(C − 1) + u)`, `π_i = (√C λ_i/s − 1)/(C − 1)` on the interior
/// (clamped to [0, 1] against rounding), `ω_i = C/(1 + (C − 1)π_i)` (= `√C s/λ_i` in exact
/// arithmetic; written from `π` so it stays the optimal multiplier of the returned `π`),
/// expected discrepancy `Σλ² + E(t,u)` with
/// `E(t,u) = −Σ_{i≤t} λ_i² − C/(C−1) Σ_{interior} λ_i (λ_i − s/√C)`.
fn candidate(spectrum: &[f64], lambda: &[f64], n: usize, c: f64, t: usize, u: usize) -> Marginals {
    let root_c = c.sqrt();
    let interior = &lambda[t..t + u];
    let total: f64 = interior.iter().sum();
    let s = root_c * total / ((n - t) as f64 * (c - 1.0) + u as f64);
    let pi: Vec<f64> = lambda
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            if i < t {
                1.0
            } else if i < t + u {
                ((root_c * l / s - 1.0) / (c - 1.0)).clamp(0.0, 1.0)
            } else {
                0.0
            }
        })
        .collect();
    let omega = pi
        .iter()
        .map(|&p| {
            if p > 0.0 {
                c / (1.0 + (c - 1.0) * p)
            } else {
                0.0
            }
        })
        .collect();
    let head: f64 = lambda[..t].iter().map(|l| l * l).sum();
    let gain: f64 = interior.iter().map(|&l| l * (l - s / root_c)).sum();
    let criterion = -head - c / (c - 1.0) * gain;
    let energy: f64 = spectrum.iter().map(|l| l * l).sum();
    Marginals {
        inclusion_probabilities: pi,
        multipliers: omega,
        expected_discrepancy: Some((energy + criterion).max(0.0)),
    }
}

/// Eq. 7 minus the constant `Σλ²` (docs/algorithms.md §1.3): the collective criterion
/// `Σ_i λ_i² ω_i π_i (−2 + ω_i/C + ω_i π_i (C − 1)/C)` for any `(π, ω)` and group size `C`
/// (`C = 1`: the single-client error of fixed multipliers). `clients = 0` is treated as 1.
///
/// # Panics
/// If `spectrum`, `pi` and `omega` differ in length.
pub fn criterion(spectrum: &[f64], pi: &[f64], omega: &[f64], clients: usize) -> f64 {
    assert_eq!(spectrum.len(), pi.len(), "one probability per term");
    assert_eq!(spectrum.len(), omega.len(), "one multiplier per term");
    let c = clients.max(1) as f64;
    spectrum
        .iter()
        .zip(pi)
        .zip(omega)
        .map(|((&l, &p), &w)| l * l * w * p * (-2.0 + w / c + w * p * (c - 1.0) / c))
        .sum()
}

fn check_clients(clients: usize) -> Result<()> {
    if clients == 0 {
        return Err(StrategyError::invalid(
            "clients",
            "a group needs at least one client (C ≥ 1)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_client_and_full_rank_are_top_n() {
        let a = [10.0, 5.0, 3.0, 2.0, 1.0, 0.5];
        let m = marginals(&a, 2, 1).unwrap();
        assert_eq!(
            m.inclusion_probabilities,
            vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        );
        let m = marginals(&a, 6, 7).unwrap();
        assert_eq!(m.multipliers, vec![1.0; 6]);
        assert_eq!(m.expected_discrepancy, Some(0.0));
        assert!(marginals(&a, 2, 0).is_err());
        assert!(marginals_by_sweep(&a, 0, 2).is_err());
    }

    #[test]
    fn zeros_are_never_sent() {
        // Rank 2 ≤ n = 2: top-n, error 0.
        let m = marginals(&[2.0, 1.0, 0.0, 0.0], 2, 5).unwrap();
        assert_eq!(m.inclusion_probabilities, vec![1.0, 1.0, 0.0, 0.0]);
        // Rank 3 > n = 1: the zero stays out, π sums to 1.
        let m = marginals(&[2.0, 1.5, 1.0, 0.0], 1, 5).unwrap();
        assert_eq!(m.inclusion_probabilities[3], 0.0);
        assert_eq!(m.multipliers[3], 0.0);
        assert!((m.inclusion_probabilities.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn ties_get_equal_probabilities() {
        let m = marginals(&[1.0; 5], 2, 3).unwrap();
        assert!(
            m.inclusion_probabilities
                .iter()
                .all(|p| (p - 0.4).abs() < 1e-12)
        );
        let w = 3.0 / (1.0 + 2.0 * 0.4);
        assert!(m.multipliers.iter().all(|x| (x - w).abs() < 1e-12));
    }
}
