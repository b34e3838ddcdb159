//! Turns a validated [`Config`] into a runnable [`Federation`]: loads and partitions the data,
//! assigns keep ratios, builds each client's trainer and the server's evaluator.

use crate::config::{Config, DatasetName, Device};
use crate::data;
use crate::models::net::Architecture;
use crate::train::neural::{
    CharWindows, Cpu, CpuTraining, Examples, NeuralClient, NeuralEvaluator,
};
use crate::train::{SoftmaxClient, SoftmaxEvaluator, initial_model, synthetic_clients};
use anyhow::Context;
use fedshard_actors::coordinator::{ClientRecord, Registry};
use fedshard_actors::faults::FaultyTrainer;
use fedshard_actors::round::ShardingPolicy;
use fedshard_actors::server::{Federation, RuntimeConfig};
use fedshard_actors::trainer::{ClientId, Evaluator, LocalTrainer, Recipe};
use fedshard_strategies::rng::{Purpose, stream};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Builds the federation of `config` (no run folder, no event sink: the caller sets those).
pub fn build(config: &Config) -> anyhow::Result<Federation> {
    let seed = config.run.seed;
    let (trainers, evaluator): Participants = match config.data.dataset {
        DatasetName::Digits => {
            let all = data::digits::load().context("loading the embedded digits")?;
            let (train, test) = data::split::train_test(&all, config.data.test_fraction, seed)
                .context("field `data.test_fraction`")?;
            let parts = dirichlet_parts(config, &train)?;
            match &config.model.network {
                Some(net) => neural_clients(config, net, &train, test, &parts)?,
                None => {
                    let mut trainers: Vec<Arc<dyn LocalTrainer>> = Vec::with_capacity(parts.len());
                    for p in &parts {
                        trainers.push(Arc::new(SoftmaxClient {
                            data: train.subset(p)?,
                        }));
                    }
                    (trainers, Arc::new(SoftmaxEvaluator { test }))
                }
            }
        }
        DatasetName::Cifar10 | DatasetName::Cifar100 | DatasetName::Mnist => {
            let net = config
                .model
                .network
                .as_ref()
                .context("field `model.network`: image datasets need a neural model")?;
            let (train, test, parts) = local_images(config)?;
            neural_clients(config, net, &train, test, &parts)?
        }
        DatasetName::Shakespeare => {
            let net = config
                .model
                .network
                .as_ref()
                .context("field `model.network`: shakespeare needs a char-transformer")?;
            let (train, test) = shakespeare_windows(config, net.input_width())?;
            let mut trainers: Vec<Arc<dyn LocalTrainer>> = Vec::with_capacity(train.len());
            for windows in train {
                trainers.push(neural_trainer(config, net, Box::new(windows))?);
            }
            (trainers, neural_evaluator(config, net, Box::new(test))?)
        }
        DatasetName::SyntheticLinear => {
            let (clients, evaluator, _theta) = synthetic_clients(
                config.data.clients,
                config.data.dim,
                config.data.gamma,
                config.data.test_samples,
                seed,
            )
            .map_err(anyhow::Error::msg)?;
            (
                clients
                    .into_iter()
                    .map(|c| Arc::new(c) as Arc<dyn LocalTrainer>)
                    .collect(),
                Arc::new(evaluator),
            )
        }
    };
    let keep_ratios = assign_keep_ratios(config, seed);
    let mut by_id: BTreeMap<ClientId, Arc<dyn LocalTrainer>> = BTreeMap::new();
    let mut clients = BTreeMap::new();
    for (i, trainer) in trainers.into_iter().enumerate() {
        let id = i as ClientId;
        let samples = trainer.samples();
        let trainer: Arc<dyn LocalTrainer> = match &config.faults {
            Some(plan) => Arc::new(FaultyTrainer {
                inner: trainer,
                plan: plan.clone(),
            }),
            None => trainer,
        };
        by_id.insert(id, trainer);
        clients.insert(
            id,
            ClientRecord {
                id,
                keep_ratio: keep_ratios[i],
                samples,
                alive: true,
                failures: 0,
            },
        );
    }
    let f = &config.federation;
    let t = &config.training;
    let layers = config.model.resolved_sharded_layers()?;
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
        recipe: Recipe {
            learning_rate: t.learning_rate,
            epochs: t.epochs,
            batch_size: t.batch_size,
            momentum: t.momentum,
            weight_decay: t.weight_decay,
            clip_lr: f.strategy.uses_clip_lr().then_some(t.clip_tau),
        },
        cosine_schedule: t.cosine_schedule,
        deadline: Duration::from_millis(f.deadline_ms),
        min_successful: f.min_successful,
        encoding: f.encoding,
    };
    Ok(Federation {
        config: runtime,
        model: initial_model(config, seed),
        registry: Registry {
            clients,
            selector: f.selector,
            budget: f.clients_per_round,
            max_clusters: f.max_clusters,
        },
        trainers: by_id,
        evaluator,
        run_dir: None,
        history: Vec::new(),
        events: None,
    })
}

/// Builds the federation of `config` and runs it to its last round on a tokio runtime of its
/// own, without a run folder: for tests and for programs that embed fedshard.
pub fn run_to_end(
    config: &Config,
) -> anyhow::Result<(
    fedshard_actors::model::ModelState,
    fedshard_actors::record::Summary,
)> {
    let federation = build(config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime
        .block_on(fedshard_actors::server::run(federation))
        .map_err(anyhow::Error::msg)
}

/// The clients' index lists of a Dirichlet(`data.alpha`·p) label split of `train` (iid when
/// `alpha` is omitted).
fn dirichlet_parts(config: &Config, train: &data::Dataset) -> anyhow::Result<Vec<Vec<usize>>> {
    let spec = data::partition::PartitionSpec {
        clients: config.data.clients,
        alpha: config.data.alpha.unwrap_or(f64::INFINITY),
        size_sigma: config.data.size_sigma,
        min_samples: config.data.min_samples,
    };
    data::partition::partition(&train.labels, train.classes, &spec, config.run.seed)
        .context("field `data`: partitioning the training set")
}

/// The training set, test set and client split of a dataset read from `data.path`: the files'
/// own train/test split; CIFAR-100 with `data.fine_alpha` is split by two-stage Pachinko
/// (every client gets ⌊train / clients⌋ images), the others by [`dirichlet_parts`].
fn local_images(
    config: &Config,
) -> anyhow::Result<(data::Dataset, data::Dataset, Vec<Vec<usize>>)> {
    use data::cifar::{Split, load_cifar10, load_cifar100};
    let d = &config.data;
    let dir = d.path.as_deref().context("field `data.path`: missing")?;
    let dir_context = || format!("field `data.path` ({})", dir.display());
    Ok(match d.dataset {
        DatasetName::Cifar10 => {
            let train = load_cifar10(dir, Split::Train).with_context(dir_context)?;
            let test = load_cifar10(dir, Split::Test).with_context(dir_context)?;
            let parts = dirichlet_parts(config, &train)?;
            (train, test, parts)
        }
        DatasetName::Cifar100 => {
            let train = load_cifar100(dir, Split::Train).with_context(dir_context)?;
            let test = load_cifar100(dir, Split::Test)
                .with_context(dir_context)?
                .data;
            let parts = match d.fine_alpha {
                Some(alpha_fine) => {
                    let spec = data::pachinko::PachinkoSpec {
                        clients: d.clients,
                        samples_per_client: train.data.len() / d.clients,
                        alpha_coarse: d.alpha.unwrap_or(f64::INFINITY),
                        alpha_fine,
                    };
                    data::pachinko::pachinko(
                        &train.data.labels,
                        &train.coarse,
                        &spec,
                        config.run.seed,
                    )
                    .context("fields `data.alpha`, `data.fine_alpha`: the Pachinko split")?
                }
                None => dirichlet_parts(config, &train.data)?,
            };
            (train.data, test, parts)
        }
        DatasetName::Mnist => {
            let train = data::idx::load_mnist(dir, true).with_context(dir_context)?;
            let test = data::idx::load_mnist(dir, false).with_context(dir_context)?;
            let parts = dirichlet_parts(config, &train)?;
            (train, test, parts)
        }
        other => anyhow::bail!("field `data.dataset`: {other:?} is not read from `data.path`"),
    })
}

/// Every client's trainer and the server's evaluator.
type Participants = (Vec<Arc<dyn LocalTrainer>>, Arc<dyn Evaluator>);

/// One neural trainer per index list of `train`, and the evaluator on `test`.
fn neural_clients(
    config: &Config,
    net: &Architecture,
    train: &data::Dataset,
    test: data::Dataset,
    parts: &[Vec<usize>],
) -> anyhow::Result<Participants> {
    let mut trainers: Vec<Arc<dyn LocalTrainer>> = Vec::with_capacity(parts.len());
    for p in parts {
        trainers.push(neural_trainer(config, net, Box::new(train.subset(p)?))?);
    }
    Ok((trainers, neural_evaluator(config, net, Box::new(test))?))
}

/// The Shakespeare clients' training windows and a seeded sample of `data.test_samples` test
/// windows from all clients' test texts.
fn shakespeare_windows(
    config: &Config,
    context: usize,
) -> anyhow::Result<(Vec<CharWindows>, CharWindows)> {
    let root = match &config.data.cache {
        Some(dir) => dir.clone(),
        None => data::files::default_cache_root().context(
            "field `data.cache`: no cache directory given and none found ($FEDSHARD_CACHE, $XDG_CACHE_HOME, $HOME)",
        )?,
    };
    let clients = data::shakespeare::load_shakespeare(
        &root,
        config.data.min_lines,
        Some(config.data.clients),
        config.run.seed,
    )?;
    let mut test_text = Vec::new();
    let mut test_starts = Vec::new();
    let mut train = Vec::with_capacity(clients.len());
    for client in clients {
        let codes = client.test.codes();
        let offset = test_text.len();
        test_starts.extend((0..codes.len().saturating_sub(context)).map(|i| offset + i));
        test_text.extend_from_slice(codes);
        let mut windows = CharWindows::all(client.train.codes().to_vec(), context);
        if let Some(cap) = config.data.max_samples {
            let mut rng = stream(config.run.seed, 0, 2 + train.len() as u64, Purpose::Data);
            data::shuffle(&mut windows.starts, &mut rng);
            windows.starts.truncate(cap);
            windows.starts.sort_unstable();
        }
        train.push(windows);
    }
    let mut rng = stream(config.run.seed, 0, 1, Purpose::Data);
    data::shuffle(&mut test_starts, &mut rng);
    test_starts.truncate(config.data.test_samples);
    test_starts.sort_unstable();
    let test = CharWindows {
        text: test_text,
        starts: test_starts,
        context,
    };
    Ok((train, test))
}

/// A client training `net` on `examples` on the configured device.
fn neural_trainer(
    config: &Config,
    net: &Architecture,
    examples: Box<dyn Examples>,
) -> anyhow::Result<Arc<dyn LocalTrainer>> {
    Ok(match config.training.device {
        Device::Cpu => Arc::new(NeuralClient::<CpuTraining> {
            architecture: net.clone(),
            examples,
            device: Default::default(),
        }),
        Device::Cuda => cuda::trainer(net, examples)?,
    })
}

/// Rows per evaluation forward pass.
const EVAL_BATCH: usize = 256;

/// The server's evaluator of `net` on the held-out `examples`.
fn neural_evaluator(
    config: &Config,
    net: &Architecture,
    examples: Box<dyn Examples>,
) -> anyhow::Result<Arc<dyn Evaluator>> {
    Ok(match config.training.device {
        Device::Cpu => Arc::new(NeuralEvaluator::<Cpu> {
            architecture: net.clone(),
            examples,
            device: Default::default(),
            batch_size: EVAL_BATCH,
        }),
        Device::Cuda => cuda::evaluator(net, examples)?,
    })
}

/// The CUDA backend, compiled only with the `cuda` feature; without it, asking for CUDA is an
/// error that says how to get it.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use burn::backend::{Autodiff, Cuda, cuda::CudaDevice};

    /// Fails with a clear message when no GPU or driver is present (burn panics on first use).
    fn device() -> anyhow::Result<CudaDevice> {
        let device = CudaDevice::default();
        let probe = std::panic::catch_unwind(|| {
            burn::tensor::Tensor::<Cuda, 1>::zeros([1], &device).into_data()
        });
        match probe {
            Ok(_) => Ok(device),
            Err(_) => anyhow::bail!(
                "field `training.device`: CUDA was selected, but no usable NVIDIA GPU or driver was found; use `cpu`"
            ),
        }
    }

    pub fn trainer(
        net: &Architecture,
        examples: Box<dyn Examples>,
    ) -> anyhow::Result<Arc<dyn LocalTrainer>> {
        Ok(Arc::new(NeuralClient::<Autodiff<Cuda>> {
            architecture: net.clone(),
            examples,
            device: device()?,
        }))
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

    pub fn trainer(
        _: &Architecture,
        _: Box<dyn Examples>,
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
    let k = config.data.clients;
    let mut order: Vec<usize> = (0..k).collect();
    data::shuffle(&mut order, &mut stream(seed, 0, 0, Purpose::Data));
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
