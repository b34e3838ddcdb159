//! `fedshard bench round`: one round's local training, the way the runtime runs it, in seconds
//! per round and samples per second: C clients of N samples each train E epochs from the same
//! model (or, at a keep ratio below 1, each from its own shards of one sub-model shape), every
//! client on its own thread as the client actors call their trainers, scheduled
//! by the process's core pool alone (`--cohorts off`: one client per core) or in cohorts
//! (`--cohorts on`). No server, selection or aggregation: those are `bench job`'s.
//!
//! `scripts/torch_reference.py --round` runs the same round as a plain PyTorch loop that
//! trains the clients one after another, as a Flower or pfl-research simulation worker does.

use super::OnOff;
use super::bench::peak_rss_bytes;
use super::bench_train::{BenchModel, setup};
use super::profile::profiled;
use crate::config::{Device, TrainingSection};
use clap::Args;
use fedshard_protocol::task::{Recipe, TrainTask};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use fedshard_training::train::neural::{Examples, Rows, round_tasks};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct RoundBenchArgs {
    #[arg(long, value_enum)]
    pub model: BenchModel,
    /// Clients in the round.
    #[arg(long, default_value_t = 10)]
    pub clients: usize,
    /// Training samples of each client (drawn with replacement from the model's example pool).
    #[arg(long, default_value_t = 500)]
    pub samples: usize,
    /// Rows per SGD step (default: the model's, as `bench train`).
    #[arg(long)]
    pub batch: Option<usize>,
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Keep ratio of every shardable layer (1 = dense). Below 1 each client gets its own
    /// Unbiased shards of one sub-model shape, as one cluster of a sharded round: one cohort.
    #[arg(long, default_value_t = 1.0)]
    pub keep_ratio: f64,
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Cohorts on or off (default off, as `training.cohorts`).
    #[arg(long, value_enum, value_name = "on|off")]
    pub cohorts: Option<OnOff>,
    /// The most clients one cohort trains at once.
    #[arg(long, default_value_t = 16)]
    pub cohort_size: usize,
    /// Timed rounds, after one warm-up round (which includes a GPU's kernel compilation).
    #[arg(long, default_value_t = 2)]
    pub rounds: u64,
    /// Write a sampling profile of the timed rounds (every thread) to this file as folded
    /// stacks (a build with `--features profile`).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct RoundBenchReport {
    pub model: BenchModel,
    pub device: Device,
    /// On the CPU, the micro-kernels its matrix products ran on (`Device::products`): the
    /// figure belongs to that path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub products: Option<&'static str>,
    pub cohorts: bool,
    pub clients: usize,
    pub samples: usize,
    pub batch: usize,
    pub epochs: usize,
    pub keep_ratio: f64,
    pub threads: usize,
    /// Each timed round's wall clock.
    pub seconds_per_round: Vec<f64>,
    /// Samples trained per second over the timed rounds (clients × samples × epochs a round).
    pub samples_per_second: f64,
    /// Peak resident set size of the process (host memory; a GPU's is not included).
    pub peak_rss_bytes: u64,
}

pub fn round(args: &RoundBenchArgs) -> anyhow::Result<RoundBenchReport> {
    anyhow::ensure!(
        args.clients >= 1 && args.samples >= 1 && args.epochs >= 1 && args.rounds >= 1,
        "--clients, --samples, --epochs and --rounds must be at least 1"
    );
    anyhow::ensure!(args.cohort_size >= 1, "--cohort-size must be at least 1");
    anyhow::ensure!(
        args.keep_ratio > 0.0 && args.keep_ratio <= 1.0,
        "--keep-ratio: expected a ratio in (0, 1], found {}",
        args.keep_ratio
    );
    let s = setup(args.model)?;
    let batch = args.batch.unwrap_or(s.batch);
    anyhow::ensure!(batch >= 1, "--batch must be at least 1");
    let pool: Arc<dyn Examples> = Arc::from(s.examples);
    let examples = (0..args.clients)
        .map(|c| {
            let mut rng = stream(0, 0, c as u64, Purpose::Experiment);
            let rows = (0..args.samples)
                .map(|_| ((uniform(&mut rng) * pool.len() as f64) as usize).min(pool.len() - 1))
                .collect();
            Box::new(Rows {
                examples: Arc::clone(&pool),
                rows,
            }) as Box<dyn Examples>
        })
        .collect();
    let training = TrainingSection {
        device: args.device,
        cohorts: args.cohorts.is_some_and(OnOff::is_on),
        cohort_size: args.cohort_size,
        ..TrainingSection::default()
    };
    let trainers = crate::federation::neural_clients(&training, &s.architecture, examples)?;
    let (state, shardable) = s.architecture.initial_state(1)?;
    let (dense, shards) = round_tasks(&state, &shardable, args.keep_ratio, args.clients, 1)
        .map_err(anyhow::Error::msg)?;
    // scripts/torch_reference.py's round: SGD at 0.05 with momentum 0.5 and decay 1e-4 (and,
    // for a sub-model, ClipLR as `bench train` sets it).
    let recipe = Recipe {
        learning_rate: 0.05,
        epochs: args.epochs,
        batch_size: batch,
        momentum: 0.5,
        weight_decay: 1e-4,
        clip_lr: (args.keep_ratio < 1.0).then_some(10.0),
        proximal_mu: 0.0,
    };
    let run_round = |round: u64| -> anyhow::Result<f64> {
        let started = Instant::now();
        std::thread::scope(|scope| {
            let workers: Vec<_> = trainers
                .iter()
                .zip(&shards)
                .enumerate()
                .map(|(c, (trainer, shards))| {
                    let task = TrainTask {
                        round,
                        client: c as u64,
                        seed: 1,
                        dense: dense.clone(),
                        width: None,
                        shards: shards.clone(),
                        recipe: recipe.clone(),
                        uplink: Default::default(),
                        variates: None,
                    };
                    scope.spawn(move || trainer.train(&task).map(|_| ()))
                })
                .collect();
            for (c, worker) in workers.into_iter().enumerate() {
                worker
                    .join()
                    .map_err(|_| anyhow::anyhow!("client {c}'s thread panicked"))?
                    .map_err(|e| anyhow::anyhow!("client {c}: {e}"))?;
            }
            anyhow::Ok(())
        })?;
        Ok(started.elapsed().as_secs_f64())
    };
    run_round(0)?;
    let seconds = profiled(args.profile.as_deref(), || {
        (1..=args.rounds)
            .map(run_round)
            .collect::<anyhow::Result<Vec<f64>>>()
    })?;
    let trained = (args.clients * args.samples * args.epochs) as f64 * seconds.len() as f64;
    Ok(RoundBenchReport {
        model: args.model,
        device: args.device,
        products: args.device.products(),
        cohorts: training.cohorts,
        clients: args.clients,
        samples: args.samples,
        batch,
        epochs: args.epochs,
        keep_ratio: args.keep_ratio,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        samples_per_second: trained / seconds.iter().sum::<f64>(),
        seconds_per_round: seconds,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// The human-readable line of a report.
pub fn describe(r: &RoundBenchReport) -> String {
    let rounds: Vec<String> = r
        .seconds_per_round
        .iter()
        .map(|s| format!("{s:.3}"))
        .collect();
    format!(
        "round {:?} on {}, cohorts {}: {} clients × {} samples × {} epochs at batch {}, keep ratio {}, {} core(s): {} s per round, {:.0} samples/s, peak RSS {:.0} MB",
        r.model,
        r.device.label(),
        if r.cohorts { "on" } else { "off" },
        r.clients,
        r.samples,
        r.epochs,
        r.batch,
        r.keep_ratio,
        r.threads,
        rounds.join(" / "),
        r.samples_per_second,
        r.peak_rss_bytes as f64 / 1e6
    )
}
