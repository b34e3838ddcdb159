//! Turns a validated [`Config`] into the two halves of a federation: [`server`] builds the
//! server side (model, registry with every client's D_c, evaluator, runtime config) and
//! [`clients`] builds the trainers of the given client ids, on whichever node hosts them. Both
//! load and partition the data the same way, so a client node trains exactly the data the
//! in-process run gives that client.
//!
//! The config is resolved once, at the start of each of these, into the [`Model`] it trains;
//! the data loading, the trainers, the evaluator and the initial model all take that.
//!
//! Here: the two halves and a whole run in this process. `loaded` loads and partitions the
//! data (and shows the partition), `trainers` turns loaded data into trainers and the
//! evaluator on the configured device, `cuda` is that device's backend (or the error saying
//! how to build it), `byzantine` relabels the data of label-flipping attackers.

mod byzantine;
mod loaded;
mod own;
mod trainers;

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "no_cuda.rs"]
mod cuda;

pub use byzantine::LabelFlipError;
/// The CUDA device, checked usable (for `bench train --device cuda`).
#[cfg(feature = "cuda")]
pub use cuda::device as cuda_device;
pub use loaded::{Partition, partition};
pub use own::{Own, OwnError};
pub use trainers::neural_clients;

use crate::config::{
    Config, FederationSection, KeepRatioShare, Model, RunSection, TrainingSection,
};
use anyhow::Context;
use fedshard_actors::coordinator::{ClientRecord, Registry};
use fedshard_actors::faults::FaultyTrainer;
use fedshard_actors::faults::byzantine::Attack;
use fedshard_actors::record::{RoundRecord, Summary};
use fedshard_actors::schedule::Schedule as EngineSchedule;
use fedshard_actors::server::{Federation, RuntimeConfig};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::{Sharding, ShardingPolicy};
use fedshard_protocol::task::{ClientId, DEFAULT_CLIP_LR, Evaluator, LocalTrainer, Recipe};
use fedshard_protocol::uplink::CompressionConfig;
use fedshard_protocol::width::{WidthGroup, WidthPolicy};
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::server_optimizer::ServerOptimizer;
use fedshard_strategies::sharding::strategy::Strategy;
use fedshard_training::data;
use loaded::{Loaded, load};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use trainers::Gatherer;

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
/// ([`fedshard_training::train::slots::OnACore`]; with the fault wrapper around it when the config has `[faults]`): client `c`
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
    recipe_of(&config.federation, &config.training)
}

/// [`recipe`] from the two sections it reads.
fn recipe_of(f: &FederationSection, t: &TrainingSection) -> Recipe {
    Recipe {
        clip_lr: f
            .strategy
            .uses_clip_lr()
            .then(|| t.recipe.clip_lr.unwrap_or(DEFAULT_CLIP_LR)),
        ..t.recipe.clone()
    }
}

/// How `f` shards a model whose resolved `model.sharded_layers` are `layers` and whose hidden
/// widths are `widths`, when `sharded` (the config names layers to shard at all): none when it
/// does not; a spectral strategy factorises `layers` (none: nothing sharded); a width strategy
/// slices every hidden width (the model's own description, docs/algorithms.md §8), and is
/// refused for a model that describes none.
pub fn sharding(
    f: &FederationSection,
    (sharded, layers): (bool, Vec<String>),
    widths: Vec<WidthGroup>,
    model: &str,
) -> anyhow::Result<Option<Sharding>> {
    if !sharded {
        return Ok(None);
    }
    Ok(Some(match f.strategy {
        Strategy::Spectral(_) if layers.is_empty() => return Ok(None),
        Strategy::Spectral(strategy) => Sharding::Spectral(ShardingPolicy {
            strategy,
            sampler: f.sampler,
            layers,
        }),
        Strategy::Width(strategy) if widths.is_empty() => anyhow::bail!(
            "field `federation.strategy`: `{strategy}` slices a model's hidden widths, and the \
             {model} model has none a cut can narrow; width strategies slice an MLP with hidden \
             layers, the digits and MNIST CNNs, the char transformer, ResNet-18, CCT, and the \
             layers of an ONNX graph whose outputs the trace follows to the next layer \
             (docs/algorithms.md §8, docs/onnx.md \"Width strategies\")"
        ),
        Strategy::Width(strategy) => Sharding::Width(WidthPolicy {
            strategy,
            groups: widths,
        }),
    }))
}

/// The runtime config of `[run]`, `[federation]` and `[training]` sharded as `sharding`, in
/// the clear and on the wall clock (the caller adds simulated time, privacy and secure
/// aggregation where its config has them).
fn runtime_config(
    run: &RunSection,
    f: &FederationSection,
    t: &TrainingSection,
    compression: CompressionConfig,
    sharding: Option<Sharding>,
    server_optimizer: Option<ServerOptimizer>,
) -> RuntimeConfig {
    RuntimeConfig {
        seed: run.seed,
        rounds: run.rounds,
        aggregator: f.aggregator,
        sharding,
        recipe: recipe_of(f, t),
        cosine_schedule: t.cosine_schedule,
        deadline: Duration::from_millis(f.deadline_ms),
        min_successful: f.min_successful,
        compressor: f.compressor,
        compression,
        max_update_norm: f.max_update_norm,
        over_commit: match f.schedule.engine() {
            EngineSchedule::Rounds { over_commit } => over_commit,
            EngineSchedule::Buffered(_) => None,
        },
        asynchronous: match f.schedule.engine() {
            EngineSchedule::Rounds { .. } => None,
            EngineSchedule::Buffered(settings) => Some(settings),
        },
        clock: None,
        privacy: None,
        secure: None,
        server_optimizer,
        scaffold: f.scaffold,
    }
}

/// The registry of clients with `samples[c]` examples each (D_c), their keep ratios drawn by
/// [`keep_ratios`] under `f`.
fn registry(f: &FederationSection, samples: &[u64], seed: u64) -> Registry {
    let ratios = keep_ratios(samples.len(), &f.keep_ratios, seed);
    let clients = samples
        .iter()
        .zip(ratios)
        .enumerate()
        .map(|(i, (&samples, keep_ratio))| {
            let id = i as ClientId;
            let record = ClientRecord {
                id,
                keep_ratio,
                samples,
                failures: 0,
            };
            (id, record)
        })
        .collect();
    Registry {
        clients,
        selector: f.selector,
        budget: f.clients_per_round,
        max_clusters: f.max_clusters,
    }
}

fn server_side(config: &Config, model: &Model, loaded: Loaded) -> anyhow::Result<Federation> {
    let seed = config.run.seed;
    let sizes = loaded.sizes();
    if flips_labels(config) {
        byzantine::labelled(&loaded)?;
    }
    let evaluator = loaded.into_evaluator(model, seed)?;
    let runtime = runtime_config(
        &config.run,
        &config.federation,
        &config.training,
        config.compression.clone().unwrap_or_default(),
        sharding(
            &config.federation,
            (
                !config.model.sharded_layers().is_empty(),
                config.model.resolved_sharded_layers(),
            ),
            model.width_groups(),
            config.model.kind(),
        )?,
        config.server_optimizer,
    );
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
        privacy: config.privacy.as_ref().map(|p| p.settings(config)),
        secure: config.secure_aggregation.as_ref().map(|s| s.settings()),
        ..runtime
    };
    let mut federation = Federation::new(
        runtime,
        initial,
        registry(&config.federation, &sizes, seed),
        evaluator,
    );
    federation.byzantine = config
        .faults
        .as_ref()
        .map(|plan| plan.byzantine_clients(seed, sizes.len()))
        .unwrap_or_default();
    Ok(federation)
}

/// Whether `config`'s byzantine clients flip their labels (`[faults.byzantine] kind =
/// "label-flip"`).
fn flips_labels(config: &Config) -> bool {
    config
        .faults
        .as_ref()
        .and_then(|plan| plan.byzantine)
        .is_some_and(|b| b.attack() == Attack::LabelFlip)
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
    let gatherer = Gatherer::of(&config.training)?;
    // Label-flipping attackers train on their rows relabelled, with the same gatherer, so
    // they share the honest clients' cohorts.
    let attackers: BTreeSet<ClientId> = match &config.faults {
        Some(plan) if flips_labels(config) => plan
            .byzantine_clients(config.run.seed, count)
            .into_iter()
            .filter(|id| ids.contains(id))
            .collect(),
        _ => BTreeSet::new(),
    };
    let honest: Vec<ClientId> = ids
        .iter()
        .copied()
        .filter(|id| !attackers.contains(id))
        .collect();
    let mut trainers = loaded.trainers(model, &honest, &gatherer)?;
    if flips_labels(config) {
        let relabelled = byzantine::flipped(loaded, &attackers)?;
        let attacking: Vec<ClientId> = attackers.into_iter().collect();
        trainers.extend(relabelled.trainers(model, &attacking, &gatherer)?);
    }
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
pub fn run_to_end(config: &Config) -> anyhow::Result<(ModelState, Summary)> {
    run_to_end_watching(config, &mut |_| {})
}

/// [`run_to_end`], calling `on_round` with each round's record as the round ends (a grid's
/// progress lines).
pub fn run_to_end_watching(
    config: &Config,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> anyhow::Result<(ModelState, Summary)> {
    let (federation, trainers) = in_process(config)?;
    run_watching(federation, trainers, on_round)
}

/// Runs `federation` with `trainers` (every client in this process) to its last round on a
/// tokio runtime of its own, and returns the final model and summary: for programs that
/// assemble or adjust a federation before it runs (`examples/`: an own aggregator in
/// [`Federation::aggregator`], an own network and data from [`Own::federation`]).
pub fn run(federation: Federation, trainers: Trainers) -> anyhow::Result<(ModelState, Summary)> {
    run_watching(federation, trainers, &mut |_| {})
}

/// [`run`], calling `on_round` with each round's record as the round ends.
pub fn run_watching(
    mut federation: Federation,
    trainers: Trainers,
    on_round: &mut dyn FnMut(&RoundRecord),
) -> anyhow::Result<(ModelState, Summary)> {
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

/// Keep ratio of each client: the configured shares, rounded to whole clients (the last share
/// takes the remainder), laid over a seeded permutation of the clients.
pub fn assign_keep_ratios(config: &Config, seed: u64) -> Vec<f64> {
    keep_ratios(config.data.clients(), &config.federation.keep_ratios, seed)
}

/// [`assign_keep_ratios`] for `k` clients and the `shares` of `[federation] keep_ratios`.
fn keep_ratios(k: usize, shares: &[KeepRatioShare], seed: u64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..k).collect();
    data::shuffle(&mut order, &mut stream(seed, 0, 0, Purpose::KeepRatios));
    let mut ratios = vec![1.0; k];
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
