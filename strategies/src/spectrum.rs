//! Singular spectra as the strategies expect them: finite, non-negative, sorted non-increasing.
//!
//! Strategies work on a sorted spectrum (`λ_1 ≥ … ≥ λ_N ≥ 0`, docs/algorithms.md §1.1); callers with
//! values in any other order sort them with [`SortedSpectrum::new`] and map the results back
//! with [`SortedSpectrum::unsort`].

use crate::{Result, StrategyError};

/// A validated spectrum in non-increasing order, with the permutation back to input order.
#[derive(Debug, Clone, PartialEq)]
pub struct SortedSpectrum {
    values: Vec<f64>,
    /// `order[k]` is the input position of the k-th largest value.
    order: Vec<usize>,
}

impl SortedSpectrum {
    /// Validates `values` (non-empty, finite, ≥ 0) and sorts them non-increasing with a stable
    /// sort, so ties keep their input order.
    pub fn new(values: &[f64]) -> Result<Self> {
        if values.is_empty() {
            return Err(StrategyError::invalid("spectrum", "it is empty"));
        }
        if let Some((i, v)) = values
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || **v < 0.0)
        {
            return Err(StrategyError::invalid(
                "spectrum",
                format!("value {i} is {v}; singular values must be finite and non-negative"),
            ));
        }
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
        let values = order.iter().map(|&i| values[i]).collect();
        Ok(Self { values, order })
    }

    /// The values, largest first.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// Number of singular values `N`.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Always false: a spectrum has at least one value.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Maps a per-component vector in sorted order back to input order.
    pub fn unsort<T: Copy>(&self, sorted: &[T]) -> Vec<T> {
        assert_eq!(sorted.len(), self.order.len(), "one entry per component");
        let mut out = sorted.to_vec();
        for (k, &i) in self.order.iter().enumerate() {
            out[i] = sorted[k];
        }
        out
    }

    /// Maps sorted positions (indices into [`Self::values`]) back to input positions.
    pub fn input_positions(&self, sorted_indices: &[usize]) -> Vec<usize> {
        sorted_indices.iter().map(|&k| self.order[k]).collect()
    }
}

/// Checks that `values` is a valid spectrum already in non-increasing order.
pub fn check_sorted(values: &[f64]) -> Result<()> {
    if values.is_empty() {
        return Err(StrategyError::invalid("spectrum", "it is empty"));
    }
    for (i, w) in values.windows(2).enumerate() {
        if w[1] > w[0] {
            return Err(StrategyError::invalid(
                "spectrum",
                format!("not sorted non-increasing at position {}", i + 1),
            ));
        }
    }
    match values.iter().find(|v| !v.is_finite() || **v < 0.0) {
        Some(v) => Err(StrategyError::invalid(
            "spectrum",
            format!("{v} is not a finite non-negative singular value"),
        )),
        None => Ok(()),
    }
}

/// Number of kept terms for keep ratio `r ∈ (0, 1]`: `n = ⌈N r⌉` computed as an f64 product
/// then ceiling (docs/algorithms.md §1.1 step 2), at least 1.
pub fn kept_terms(total: usize, keep_ratio: f64) -> Result<usize> {
    if !(keep_ratio > 0.0 && keep_ratio <= 1.0) {
        return Err(StrategyError::invalid(
            "keep ratio",
            format!("{keep_ratio} is not in (0, 1]"),
        ));
    }
    Ok(((total as f64 * keep_ratio).ceil() as usize).clamp(1, total.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_and_unsorts() {
        let s = SortedSpectrum::new(&[1.0, 3.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.values(), &[3.0, 3.0, 2.0, 1.0]);
        assert_eq!(s.unsort(&[10, 11, 12, 13]), vec![13, 10, 12, 11]);
        assert_eq!(s.input_positions(&[0, 2]), vec![1, 2]);
    }

    #[test]
    fn rejects_bad_values() {
        assert!(SortedSpectrum::new(&[]).is_err());
        assert!(SortedSpectrum::new(&[1.0, f64::NAN]).is_err());
        assert!(SortedSpectrum::new(&[1.0, -0.5]).is_err());
        assert!(check_sorted(&[1.0, 2.0]).is_err());
    }

    #[test]
    fn kept_terms_is_the_ceiling() {
        assert_eq!(kept_terms(10, 0.2).unwrap(), 2);
        assert_eq!(kept_terms(7, 0.2).unwrap(), 2);
        assert_eq!(kept_terms(512, 0.1).unwrap(), 52);
        assert_eq!(kept_terms(2048, 0.1).unwrap(), 205);
        assert_eq!(kept_terms(5, 1.0).unwrap(), 5);
        assert!(kept_terms(5, 0.0).is_err());
        assert!(kept_terms(5, 1.5).is_err());
    }
}
