//! `dataset = "files"`: the user's own data as NPZ/NPY arrays, a CSV table or an image folder.
//!
//! The TOML keeps every field flat beside `dataset` (`format = "csv"`, `label_column = "…"`,
//! …); it is read as a flat [`RawFiles`] and converted once into [`FilesSection`], whose types
//! carry only what the chosen format and split use, with errors that name the field.

use super::check;
use super::data::{LabelSplit, default_test_fraction};
use fedshard_training::data::user::normalize::Normalization;
use fedshard_training::data::user::{CsvColumns, Format};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A `files` dataset, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawFiles", into = "RawFiles")]
pub struct FilesSection {
    /// Number of clients K (with a natural split, the number of distinct client ids).
    pub clients: usize,
    /// The training file (npz, csv) or folder (npy, images).
    pub path: PathBuf,
    pub format: Format,
    /// Where the test rows come from.
    pub test: TestSet,
    /// The number of classes, when stated; every class in `0..classes` must then have rows.
    pub classes: Option<usize>,
    pub normalize: Normalization,
    /// How the training rows are dealt to the clients.
    pub split: ClientSplit,
}

/// The test rows: a second file of the same format, or a stratified held-out fraction.
#[derive(Debug, Clone, PartialEq)]
pub enum TestSet {
    File(PathBuf),
    Fraction(f64),
}

/// How the training rows are dealt to the clients.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientSplit {
    /// One client per client id of the file (the `client` array or column, the `CLIENT`
    /// folders).
    Natural,
    /// Dirichlet(α·p) label skew and lognormal sizes, as for the other datasets.
    Dirichlet(LabelSplit),
}

/// `[data]` of `dataset = "files"` as the TOML writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFiles {
    clients: usize,
    format: FormatName,
    path: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    test_path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    test_fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    classes: Option<usize>,
    normalize: RawNormalize,
    #[serde(default)]
    natural_split: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    label_column: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    feature_columns: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_column: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    alpha: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size_sigma: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_samples: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum FormatName {
    Npz,
    Npy,
    Csv,
    Images,
}

impl FormatName {
    fn as_str(self) -> &'static str {
        match self {
            FormatName::Npz => "npz",
            FormatName::Npy => "npy",
            FormatName::Csv => "csv",
            FormatName::Images => "images",
        }
    }
}

/// `normalize = "none" | "standardize" | { mean = [...], std = [...] }`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum RawNormalize {
    Name(String),
    Given { mean: Vec<f32>, std: Vec<f32> },
}

/// The client column's name when a natural split does not say.
const DEFAULT_CLIENT_COLUMN: &str = "client";

impl TryFrom<RawFiles> for FilesSection {
    type Error = String;

    /// Refuses a field of another format or split, and two test sets.
    fn try_from(raw: RawFiles) -> Result<Self, String> {
        let refuse = |name: &str, expected: &str, found: String| {
            Err(format!(
                "field `data.{name}`: expected {expected}, found {found}"
            ))
        };
        let csv_only = [
            ("label_column", raw.label_column.is_some()),
            ("feature_columns", raw.feature_columns.is_some()),
            ("client_column", raw.client_column.is_some()),
        ];
        let format = match raw.format {
            FormatName::Csv => {
                let Some(label) = raw.label_column.clone() else {
                    return refuse(
                        "label_column",
                        "the name of the CSV label column with format = \"csv\"",
                        "nothing".into(),
                    );
                };
                if raw.client_column.is_some() && !raw.natural_split {
                    return refuse(
                        "client_column",
                        "no value without natural_split = true",
                        format!("{:?}", raw.client_column),
                    );
                }
                Format::Csv(CsvColumns {
                    label,
                    features: raw.feature_columns.clone(),
                    client: (raw.client_column.clone())
                        .unwrap_or_else(|| DEFAULT_CLIENT_COLUMN.into()),
                })
            }
            other => {
                if let Some((name, _)) = csv_only.iter().find(|(_, set)| *set) {
                    return refuse(name, "no value: it is a field of format = \"csv\"", {
                        format!("a value with format = {:?}", other.as_str())
                    });
                }
                match other {
                    FormatName::Npz => Format::Npz,
                    FormatName::Npy => Format::Npy,
                    _ => Format::Images,
                }
            }
        };
        let test = match (raw.test_path.clone(), raw.test_fraction) {
            (Some(_), Some(f)) => {
                return refuse(
                    "test_fraction",
                    "no value with `data.test_path` (the test rows are that file's)",
                    f.to_string(),
                );
            }
            (Some(path), None) => TestSet::File(path),
            (None, fraction) => TestSet::Fraction(fraction.unwrap_or_else(default_test_fraction)),
        };
        let normalize = match raw.normalize.clone() {
            RawNormalize::Name(name) if name == "none" => Normalization::None,
            RawNormalize::Name(name) if name == "standardize" => Normalization::Standardize,
            RawNormalize::Name(name) => {
                return refuse(
                    "normalize",
                    "\"none\", \"standardize\" or { mean = [...], std = [...] }",
                    format!("{name:?}"),
                );
            }
            RawNormalize::Given { mean, std } => Normalization::Given { mean, std },
        };
        let split = match raw.natural_split {
            true => {
                let given = [
                    ("alpha", raw.alpha.is_some()),
                    ("size_sigma", raw.size_sigma.is_some()),
                    ("min_samples", raw.min_samples.is_some()),
                ];
                if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
                    return refuse(
                        name,
                        "no value with natural_split = true (the file's client ids split the rows)",
                        "a value".into(),
                    );
                }
                ClientSplit::Natural
            }
            false => ClientSplit::Dirichlet(LabelSplit {
                alpha: raw.alpha,
                size_sigma: raw.size_sigma.unwrap_or(0.0),
                min_samples: raw.min_samples.unwrap_or(1),
            }),
        };
        Ok(FilesSection {
            clients: raw.clients,
            path: raw.path,
            format,
            test,
            classes: raw.classes,
            normalize,
            split,
        })
    }
}

impl From<FilesSection> for RawFiles {
    fn from(files: FilesSection) -> Self {
        let (format, label_column, feature_columns, client_column) = match files.format {
            Format::Npz => (FormatName::Npz, None, None, None),
            Format::Npy => (FormatName::Npy, None, None, None),
            Format::Images => (FormatName::Images, None, None, None),
            Format::Csv(columns) => {
                let natural = files.split == ClientSplit::Natural;
                let client = natural.then_some(columns.client);
                (
                    FormatName::Csv,
                    Some(columns.label),
                    columns.features,
                    client,
                )
            }
        };
        let (test_path, test_fraction) = match files.test {
            TestSet::File(path) => (Some(path), None),
            TestSet::Fraction(f) => (None, Some(f)),
        };
        let normalize = match files.normalize {
            Normalization::None => RawNormalize::Name("none".into()),
            Normalization::Standardize => RawNormalize::Name("standardize".into()),
            Normalization::Given { mean, std } => RawNormalize::Given { mean, std },
        };
        let (natural_split, alpha, size_sigma, min_samples) = match files.split {
            ClientSplit::Natural => (true, None, None, None),
            ClientSplit::Dirichlet(s) => (false, s.alpha, Some(s.size_sigma), Some(s.min_samples)),
        };
        RawFiles {
            clients: files.clients,
            format,
            path: files.path,
            test_path,
            test_fraction,
            classes: files.classes,
            normalize,
            natural_split,
            label_column,
            feature_columns,
            client_column,
            alpha,
            size_sigma,
            min_samples,
        }
    }
}

impl FilesSection {
    /// The Dirichlet split's fields, when the rows are not split by the file's client ids.
    pub fn label_split(&self) -> Option<&LabelSplit> {
        match &self.split {
            ClientSplit::Dirichlet(split) => Some(split),
            ClientSplit::Natural => None,
        }
    }

    /// The ranges the types cannot express. That the files exist is left to the loader, whose
    /// error names the field and the file: a config is valid before `fedshard data
    /// export-digits` has written the files it reads.
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        if let TestSet::Fraction(f) = self.test {
            check(
                "data.test_fraction",
                f > 0.0 && f < 1.0,
                "a fraction in (0, 1)",
                f.to_string(),
            )?;
        }
        if let Some(classes) = self.classes {
            check(
                "data.classes",
                classes >= 2,
                "at least 2",
                classes.to_string(),
            )?;
        }
        Ok(())
    }
}
