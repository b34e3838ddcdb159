//! Label flipping (`[faults.byzantine] kind = "label-flip"`): a byzantine client trains
//! honestly on its own rows with every label y replaced by classes − 1 − y, and sends what it
//! trained. The other attacks alter the trained update and live with the fault injector
//! (`fedshard_actors::faults::byzantine`); this one changes the data, so it acts where the
//! clients' trainers are built: the attackers get trainers built the same way as every other
//! client's (same model, device and cohort queue) over a table of their own rows, relabelled.

use super::loaded::Loaded;
use fedshard_protocol::task::ClientId;
use fedshard_training::data::Dataset;
use std::collections::BTreeSet;
use thiserror::Error;

/// Why label flipping cannot run on a federation's data.
#[derive(Debug, Error, PartialEq)]
pub enum LabelFlipError {
    /// The data has no class labels: next-character targets, real-valued regression targets.
    #[error(
        "field `faults.byzantine.kind`: `label-flip` flips the class labels of a labelled table \
         (digits, CIFAR, MNIST, a `files` table); {data} has none to flip"
    )]
    NoLabels { data: &'static str },
    /// A label at or above the table's number of classes, which a loaded table never holds.
    #[error("label flipping: label {label} of a table with {classes} classes")]
    LabelOutOfRange { label: u32, classes: usize },
    /// A client's rows lie outside the table, which a partition of it never gives.
    #[error("label flipping: {0}")]
    Rows(#[from] fedshard_training::data::DataError),
}

/// Refuses label flipping on data without class labels, naming the field: both halves of a
/// federation ask, so a server (`fedshard serve`) refuses such a config as its clients would.
pub(super) fn labelled(loaded: &Loaded) -> Result<(), LabelFlipError> {
    table(loaded).map(|_| ())
}

/// The labelled training table of `loaded` and its clients' rows.
fn table(loaded: &Loaded) -> Result<(&Dataset, &[Vec<usize>]), LabelFlipError> {
    match loaded {
        Loaded::Table { train, parts, .. } => Ok((train, parts)),
        Loaded::Text { .. } => Err(LabelFlipError::NoLabels {
            data: "the Shakespeare text (next-character targets)",
        }),
        Loaded::Linear { .. } => Err(LabelFlipError::NoLabels {
            data: "the synthetic linear-regression data (real-valued targets)",
        }),
    }
}

/// The data the `attackers` train on: a table of each attacker's rows, in its order, with every
/// label flipped, and each attacker's part pointing at its own rows there (the other clients'
/// parts empty). Only the attackers' rows are copied, as building their trainers would copy
/// them anyway. The test set is empty: only the server evaluates, on the real one.
pub(super) fn flipped(
    loaded: &Loaded,
    attackers: &BTreeSet<ClientId>,
) -> Result<Loaded, LabelFlipError> {
    let (train, parts) = table(loaded)?;
    let mut rows = Vec::new();
    let mut flipped_parts = vec![Vec::new(); parts.len()];
    for &c in attackers {
        let Some(part) = parts.get(c as usize) else {
            continue;
        };
        flipped_parts[c as usize] = (rows.len()..rows.len() + part.len()).collect();
        rows.extend_from_slice(part);
    }
    let mut table = train.subset(&rows)?;
    flip_labels(&mut table)?;
    let test = Dataset {
        features: Vec::new(),
        labels: Vec::new(),
        dim: table.dim,
        classes: table.classes,
    };
    Ok(Loaded::Table {
        train: table,
        test,
        parts: flipped_parts,
        rows: None,
    })
}

/// y → classes − 1 − y for every label of `table`.
fn flip_labels(table: &mut Dataset) -> Result<(), LabelFlipError> {
    let classes = table.classes;
    for y in &mut table.labels {
        *y = u32::try_from(classes)
            .ok()
            .and_then(|k| k.checked_sub(*y + 1))
            .ok_or(LabelFlipError::LabelOutOfRange { label: *y, classes })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five rows of one feature (the row's index) and labels 0, 1, 2, 9, 4 of 10 classes.
    fn five_rows() -> Loaded {
        let train =
            Dataset::new(vec![0.0, 1.0, 2.0, 3.0, 4.0], vec![0, 1, 2, 9, 4], 1, 10).unwrap();
        Loaded::Table {
            test: train.clone(),
            train,
            parts: vec![vec![0, 1], vec![2], vec![4, 3]],
            rows: None,
        }
    }

    #[test]
    fn an_attacker_trains_its_own_rows_with_every_label_flipped() {
        let flipped = flipped(&five_rows(), &BTreeSet::from([0, 2])).unwrap();
        let Loaded::Table { train, parts, .. } = flipped else {
            panic!("a table stays a table")
        };
        // Client 0's rows 0, 1 then client 2's rows 4, 3, their labels y → 9 − y.
        assert_eq!(train.features, vec![0.0, 1.0, 4.0, 3.0]);
        assert_eq!(train.labels, vec![9, 8, 5, 0]);
        assert_eq!(train.classes, 10);
        assert_eq!(parts, vec![vec![0, 1], vec![], vec![2, 3]]);
        // Flipping twice is the identity.
        let mut twice = train.clone();
        flip_labels(&mut twice).unwrap();
        assert_eq!(twice.labels, vec![0, 1, 4, 9]);
    }

    #[test]
    fn a_label_outside_the_classes_is_an_error_not_a_wrap() {
        let mut bad = Dataset {
            features: vec![0.0],
            labels: vec![10],
            dim: 1,
            classes: 10,
        };
        assert_eq!(
            flip_labels(&mut bad),
            Err(LabelFlipError::LabelOutOfRange {
                label: 10,
                classes: 10
            })
        );
    }
}
