//! FESC, the one-shot weighting of Garin, Evgeniou & Vayatis (docs/algorithms.md §3): choose convex
//! weights `w` for the local estimators `θ̂_i` that minimise the bias–variance bound
//! `Σ a_i w_i² + b_i w_i` of the aggregate `Σ w_i θ̂_i`.
//!
//! [`water_filling`] solves the generic problem (Proposition 3.4, §3.1) for any `a_i > 0` and
//! finite `b_i`; [`fesc_weights`] is its specialisation to sample sizes (§3.2), where
//! `a_i = 1/n_i`, `b_i = 1/n_i²`, so only the `K` largest nodes get a positive weight.

use crate::{Result, StrategyError};

/// The solution of `min Σ a_i w_i² + b_i w_i` s.t. `w ≥ 0`, `Σ w = 1` (docs/algorithms.md §3.1).
#[derive(Debug, Clone, PartialEq)]
pub struct WaterFilling {
    /// `w_i`, in input order; non-negative and summing to 1.
    pub weights: Vec<f64>,
    /// The water level `ν = ν_K`: every active node has `2 a_i w_i + b_i = ν`, every inactive
    /// node has `b_i ≥ ν` (the KKT conditions of the problem).
    pub nu: f64,
    /// `K`, the number of nodes with a positive weight (always ≥ 1).
    pub active: usize,
}

/// Generic water-filling, Proposition 3.4 (docs/algorithms.md §3.1).
///
/// Sorts the nodes by `b` ascending (stable, so ties keep their input order), computes for every
/// prefix `k` the level `ν_k = (2 + Σ_{j≤k} b_(j)/a_(j)) / Σ_{j≤k} 1/a_(j)`, takes
/// `K = max{k : b_(k) ≤ ν_k}` and `w_(i) = (ν_K − b_(i)) / (2 a_(i))` for `i ≤ K`, 0 otherwise.
/// `K` is the largest qualifying prefix rather than the first failure of a scan: the two agree in
/// exact arithmetic (the qualifying set is always `{1..K}`), and the maximum is the spec's
/// definition (§3.5: "`K = argmax`" means the largest k).
///
/// Errors when the inputs are empty, of different lengths, `a_i` is not finite and positive, or
/// `b_i` is not finite.
pub fn water_filling(a: &[f64], b: &[f64]) -> Result<WaterFilling> {
    if a.is_empty() {
        return Err(StrategyError::invalid("water-filling input", "no nodes"));
    }
    if a.len() != b.len() {
        return Err(StrategyError::invalid(
            "water-filling input",
            format!("{} variances `a` but {} biases `b`", a.len(), b.len()),
        ));
    }
    if let Some((i, v)) = a
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite() || **v <= 0.0)
    {
        return Err(StrategyError::invalid(
            "water-filling variance `a`",
            format!("entry {i} is {v}; Proposition 3.4 needs every a_i finite and > 0"),
        ));
    }
    if let Some((i, v)) = b.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(StrategyError::invalid(
            "water-filling bias `b`",
            format!("entry {i} is {v}; it must be finite"),
        ));
    }

    let mut order: Vec<usize> = (0..a.len()).collect();
    order.sort_by(|&i, &j| b[i].total_cmp(&b[j]));

    let mut sum_b_over_a = 0.0;
    let mut sum_inv_a = 0.0;
    let mut active = 0;
    let mut nu = f64::NAN;
    for (k, &i) in order.iter().enumerate() {
        sum_b_over_a += b[i] / a[i];
        sum_inv_a += 1.0 / a[i];
        let nu_k = (2.0 + sum_b_over_a) / sum_inv_a;
        if b[i] <= nu_k {
            active = k + 1;
            nu = nu_k;
        }
    }
    // k = 1 always qualifies (ν_1 = b_(1) + 2 a_(1) > b_(1)), so `active ≥ 1` and `nu` is set.
    let mut weights = vec![0.0; a.len()];
    for &i in &order[..active] {
        weights[i] = ((nu - b[i]) / (2.0 * a[i])).max(0.0);
    }
    Ok(WaterFilling {
        weights,
        nu,
        active,
    })
}

/// FESC weights from the local sample sizes, docs/algorithms.md §3.2: water-filling with
/// `a_i = 1/n_i` (variance of a local estimator ∝ 1/n) and `b_i = 1/n_i²` (its squared bias
/// ∝ 1/n²). Sorting by `b` ascending is sorting by `n` descending, so the active nodes are exactly
/// the `K` largest ones and `w_(i) = n_(i) ν_K / 2 − 1/(2 n_(i))`. Weights are in input order.
///
/// Errors unless every size is finite and positive.
pub fn fesc_weights(sizes: &[f64]) -> Result<WaterFilling> {
    if let Some((i, n)) = sizes
        .iter()
        .enumerate()
        .find(|(_, n)| !n.is_finite() || **n <= 0.0)
    {
        return Err(StrategyError::invalid(
            "sample size",
            format!("node {i} has {n} samples; FESC needs finite positive sizes"),
        ));
    }
    let a: Vec<f64> = sizes.iter().map(|n| 1.0 / n).collect();
    let b: Vec<f64> = sizes.iter().map(|n| 1.0 / (n * n)).collect();
    water_filling(&a, &b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_sizes_get_equal_weights() {
        let w = fesc_weights(&[10.0; 4]).unwrap();
        assert_eq!(w.active, 4);
        for x in w.weights {
            assert!((x - 0.25).abs() < 1e-15);
        }
    }

    #[test]
    fn single_node_gets_everything() {
        let w = water_filling(&[3.0], &[7.0]).unwrap();
        assert!((w.weights[0] - 1.0).abs() < 1e-15);
        assert_eq!(w.active, 1);
        // ν_1 = b + 2a.
        assert!((w.nu - 13.0).abs() < 1e-12);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(water_filling(&[], &[]).is_err());
        assert!(water_filling(&[1.0], &[1.0, 2.0]).is_err());
        assert!(water_filling(&[0.0], &[1.0]).is_err());
        assert!(water_filling(&[1.0], &[f64::NAN]).is_err());
        assert!(fesc_weights(&[1.0, 0.0]).is_err());
    }
}
