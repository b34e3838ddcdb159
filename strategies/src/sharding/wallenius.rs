//! Fog's approximation of the mean of the multivariate Wallenius noncentral hypergeometric
//! distribution with one ball per colour (docs/algorithms.md §1.5, "PriSM + Wallenius"; BiasedUrn's
//! `meanMWNCHypergeo` approximation branch).
//!
//! Drawing `n` of `N` balls one at a time with odds `w_i` includes ball i with probability
//! approximately `π_i = 1 − θ^{w_i}`, where `θ ∈ (0, 1)` solves `Σ_i (1 − θ^{w_i}) = n`. The
//! paper uses it as a stand-in for the (closed-form-less) inclusion probabilities of PriSM's
//! NumPy `choice` draw.

use crate::{Result, StrategyError};

/// Probabilities below this are returned as 0: such a term is never drawn in practice and its
/// multiplier `1/π` would otherwise overflow.
const PROBABILITY_FLOOR: f64 = 1e-300;
/// Tolerance on `|Σπ − n|` (docs/algorithms.md §1.5: 1e-12 instead of R's 1e-5).
const TOLERANCE: f64 = 1e-12;
const MAX_ITERATIONS: usize = 500;

/// Fog's approximate Wallenius mean `π_i = 1 − e^{−x w'_i}` with `Σ π_i = n` (docs/algorithms.md
/// §1.5 step 2–3, written with `x = −t > 0` and odds normalised by their maximum, which only
/// rescales `x`).
///
/// `x` is found by Newton's method on the increasing concave `g(x) = Σ(1 − e^{−x w'_i})`,
/// safeguarded by a bisection bracket (geometric once the bracket is positive, since `x` can
/// span hundreds of orders of magnitude), to `|g − n| ≤ 1e-12·max(1, n)` or a collapsed bracket.
///
/// Edge cases: zero odds (also odds so small relative to the largest that they underflow) get
/// `π = 0`. If `n` is at least the number `P` of positive odds, the positive terms get `π = 1`
/// and the remaining mass `n − P` is spread uniformly over the zero-odds terms,
/// `π = (n − P)/(N − P)` (the urn must still return `n` balls); in particular `n = N` gives all
/// ones. Probabilities below `1e-300` are returned as 0.
///
/// Errors if `odds` is empty or has a negative or non-finite entry, unless `1 ≤ n ≤ N`, or if
/// the solver fails to converge.
pub fn mean_inclusion(odds: &[f64], n: usize) -> Result<Vec<f64>> {
    if odds.is_empty() {
        return Err(StrategyError::invalid("odds", "they are empty"));
    }
    if let Some((i, w)) = odds
        .iter()
        .enumerate()
        .find(|(_, w)| !w.is_finite() || **w < 0.0)
    {
        return Err(StrategyError::invalid(
            "odds",
            format!("odds {i} is {w}; odds must be finite and non-negative"),
        ));
    }
    if n == 0 {
        return Err(StrategyError::invalid("n", "n must be ≥ 1"));
    }
    let big_n = odds.len();
    if n > big_n {
        return Err(StrategyError::invalid(
            "n",
            format!("n = {n} exceeds the number of balls N = {big_n}; n must be ≤ N"),
        ));
    }
    let largest = odds.iter().fold(0.0_f64, |m, &w| m.max(w));
    let weights: Vec<f64> = if largest > 0.0 {
        odds.iter().map(|w| w / largest).collect()
    } else {
        vec![0.0; big_n]
    };
    let positive = weights.iter().filter(|&&w| w > 0.0).count();
    if n >= positive {
        let fill = if big_n > positive {
            (n - positive) as f64 / (big_n - positive) as f64
        } else {
            0.0
        };
        return Ok(weights
            .iter()
            .map(|&w| if w > 0.0 { 1.0 } else { fill })
            .collect());
    }
    let target = n as f64;
    let g = |x: f64| -> (f64, f64) {
        weights.iter().fold((0.0, 0.0), |(value, slope), &w| {
            let decay = (-x * w).exp();
            (value - (-x * w).exp_m1(), slope + w * decay)
        })
    };
    let tolerance = TOLERANCE * target.max(1.0);
    // Bracket: g(lo) < n ≤ g(hi). g(0) = 0 < n; grow hi until g(hi) ≥ n (g → P > n).
    let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
    while g(hi).0 < target {
        lo = hi;
        hi *= 2.0;
        if !hi.is_finite() {
            return Err(StrategyError::NotConverged {
                what: "Wallenius mean (bracketing)",
                iterations: 0,
                residual: target - g(lo).0,
            });
        }
    }
    let mut x = hi;
    let mut converged = false;
    for _ in 0..MAX_ITERATIONS {
        let (value, slope) = g(x);
        let residual = value - target;
        if residual.abs() <= tolerance {
            converged = true;
            break;
        }
        if residual < 0.0 {
            lo = x;
        } else {
            hi = x;
        }
        if hi - lo <= hi * 4.0 * f64::EPSILON {
            converged = true;
            break;
        }
        let newton = x - residual / slope;
        x = if newton > lo && newton < hi && newton.is_finite() {
            newton
        } else if lo > 0.0 {
            lo.sqrt() * hi.sqrt()
        } else {
            hi / 2.0
        };
    }
    if !converged {
        return Err(StrategyError::NotConverged {
            what: "Wallenius mean (Newton)",
            iterations: MAX_ITERATIONS,
            residual: (g(x).0 - target).abs(),
        });
    }
    Ok(weights
        .iter()
        .map(|&w| {
            let p = -(-x * w).exp_m1();
            if p < PROBABILITY_FLOOR {
                0.0
            } else {
                p.min(1.0)
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_to_n_and_orders_by_odds() {
        let pi = mean_inclusion(&[3.0, 1.0, 2.0, 0.5], 2).unwrap();
        assert!((pi.iter().sum::<f64>() - 2.0).abs() < 1e-12);
        assert!(pi[0] > pi[2] && pi[2] > pi[1] && pi[1] > pi[3]);
        // Equal odds: uniform n/N.
        let pi = mean_inclusion(&[2.0; 5], 2).unwrap();
        assert!(pi.iter().all(|p| (p - 0.4).abs() < 1e-12));
    }

    #[test]
    fn zero_odds_and_large_n() {
        let pi = mean_inclusion(&[1.0, 1.0, 0.0], 1).unwrap();
        assert_eq!(pi[2], 0.0);
        assert!((pi[0] - 0.5).abs() < 1e-12);
        // n = P: positives certain, zeros never.
        assert_eq!(
            mean_inclusion(&[1.0, 1.0, 0.0], 2).unwrap(),
            vec![1.0, 1.0, 0.0]
        );
        // n > P: one slot over two zero-odds balls.
        assert_eq!(
            mean_inclusion(&[1.0, 0.0, 0.0], 2).unwrap(),
            vec![1.0, 0.5, 0.5]
        );
        assert_eq!(mean_inclusion(&[0.0, 0.0], 2).unwrap(), vec![1.0, 1.0]);
        assert_eq!(mean_inclusion(&[5.0, 1.0], 2).unwrap(), vec![1.0, 1.0]);
    }

    #[test]
    fn extreme_odds_converge() {
        // n = P − 1 with one ball 1e-200 times lighter: its π is tiny but finite, Σπ still n.
        let pi = mean_inclusion(&[1.0, 1.0, 1e-200], 2).unwrap();
        assert!((pi.iter().sum::<f64>() - 2.0).abs() < 1e-9);
        assert!(pi.iter().all(|p| p.is_finite() && (0.0..=1.0).contains(p)));
    }

    #[test]
    fn rejects_bad_input() {
        assert!(mean_inclusion(&[], 1).is_err());
        assert!(mean_inclusion(&[1.0, -1.0], 1).is_err());
        assert!(mean_inclusion(&[1.0, f64::NAN], 1).is_err());
        assert!(mean_inclusion(&[1.0, 2.0], 0).is_err());
        assert!(mean_inclusion(&[1.0, 2.0], 3).is_err());
    }
}
