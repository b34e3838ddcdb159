//! Brewer's draw-by-draw method (docs/algorithms.md §1.6, R `sampling::UPbrewer`): n steps, each
//! choosing one not-yet-selected unit with probabilities built from `π` and the selection so
//! far. Exact marginals `π`, `O(N n)` per draw, no set-up beyond validation.
//!
//! Unlike R we do not exclude units outside `(1e-6, 1 − 1e-6)`: certainty units are removed
//! within 1e-12 by [`super::certainty`], and the step probabilities stay well defined for any
//! `π` strictly inside `(0, 1)`.

use crate::error::Result;
use crate::rng::{ChaCha20Rng, uniform};

use super::PreparedDesign;
use super::certainty::interior_input;

/// Brewer's design for `π` strictly inside `(0, 1)` with integer sum.
#[derive(Debug, Clone)]
pub struct Brewer {
    n: usize,
    pi: Vec<f64>,
}

impl Brewer {
    /// Validates `pi` (strictly inside `(0, 1)`, `Σπ` an integer `1 ≤ n < N`).
    pub fn new(pi: &[f64]) -> Result<Self> {
        let (pi, n) = interior_input("Brewer inclusion probabilities", pi)?;
        Ok(Self { n, pi })
    }

    /// The normalised selection probabilities of step `step` (1-based, `1..=n`) given the units
    /// already `selected` (§1.6): `p_k ∝ π_k (n − a − π_k) / (n − a − π_k (n − step + 1))` for
    /// unselected k, 0 for selected ones, where `a = Σ_{selected} π`.
    pub fn step_probabilities(&self, selected: &[bool], step: usize) -> Vec<f64> {
        let mut p = vec![0.0; self.pi.len()];
        let total = self.unnormalised_step(selected, step, &mut p);
        p.iter_mut().for_each(|v| *v /= total);
        p
    }

    /// Writes the unnormalised step weights into `p` and returns their sum.
    fn unnormalised_step(&self, selected: &[bool], step: usize, p: &mut [f64]) -> f64 {
        let n = self.n as f64;
        let a: f64 = self
            .pi
            .iter()
            .zip(selected)
            .filter(|&(_, &s)| s)
            .map(|(&pi, _)| pi)
            .sum();
        let left = n - a;
        let draws_left = (self.n - step + 1) as f64;
        let mut total = 0.0;
        for ((out, &pi), &s) in p.iter_mut().zip(&self.pi).zip(selected) {
            *out = if s {
                0.0
            } else {
                pi * (left - pi) / (left - pi * draws_left)
            };
            total += *out;
        }
        total
    }

    /// One draw with uniforms from `next_uniform` (one per step): at each step pick the first
    /// unit k with `U < cumsum(p)_k`, as `UPbrewer` does. `out` receives n ascending indices.
    pub fn draw_with(&self, mut next_uniform: impl FnMut() -> f64, out: &mut Vec<usize>) {
        out.clear();
        let big_n = self.pi.len();
        let mut selected = vec![false; big_n];
        let mut p = vec![0.0; big_n];
        for step in 1..=self.n {
            let total = self.unnormalised_step(&selected, step, &mut p);
            let target = next_uniform() * total;
            let mut cumulative = 0.0;
            // Fallback against rounding: the last unselected unit with positive weight.
            let mut chosen = (0..big_n).rev().find(|&k| !selected[k] && p[k] > 0.0);
            for (k, &pk) in p.iter().enumerate() {
                cumulative += pk;
                if pk > 0.0 && target < cumulative {
                    chosen = Some(k);
                    break;
                }
            }
            // Every step has an unselected unit with positive weight (n < N, π > 0).
            if let Some(k) = chosen {
                selected[k] = true;
                out.push(k);
            }
        }
        out.sort_unstable();
    }
}

impl PreparedDesign for Brewer {
    fn sample_size(&self) -> usize {
        self.n
    }

    fn draw_into(&self, rng: &mut ChaCha20Rng, out: &mut Vec<usize>) {
        self.draw_with(|| uniform(rng), out);
    }
}
