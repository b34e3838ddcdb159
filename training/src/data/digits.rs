//! The UCI 8×8 handwritten digits (1797 samples × 64 pixels, 10 classes), embedded in smartcore
//! so the default experiment needs no download.
//!
//! smartcore ships them with the iris feature/target names and with labels as `f32`; we ignore
//! the names and check every label is an integer digit before converting.

use super::{DataError, Dataset, Result};

/// Samples in the embedded digits.
pub const SAMPLES: usize = 1797;
/// Pixels per sample (8 × 8).
pub const DIM: usize = 64;
/// Digit classes 0–9.
pub const CLASSES: usize = 10;
/// Largest pixel value (4×4 blocks of a 32×32 bitmap, counted).
const MAX_PIXEL: f32 = 16.0;

/// The embedded digits with pixels scaled to `[0, 1]` (pixel / 16) and labels as `u32`.
///
/// Errors if the embedded table does not have the documented shape or a label is not an
/// integer in `0..10`, so a changed smartcore release fails loudly rather than training on
/// garbage.
pub fn load() -> Result<Dataset> {
    let raw = smartcore::dataset::digits::load_dataset();
    let embedded = |problem: String| DataError::Embedded {
        name: "digits",
        problem,
    };
    if raw.num_samples != SAMPLES || raw.num_features != DIM {
        return Err(embedded(format!(
            "expected {SAMPLES} × {DIM}, found {} × {}",
            raw.num_samples, raw.num_features
        )));
    }
    let labels = raw
        .target
        .iter()
        .enumerate()
        .map(|(sample, &y)| {
            if y.fract() == 0.0 && (0.0..CLASSES as f32).contains(&y) {
                Ok(y as u32)
            } else {
                Err(embedded(format!(
                    "label {y} of sample {sample} is not a digit"
                )))
            }
        })
        .collect::<Result<Vec<u32>>>()?;
    if let Some(&pixel) = raw.data.iter().find(|p| !(0.0..=MAX_PIXEL).contains(*p)) {
        return Err(embedded(format!("pixel {pixel} is outside 0..=16")));
    }
    let features = raw.data.iter().map(|&p| p / MAX_PIXEL).collect();
    Dataset::new(features, labels, DIM, CLASSES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_have_documented_shape_range_and_classes() {
        let d = load().unwrap();
        assert_eq!(d.len(), 1797);
        assert_eq!(d.dim, 64);
        assert_eq!(d.features.len(), 1797 * 64);
        assert_eq!(d.classes, 10);
        let counts = d.class_counts();
        // The UCI test set is close to balanced: every digit has between 174 and 183 samples.
        assert!(
            counts.iter().all(|&c| (170..=190).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(counts.iter().sum::<usize>(), 1797);
        let (lo, hi) = d
            .features
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        assert_eq!((lo, hi), (0.0, 1.0));
    }
}
