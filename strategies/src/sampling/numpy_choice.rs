//! NumPy's `choice(N, n, replace=False, p)` (docs/algorithms.md §1.5), the sampler of the PriSM
//! baseline, reproduced step for step so a run consumes uniforms exactly as NumPy does: rounds
//! of `m = n − #found` uniforms, found units zeroed, `cdf = cumsum(p) / last`,
//! `searchsorted(side = right)`, distinct results appended in order of first occurrence.
//!
//! With [`crate::rng::uniform`] (NumPy's `Generator.random()` construction) the same 64-bit
//! stream gives NumPy's result. Its marginal inclusion probabilities are not `n p_i` (§1.5):
//! in distribution the procedure is successive sampling (draw one unit ∝ `p` among those not yet
//! found, repeat), which is how the tests compute them exactly.

use crate::error::{Result, StrategyError};
use crate::rng::{ChaCha20Rng, uniform};

use super::PreparedDesign;

/// NumPy's tolerance on `|Σp − 1|`, `sqrt(ε_f64)`.
const NUMPY_SUM_TOLERANCE: f64 = 1.490_116_119_384_765_6e-8;

/// NumPy-style weighted sampling without replacement of `n` units.
#[derive(Debug, Clone)]
pub struct NumpyChoice {
    n: usize,
    p: Vec<f64>,
}

impl NumpyChoice {
    /// Validates the selection `weights` (finite, `≥ 0`, positive sum) and the sample size
    /// (`1 ≤ n ≤ N` and `n ≤ #{w > 0}`, NumPy's checks), and normalises the weights to `p`.
    ///
    /// Weights that already pass NumPy's `|Σp − 1| ≤ sqrt(ε)` check are used as given, as NumPy
    /// does, so a valid NumPy `p` gives bit-identical draws; others are divided by their sum.
    pub fn new(weights: &[f64], n: usize) -> Result<Self> {
        if let Some((i, &w)) = weights
            .iter()
            .enumerate()
            .find(|&(_, &w)| !(w.is_finite() && w >= 0.0))
        {
            return Err(StrategyError::invalid(
                "selection weights",
                format!("weight[{i}] = {w} is not a finite non-negative number"),
            ));
        }
        let sum: f64 = weights.iter().sum();
        if sum <= 0.0 {
            return Err(StrategyError::invalid(
                "selection weights",
                "the weights sum to 0; at least n of them must be positive",
            ));
        }
        if n == 0 {
            return Err(StrategyError::invalid(
                "sample size",
                "numpy-choice needs a sample size n ≥ 1",
            ));
        }
        if n > weights.len() {
            return Err(StrategyError::invalid(
                "sample size",
                format!(
                    "Cannot take a larger sample than population when 'replace=False' \
                     (n = {n}, N = {})",
                    weights.len()
                ),
            ));
        }
        let positive = weights.iter().filter(|&&w| w > 0.0).count();
        if positive < n {
            return Err(StrategyError::invalid(
                "sample size",
                format!("Fewer non-zero entries in p than size ({positive} < n = {n})"),
            ));
        }
        let p = if (sum - 1.0).abs() <= NUMPY_SUM_TOLERANCE {
            weights.to_vec()
        } else {
            weights.iter().map(|&w| w / sum).collect()
        };
        Ok(Self { n, p })
    }

    /// The normalised selection probabilities `p`.
    pub fn probabilities(&self) -> &[f64] {
        &self.p
    }

    /// One draw in NumPy's order of discovery (`choice`'s return value).
    pub fn draw_in_discovery_order(&self, rng: &mut ChaCha20Rng) -> Vec<usize> {
        let mut found = Vec::with_capacity(self.n);
        self.draw_with(|| uniform(rng), &mut found);
        found
    }

    /// The algorithm of §1.5 with uniforms from `next_uniform`; `found` receives the n distinct
    /// indices in order of discovery.
    pub fn draw_with(&self, mut next_uniform: impl FnMut() -> f64, found: &mut Vec<usize>) {
        found.clear();
        let big_n = self.p.len();
        let mut p_work = self.p.clone();
        let mut cdf = vec![0.0; big_n];
        let mut is_found = vec![false; big_n];
        let mut batch = Vec::with_capacity(self.n);
        while found.len() < self.n {
            // a. m uniforms in one batch, before anything else (NumPy's order of consumption).
            batch.clear();
            batch.extend((0..self.n - found.len()).map(|_| next_uniform()));
            // b. zero the found units.
            for &j in found.iter() {
                p_work[j] = 0.0;
            }
            // c. cdf = cumsum(p_work) / cdf[N−1] (sequential sum, element-wise division).
            let mut acc = 0.0;
            for (c, &p) in cdf.iter_mut().zip(&p_work) {
                acc += p;
                *c = acc;
            }
            let last = acc;
            cdf.iter_mut().for_each(|c| *c /= last);
            // d–e. searchsorted(side = right), keep first occurrences.
            for &x in &batch {
                let idx = cdf.partition_point(|&c| c <= x).min(big_n - 1);
                if !is_found[idx] {
                    is_found[idx] = true;
                    found.push(idx);
                }
            }
        }
    }
}

impl PreparedDesign for NumpyChoice {
    fn sample_size(&self) -> usize {
        self.n
    }

    fn draw_into(&self, rng: &mut ChaCha20Rng, out: &mut Vec<usize>) {
        self.draw_with(|| uniform(rng), out);
        out.sort_unstable();
    }
}
