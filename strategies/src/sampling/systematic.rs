//! Ordered systematic sampling (docs/algorithms.md §1.6, R `sampling::UPsystematic`): one uniform
//! `U`, cumulative sums `V_k = Σ_{j≤k} π_j`, and unit k is selected iff an integer lies in
//! `(V_{k−1} − U, V_k − U]`. Exact marginals `π`, `O(N)` per draw, but many pairs have
//! `π_ij = 0` (units closer than 1 apart on the `V` line), which is why it is not the default.
//!
//! We compare `floor(V_k − U)` with `floor(V_{k−1} − U)`, which is R's
//! `(V_{k−1} − U) mod 1 > (V_k − U) mod 1` whenever `π_k < 1`, and we store `V` with
//! `V_N = n` exactly so the telescoping count of crossings is exactly n for every `U ∈ [0, 1)`.

use crate::error::Result;
use crate::rng::{ChaCha20Rng, uniform};

use super::PreparedDesign;
use super::certainty::interior_input;

/// Systematic sampling for `π` strictly inside `(0, 1)` with integer sum, in the given unit
/// order.
#[derive(Debug, Clone)]
pub struct Systematic {
    n: usize,
    /// `V_1 … V_N`, with `V_N = n` exactly.
    cumulative: Vec<f64>,
}

impl Systematic {
    /// Validates `pi` (strictly inside `(0, 1)`, `Σπ` an integer `1 ≤ n < N`).
    pub fn new(pi: &[f64]) -> Result<Self> {
        let (pi, n) = interior_input("systematic inclusion probabilities", pi)?;
        let mut acc = 0.0;
        let mut cumulative: Vec<f64> = pi
            .iter()
            .map(|&p| {
                acc += p;
                acc
            })
            .collect();
        if let Some(last) = cumulative.last_mut() {
            *last = n as f64;
        }
        Ok(Self { n, cumulative })
    }

    /// The draw for a given `U ∈ [0, 1)`; `out` receives n ascending indices.
    pub fn draw_with_uniform(&self, u: f64, out: &mut Vec<usize>) {
        out.clear();
        let mut previous = (-u).floor();
        for (k, &v) in self.cumulative.iter().enumerate() {
            let current = (v - u).floor();
            if current > previous {
                out.push(k);
            }
            previous = current;
        }
    }
}

impl PreparedDesign for Systematic {
    fn sample_size(&self) -> usize {
        self.n
    }

    fn draw_into(&self, rng: &mut ChaCha20Rng, out: &mut Vec<usize>) {
        self.draw_with_uniform(uniform(rng), out);
    }
}
