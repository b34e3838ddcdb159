//! The feature normalisation a `files` dataset states in its config: none, standardisation
//! with the training rows' statistics, or a given mean and standard deviation.
//!
//! There is no default: a network trained on raw pixel values in `0..=255` behaves very
//! differently from one on `[0, 1]`, so the config says which it wants.

use crate::data::{DataError, Dataset};

/// How features are rescaled after the train/test split.
#[derive(Debug, Clone, PartialEq)]
pub enum Normalization {
    /// Features as the file holds them (images: samples / 255).
    None,
    /// Each feature `(v − mean_j) / std_j` with the mean and (population) standard deviation of
    /// feature `j` over the training rows; a constant feature (std 0) is only centred.
    Standardize,
    /// `(v − mean_b) / std_b` with `L` given values: `L = 1` for every feature, `L = dim` per
    /// feature, or any `L` dividing `dim` for `L` equal contiguous blocks of a row (the
    /// channels of a channels-first image: `L = 3` for RGB).
    Given { mean: Vec<f32>, std: Vec<f32> },
}

impl Normalization {
    /// Rescales `train` and `test` in place (one rule for both, the statistics from `train`).
    pub fn apply(&self, train: &mut Dataset, test: &mut Dataset) -> Result<(), DataError> {
        let dim = train.dim;
        let (mean, std) = match self {
            Normalization::None => return Ok(()),
            Normalization::Standardize => standardize(train),
            Normalization::Given { mean, std } => {
                let blocks = mean.len();
                let invalid = |expected| DataError::InvalidParameter {
                    name: "data.normalize",
                    value: format!("mean {mean:?}, std {std:?}"),
                    expected,
                };
                if blocks == 0 || std.len() != blocks || !dim.is_multiple_of(blocks) {
                    return Err(invalid(
                        "mean and std of the same length L: 1, the number of features, or a \
                         divisor of it (one value per channel)",
                    ));
                }
                if std.iter().any(|s| !(s.is_finite() && *s > 0.0))
                    || mean.iter().any(|m| !m.is_finite())
                {
                    return Err(invalid("finite means and positive standard deviations"));
                }
                let block = dim / blocks;
                let per_feature = |v: &[f32]| (0..dim).map(|j| v[j / block]).collect();
                (per_feature(mean), per_feature(std))
            }
        };
        for data in [train, test] {
            for row in data.features.chunks_exact_mut(dim.max(1)) {
                for ((v, m), s) in row.iter_mut().zip(&mean).zip(&std) {
                    *v = (*v - m) / s;
                }
            }
            data.validate()?;
        }
        Ok(())
    }
}

/// Per-feature mean and standard deviation of `train` (accumulated in `f64`); a zero deviation
/// becomes 1.
fn standardize(train: &Dataset) -> (Vec<f32>, Vec<f32>) {
    let dim = train.dim;
    let n = train.len().max(1) as f64;
    let mut sum = vec![0.0f64; dim];
    let mut squares = vec![0.0f64; dim];
    for row in train.features.chunks_exact(dim.max(1)) {
        for (j, &v) in row.iter().enumerate() {
            sum[j] += f64::from(v);
            squares[j] += f64::from(v) * f64::from(v);
        }
    }
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let std = (squares.iter().zip(&mean))
        .map(|(q, m)| {
            let s = (q / n - m * m).max(0.0).sqrt() as f32;
            if s > 0.0 { s } else { 1.0 }
        })
        .collect();
    (mean.iter().map(|&m| m as f32).collect(), std)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standardize_uses_training_statistics_only() {
        // Feature 0: 1 and 3 (mean 2, std 1); feature 1 constant 5 (std 0 → only centred).
        let mut train = Dataset::new(vec![1.0, 5.0, 3.0, 5.0], vec![0, 1], 2, 2).unwrap();
        let mut test = Dataset::new(vec![4.0, 5.0], vec![0], 2, 2).unwrap();
        Normalization::Standardize
            .apply(&mut train, &mut test)
            .unwrap();
        assert_eq!(train.features, vec![-1.0, 0.0, 1.0, 0.0]);
        assert_eq!(test.features, vec![2.0, 0.0]);
    }

    #[test]
    fn given_values_apply_per_block_and_are_checked() {
        let mut train = Dataset::new(vec![1.0, 2.0, 3.0, 4.0], vec![0], 4, 1).unwrap();
        let mut test = Dataset::new(vec![], vec![], 4, 1).unwrap();
        let given = |mean: Vec<f32>, std: Vec<f32>| Normalization::Given { mean, std };
        given(vec![1.0, 3.0], vec![1.0, 0.5])
            .apply(&mut train, &mut test)
            .unwrap();
        assert_eq!(train.features, vec![0.0, 1.0, 0.0, 2.0]);
        for bad in [
            given(vec![0.0; 3], vec![1.0; 3]),
            given(vec![0.0], vec![0.0]),
        ] {
            let e = bad.apply(&mut train, &mut test).unwrap_err();
            assert!(e.to_string().contains("data.normalize"), "{e}");
        }
    }
}
