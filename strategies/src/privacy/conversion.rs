//! From Rényi DP to `(ε, δ)`-DP (docs/algorithms.md §6.6).

use serde::{Deserialize, Serialize};

/// An `(ε, δ)` guarantee and the RDP order it was read at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Epsilon {
    pub epsilon: f64,
    /// The order `α` that gave the smallest ε (0 when none was finite or ε is 0).
    pub order: f64,
}

/// The smallest ε over `orders` for which RDP `rdp(α)` implies `(ε, delta)`-DP, by the improved
/// conversion of Balle et al. (2020, Theorem 21) and Canonne, Kamath, Steinke (2020,
/// Proposition 12): `ε = rdp(α) + log((α − 1)/α) − (log δ + log α)/(α − 1)`.
///
/// As dp-accounting: an order whose RDP satisfies `δ² ≥ 1 − e^{−rdp}` gives ε = 0 (the KL bound
/// `δ ≤ √(1 − e^{−KL})` already holds), orders up to 1.01 are skipped (the bound is unstable
/// there), and ε is never negative. `∞` when no order gives a finite bound or `δ` is not in
/// (0, 1).
pub fn epsilon(orders: &[f64], rdp: &[f64], delta: f64) -> Epsilon {
    let infinite = Epsilon {
        epsilon: f64::INFINITY,
        order: 0.0,
    };
    if !(delta > 0.0 && delta < 1.0) {
        return infinite;
    }
    let mut best = infinite;
    for (&a, &r) in orders.iter().zip(rdp) {
        let eps = if r < 0.0 || delta * delta + (-r).exp_m1() > 0.0 {
            0.0
        } else if a > 1.01 && r.is_finite() {
            r + (-1.0 / a).ln_1p() - (delta * a).ln() / (a - 1.0)
        } else {
            f64::INFINITY
        };
        if eps < best.epsilon {
            best = Epsilon {
                epsilon: eps,
                order: a,
            };
        }
    }
    best.epsilon = best.epsilon.max(0.0);
    best
}
