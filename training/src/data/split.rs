//! Stratified train/test splits: each class contributes the same fraction of its samples to the
//! test set, so a small held-out set still sees every class in its global proportion.

use super::{DataError, DataStream, Dataset, Result, data_stream, shuffle};

/// Splits `data` into `(train, test)` with `round(n_k · test_fraction)` samples of each class
/// `k` in the test set, the samples of each class chosen by a seeded shuffle.
///
/// Both halves keep the original sample order (indices ascending), so only the seed decides
/// who goes where. `test_fraction` must be in `[0, 1]`; it comes from a config, so a bad value
/// is an error rather than a panic.
pub fn train_test(data: &Dataset, test_fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
    let (train, test) = train_test_indices(data, test_fraction, seed)?;
    Ok((data.subset(&train)?, data.subset(&test)?))
}

/// The row indices of [`train_test`]'s two halves, ascending.
pub fn train_test_indices(
    data: &Dataset,
    test_fraction: f64,
    seed: u64,
) -> Result<(Vec<usize>, Vec<usize>)> {
    if !(0.0..=1.0).contains(&test_fraction) {
        return Err(DataError::InvalidParameter {
            name: "test_fraction",
            value: test_fraction.to_string(),
            expected: "a fraction in [0, 1]",
        });
    }
    data.validate()?;
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); data.classes];
    for (i, &label) in data.labels.iter().enumerate() {
        by_class[label as usize].push(i);
    }
    let mut train = Vec::with_capacity(data.len());
    let mut test = Vec::new();
    for (class, mut members) in by_class.into_iter().enumerate() {
        // One stream per class: the choice within a class does not depend on other classes.
        shuffle(
            &mut members,
            &mut data_stream(seed, DataStream::Split, class as u64),
        );
        let n_test = ((members.len() as f64 * test_fraction).round() as usize).min(members.len());
        test.extend_from_slice(&members[..n_test]);
        train.extend_from_slice(&members[n_test..]);
    }
    train.sort_unstable();
    test.sort_unstable();
    Ok((train, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Dataset {
        // 3 classes with 10, 20 and 30 samples; feature = sample index, to trace rows.
        let labels: Vec<u32> = (0..60)
            .map(|i| match i {
                0..10 => 0,
                10..30 => 1,
                _ => 2,
            })
            .collect();
        let features = (0..60).map(|i| i as f32).collect();
        Dataset::new(features, labels, 1, 3).unwrap()
    }

    #[test]
    fn split_is_stratified_disjoint_and_complete() {
        let d = toy();
        let (train, test) = train_test(&d, 0.2, 9).unwrap();
        assert_eq!(test.class_counts(), vec![2, 4, 6]);
        assert_eq!(train.class_counts(), vec![8, 16, 24]);
        let mut all: Vec<f32> = train
            .features
            .iter()
            .chain(&test.features)
            .copied()
            .collect();
        all.sort_by(f32::total_cmp);
        assert_eq!(all, d.features);
        // Rows keep their labels.
        for part in [&train, &test] {
            for (x, &y) in part.features.iter().zip(&part.labels) {
                assert_eq!(d.labels[*x as usize], y);
            }
        }
    }

    #[test]
    fn split_is_deterministic_and_seed_dependent() {
        let d = toy();
        let a = train_test(&d, 0.3, 1).unwrap();
        assert_eq!(a, train_test(&d, 0.3, 1).unwrap());
        assert_ne!(a.1.features, train_test(&d, 0.3, 2).unwrap().1.features);
    }

    #[test]
    fn split_rejects_bad_fractions() {
        let d = toy();
        for f in [-0.1, 1.5, f64::NAN] {
            assert!(matches!(
                train_test(&d, f, 0),
                Err(DataError::InvalidParameter {
                    name: "test_fraction",
                    ..
                })
            ));
        }
        let (train, test) = train_test(&d, 0.0, 0).unwrap();
        assert_eq!((train.len(), test.len()), (60, 0));
    }
}
