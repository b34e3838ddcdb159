//! A federation of a program's own network and data (`examples/custom_model.rs`,
//! `examples/custom_dataset.rs`): what a config's `[model]` and `[data]` sections would load,
//! handed over as values, under the [`Settings`] of the rest of a config.
//!
//! The network is any [`Network`], built through the same `Builder` as the shipped models, so
//! every layer it builds shardable is sharded by the run's strategy and trained on the same
//! kernels; the data is one example set per client (the program's own partition) and a
//! held-out set for the server's evaluation. Everything else is the federation a config
//! builds: the same registry, runtime config, engine and trainers.

use super::trainers::EVAL_BATCH;
use super::{Trainers, registry, runtime_config, sharding};
use crate::config::{Device, Settings};
use burn::module::AutodiffModule;
use fedshard_actors::server::Federation;
use fedshard_protocol::task::{ClientId, LocalTrainer};
use fedshard_protocol::uplink::Compressor;
use fedshard_training::models::NetError;
use fedshard_training::models::network::Network;
use fedshard_training::train::neural::{
    Cpu, CpuTraining, Examples, LocalMethod, NeuralClient, NeuralEvaluator,
};
use fedshard_training::train::slots::OnACore;
use std::sync::Arc;

/// A program's own network and data, in place of a config's `[model]` and `[data]`.
pub struct Own<N> {
    /// The network every client trains and the server evaluates.
    pub network: N,
    /// One example set per client, client `c` at index `c` (its size is the client's D_c).
    pub clients: Vec<Box<dyn Examples>>,
    /// The server's held-out set.
    pub test: Box<dyn Examples>,
}

/// Why an own network and data cannot make a federation.
#[derive(Debug, thiserror::Error)]
pub enum OwnError {
    /// A section of the settings is out of its range (the message names the field).
    #[error("{0:#}")]
    Settings(anyhow::Error),
    /// A setting that needs what only a config's `[model]` and `[data]` give.
    #[error("field `{field}`: {why}")]
    Unsupported {
        field: &'static str,
        why: &'static str,
    },
    #[error("no client example sets: expected one per client")]
    NoClients,
    /// An example set whose rows the network cannot read.
    #[error("{part}: rows of {found} features, expected the network's input width {expected}")]
    Width {
        part: String,
        found: usize,
        expected: usize,
    },
    #[error("{part}: no examples")]
    Empty { part: String },
    /// Keep ratios below 1 ask for sub-models, and the network built no shardable layer.
    #[error(
        "field `federation.keep_ratios`: a keep ratio below 1 needs a shardable layer, and the \
         network built none (build one with `shardable = true`)"
    )]
    NothingToShard,
    #[error("the network does not build: {0}")]
    Network(#[from] NetError),
}

impl<N: Network> Own<N>
where
    N::Module<CpuTraining>: AutodiffModule<CpuTraining>,
{
    /// The server side and every client's trainer, all in this process (run them with
    /// [`super::run`]): the initial model drawn from `[run] seed` through the network's
    /// builder, every weight it built shardable sharded by `[federation] strategy`, each client
    /// training on a core of the pool on the CPU.
    pub fn federation(self, settings: &Settings) -> Result<(Federation, Trainers), OwnError> {
        let Own {
            network,
            clients,
            test,
        } = self;
        if clients.is_empty() {
            return Err(OwnError::NoClients);
        }
        settings
            .validate(clients.len())
            .map_err(OwnError::Settings)?;
        refuse_unwired(settings)?;
        let width = network.input_width();
        let parts = clients
            .iter()
            .enumerate()
            .map(|(c, e)| (format!("client {c}"), e.as_ref()));
        for (part, examples) in parts.chain([("the test set".to_string(), test.as_ref())]) {
            if examples.is_empty() {
                return Err(OwnError::Empty { part });
            }
            if examples.width() != width {
                return Err(OwnError::Width {
                    part,
                    found: examples.width(),
                    expected: width,
                });
            }
        }
        let seed = settings.run.seed;
        let (initial, shardable) = network.initial_state(seed)?;
        if settings.federation.partial() && shardable.is_empty() {
            return Err(OwnError::NothingToShard);
        }
        let samples: Vec<u64> = clients.iter().map(|e| e.len() as u64).collect();
        let config = runtime_config(
            &settings.run,
            &settings.federation,
            &settings.training,
            Default::default(),
            sharding(
                &settings.federation,
                (!shardable.is_empty(), shardable),
                network.width_groups(),
                "program's own",
            )
            .map_err(OwnError::Settings)?,
            settings.server_optimizer,
        );
        let trainers = clients
            .into_iter()
            .enumerate()
            .map(|(c, examples)| {
                let client = NeuralClient::<CpuTraining, N> {
                    architecture: network.clone(),
                    examples,
                    device: Default::default(),
                    method: LocalMethod::Sgd,
                };
                let trainer: Arc<dyn LocalTrainer> = Arc::new(OnACore(Arc::new(client)));
                (c as ClientId, trainer)
            })
            .collect();
        let evaluator = Arc::new(NeuralEvaluator::<Cpu, N> {
            architecture: network,
            examples: test,
            device: Default::default(),
            batch_size: EVAL_BATCH,
        });
        let federation = Federation::new(
            config,
            initial,
            registry(&settings.federation, &samples, seed),
            evaluator,
        );
        Ok((federation, trainers))
    }
}

/// What an own federation does not wire, refused rather than ignored: each needs a part of a
/// whole config (simulated time its `[devices]`, a compressor its `[compression]`) or a trainer
/// written for the shipped architectures (CUDA, cohorts).
fn refuse_unwired(settings: &Settings) -> Result<(), OwnError> {
    let unsupported = |field, why| Err(OwnError::Unsupported { field, why });
    if settings.run.clock != fedshard_actors::clock::ClockKind::Wall {
        return unsupported(
            "run.clock",
            "expected `wall`: simulated time needs a config's [devices] and [network]",
        );
    }
    if settings.federation.compressor != Compressor::Identity {
        return unsupported(
            "federation.compressor",
            "expected `identity`: a compressor's settings are a config's [compression]",
        );
    }
    if settings.training.device != Device::Cpu {
        return unsupported(
            "training.device",
            "expected `cpu`: an own network trains on the CPU backend",
        );
    }
    if settings.training.cohorts {
        return unsupported(
            "training.cohorts",
            "expected `false`: cohorts gather the shipped architectures' clients only",
        );
    }
    Ok(())
}
