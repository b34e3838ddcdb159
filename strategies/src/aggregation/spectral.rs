//! Aggregation of spectrally sharded layers (ALGORITHMS.md §1.1 step 5).

use super::fedavg::sample_weights;
use super::{Aggregator, RoundOutcome, result_samples, validate_weights};
use crate::{Result, StrategyError};

/// Spectral aggregation: the sharded factors are averaged per singular vector with
/// [`average_columns`]; everything else (first and last layer, biases, norms) is averaged with
/// FedAvg weights `D_c / Σ D` (§1.1 step 5, "standard choice"), which is what
/// [`Aggregator::weights`] returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spectral;

impl Aggregator for Spectral {
    fn name(&self) -> &'static str {
        "spectral"
    }

    fn weights(&self, round: &RoundOutcome) -> Result<Vec<f64>> {
        let w = sample_weights(&result_samples(round, false)?)?;
        validate_weights(&w, round.results.len(), true)?;
        Ok(w)
    }
}

/// One client's trained singular vectors of one factor (`u'` or `v'`) of a sharded layer.
#[derive(Debug, Clone, Copy)]
pub struct ColumnUpdate<'a> {
    /// `D_c`, the client's local dataset size (its weight); must be finite and > 0.
    pub samples: f64,
    /// The indices `I^(c)` of the vectors the client held, distinct, each `< global vectors`.
    pub indices: &'a [usize],
    /// The trained vectors, `indices.len() × vector_len`, row-major: row `j` is vector
    /// `indices[j]`.
    pub vectors: &'a [f32],
}

/// Per-singular-vector averaging, ALGORITHMS.md §1.1 step 5:
/// `u'_i ← Σ_{c: i∈I^(c)} D^(c) u'^(c)_i / Σ_{c: i∈I^(c)} D^(c)`.
///
/// `global` holds the server's vectors, `global.len() / vector_len` of them, row-major (vector
/// `i` is `global[i·vector_len .. (i+1)·vector_len]`). A vector that no client held is left
/// unchanged bit for bit. Sums are accumulated in `f64`.
///
/// Returns how many clients held each vector. Every input is validated before anything is
/// written (shapes, index range, duplicate indices within a client, finite values, `D_c > 0`),
/// so on error `global` is untouched.
pub fn average_columns(
    global: &mut [f32],
    vector_len: usize,
    contributions: &[ColumnUpdate],
) -> Result<Vec<usize>> {
    if vector_len == 0 || !global.len().is_multiple_of(vector_len) {
        return Err(StrategyError::invalid(
            "global vectors",
            format!(
                "length {} is not a positive multiple of the vector length {vector_len}",
                global.len()
            ),
        ));
    }
    let vectors = global.len() / vector_len;
    let mut holders = vec![0usize; vectors];
    for (c, update) in contributions.iter().enumerate() {
        if !update.samples.is_finite() || update.samples <= 0.0 {
            return Err(StrategyError::invalid(
                "column update",
                format!(
                    "contribution {c} has weight D = {}; need D > 0",
                    update.samples
                ),
            ));
        }
        if update.vectors.len() != update.indices.len() * vector_len {
            return Err(StrategyError::invalid(
                "column update",
                format!(
                    "contribution {c} has {} values for {} vectors of length {vector_len}",
                    update.vectors.len(),
                    update.indices.len()
                ),
            ));
        }
        if let Some(v) = update.vectors.iter().find(|v| !v.is_finite()) {
            return Err(StrategyError::invalid(
                "column update",
                format!("contribution {c} holds the non-finite value {v}"),
            ));
        }
        let mut seen = vec![false; vectors];
        for &i in update.indices {
            if i >= vectors {
                return Err(StrategyError::invalid(
                    "column update",
                    format!("contribution {c} holds vector {i}, but there are only {vectors}"),
                ));
            }
            if seen[i] {
                return Err(StrategyError::invalid(
                    "column update",
                    format!("contribution {c} holds vector {i} twice"),
                ));
            }
            seen[i] = true;
        }
        for &i in update.indices {
            holders[i] += 1;
        }
    }

    let mut sums = vec![0.0f64; global.len()];
    let mut mass = vec![0.0f64; vectors];
    for update in contributions {
        for (row, &i) in update.vectors.chunks_exact(vector_len).zip(update.indices) {
            mass[i] += update.samples;
            for (s, &x) in sums[i * vector_len..(i + 1) * vector_len]
                .iter_mut()
                .zip(row)
            {
                *s += update.samples * f64::from(x);
            }
        }
    }
    for i in (0..vectors).filter(|&i| holders[i] > 0) {
        let range = i * vector_len..(i + 1) * vector_len;
        for (g, s) in global[range.clone()].iter_mut().zip(&sums[range]) {
            *g = (s / mass[i]) as f32;
        }
    }
    Ok(holders)
}
