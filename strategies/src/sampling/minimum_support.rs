//! Deville–Tillé minimum support splitting (docs/algorithms.md §1.6, R
//! `sampling::UPminimalsupport`): repeatedly split `π` into a sample `s1 = B ∪ D` (B = units at
//! 1, D a simple random sample of the fractional units of the right size) and a residual vector,
//! keeping `s1` with probability `α`, until `π` is integral.
//!
//! Cost, and why there is no precomputed split tree: D is drawn at random at every split (as
//! in R), so the splits depend on the draw and cannot be tabulated once in `prepare`. Each
//! split costs `O(N')` for the `N'` still-fractional units and fixes at least one of them to
//! 0 or 1, so a draw costs `O(N²)` in the worst case and `O(N · #splits)` in general; it is
//! fine for the small layers it was compared on (Table 4) but not the default. (A
//! deterministic D would give a chain of at most N samples and `O(log N)` draws, but a
//! different design from R's.)

use crate::error::Result;
use crate::rng::{ChaCha20Rng, uniform};

use super::PreparedDesign;
use super::certainty::{SNAP, interior_input};

/// One split of §1.6: `π = α s1 + (1 − α) π_b`.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// Probability of continuing with `s1`.
    pub alpha: f64,
    /// `s1`: 1 on `B ∪ D`, 0 elsewhere.
    pub selected: Vec<f64>,
    /// `π_b = (π − α s1)/(1 − α)`, snapped to 0/1 within 1e-12.
    pub residual: Vec<f64>,
}

/// The split of `pi` for a given `D` (`chosen`, indices of fractional units):
/// `α = min(1 − max_{C∖D} π, min_D π)`, an empty max or min being ignored.
pub fn split(pi: &[f64], chosen: &[usize]) -> Split {
    let mut selected: Vec<f64> = pi
        .iter()
        .map(|&p| if p == 1.0 { 1.0 } else { 0.0 })
        .collect();
    for &k in chosen {
        selected[k] = 1.0;
    }
    let min_chosen = chosen.iter().map(|&k| pi[k]).fold(1.0, f64::min);
    let max_other = pi
        .iter()
        .zip(&selected)
        .filter(|&(&p, &s)| s == 0.0 && p > 0.0)
        .map(|(&p, _)| p)
        .fold(0.0, f64::max);
    let alpha = (1.0 - max_other).min(min_chosen);
    let residual = pi
        .iter()
        .zip(&selected)
        .map(|(&p, &s)| snap((p - alpha * s) / (1.0 - alpha)))
        .collect();
    Split {
        alpha,
        selected,
        residual,
    }
}

fn snap(p: f64) -> f64 {
    if p <= SNAP {
        0.0
    } else if p >= 1.0 - SNAP {
        1.0
    } else {
        p
    }
}

/// Minimum support design for `π` strictly inside `(0, 1)` with integer sum.
#[derive(Debug, Clone)]
pub struct MinimumSupport {
    n: usize,
    pi: Vec<f64>,
}

impl MinimumSupport {
    /// Validates `pi` (strictly inside `(0, 1)`, `Σπ` an integer `1 ≤ n < N`).
    pub fn new(pi: &[f64]) -> Result<Self> {
        let (pi, n) = interior_input("minimum support inclusion probabilities", pi)?;
        Ok(Self { n, pi })
    }

    /// One draw with uniforms from `next_uniform`: per split, `|D|` uniforms for a partial
    /// Fisher–Yates shuffle of the fractional units (D = the first `|D|`), then one to accept
    /// `s1` with probability `α`. `out` receives n ascending indices.
    pub fn draw_with(&self, mut next_uniform: impl FnMut() -> f64, out: &mut Vec<usize>) {
        out.clear();
        let mut pi = self.pi.clone();
        // Fractional units; `out` holds the units at 1 (B).
        let mut active: Vec<usize> = (0..pi.len()).collect();
        // Each split fixes at least one unit, so N + 1 rounds always suffice.
        for _ in 0..=pi.len() {
            let k = self.n.saturating_sub(out.len());
            if k == 0 {
                break;
            }
            if k >= active.len() {
                out.extend_from_slice(&active);
                break;
            }
            let len = active.len();
            for j in 0..k {
                let r = j + ((next_uniform() * (len - j) as f64) as usize);
                active.swap(j, r.min(len - 1));
            }
            let (chosen, others) = active.split_at(k);
            let min_chosen = chosen.iter().map(|&i| pi[i]).fold(1.0, f64::min);
            let max_other = others.iter().map(|&i| pi[i]).fold(0.0, f64::max);
            let alpha = (1.0 - max_other).min(min_chosen);
            if next_uniform() < alpha {
                out.extend_from_slice(chosen);
                break;
            }
            let keep = 1.0 / (1.0 - alpha);
            for &i in chosen {
                pi[i] = snap((pi[i] - alpha) * keep);
            }
            for &i in others {
                pi[i] = snap(pi[i] * keep);
            }
            active.retain(|&i| {
                if pi[i] == 1.0 {
                    out.push(i);
                }
                pi[i] > 0.0 && pi[i] < 1.0
            });
        }
        // Rounding can in principle leave the count off by one after many splits; keep the
        // fixed-size contract (never observed).
        out.truncate(self.n);
        if out.len() < self.n {
            active.sort_by(|&a, &b| pi[b].total_cmp(&pi[a]));
            let missing = self.n - out.len();
            out.extend(active.iter().take(missing));
        }
        out.sort_unstable();
    }
}

impl PreparedDesign for MinimumSupport {
    fn sample_size(&self) -> usize {
        self.n
    }

    fn draw_into(&self, rng: &mut ChaCha20Rng, out: &mut Vec<usize>) {
        self.draw_with(|| uniform(rng), out);
    }
}
