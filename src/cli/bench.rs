//! `fedshard bench orchestration`: the runtime's own cost per round and per client, measured on
//! a federation whose local work is negligible (each client returns its task unchanged).
//! `fedshard bench train` lives in [`super::bench_train`].

use clap::{Args, Subcommand};
use fedshard_actors::coordinator::{ClientRecord, Registry};
use fedshard_actors::server::{Federation, RuntimeConfig, run};
use fedshard_protocol::model::{ModelState, NamedTensor};
use fedshard_protocol::task::{
    ClientId, EvalError, Evaluation, Evaluator, LocalTrainer, Recipe, TrainError, TrainOutput,
    TrainTask,
};
use fedshard_protocol::uplink::Compressor;
use fedshard_strategies::aggregation::AggregatorName;
use fedshard_strategies::selection::SelectorName;
use fedshard_training::train::slots::OnACore;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// Seconds per round and per-client overhead of the actor runtime.
    Orchestration(OrchestrationArgs),
    /// Local-training throughput of a model (samples per second).
    Train(super::bench_train::TrainBenchArgs),
    /// A config's federation end to end: wall clock, and seconds per round by phase.
    Job(super::bench_job::JobBenchArgs),
    /// One round's local training as the runtime runs it (clients on their own threads, alone
    /// or in cohorts): seconds per round and samples per second.
    Round(super::bench_round::RoundBenchArgs),
    /// Timings of the CUDA kernels a training step waits for (convolution passes, the cohorts'
    /// batched products per strategy); a build with `--features cuda` and an NVIDIA GPU.
    Kernels(super::bench_kernels::KernelBenchArgs),
    /// Per-round cost and bytes on the wire of the cluster transport against the in-process
    /// runtime (client nodes as child processes on loopback).
    Cluster(super::bench_cluster::ClusterBenchArgs),
    /// One client node of `bench cluster` (started by it).
    #[command(hide = true)]
    ClusterNode(super::bench_cluster::ClusterNodeArgs),
}

#[derive(Debug, Args)]
pub struct OrchestrationArgs {
    /// Registered clients.
    #[arg(long, default_value_t = 1000)]
    pub clients: usize,
    /// Clients selected each round (uniformly); every registered client by default.
    #[arg(long)]
    pub per_round: Option<usize>,
    #[arg(long, default_value_t = 5)]
    pub rounds: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct OrchestrationReport {
    pub clients: usize,
    pub per_round: usize,
    pub rounds: u64,
    pub seconds_per_round: f64,
    /// Seconds per round divided by the clients of a round.
    pub per_client_overhead_us: f64,
    pub peak_rss_bytes: u64,
}

impl std::fmt::Display for OrchestrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The targets: 10 µs a client when every client works each round (at 1 000 and at
        // 100 000), 20 µs per working client when a round selects few of many (a million
        // registered, 10 000 a round), where selection must not touch the idle ones.
        let (selected, target) = if self.per_round == self.clients {
            (String::new(), 10)
        } else {
            (format!(" ({} per round)", self.per_round), 20)
        };
        write!(
            f,
            "orchestration: {} clients{selected}, {} rounds: {:.4} s/round, {:.1} µs per client \
             per round (target ≤ {target} µs), peak RSS {:.1} MB \
             ({:.1} KB per client; target < 1 GB at 100 000 clients)",
            self.clients,
            self.rounds,
            self.seconds_per_round,
            self.per_client_overhead_us,
            self.peak_rss_bytes as f64 / 1e6,
            self.peak_rss_bytes as f64 / 1e3 / self.clients as f64
        )
    }
}

/// A client that returns its task unchanged: the benches measure the runtime, not training.
pub(crate) struct EchoTrainer;

impl EchoTrainer {
    /// On the core pool, as a federation runs every trainer it builds.
    pub(crate) fn on_a_core() -> Arc<dyn LocalTrainer> {
        Arc::new(OnACore(Arc::new(EchoTrainer)))
    }
}

impl LocalTrainer for EchoTrainer {
    fn samples(&self) -> u64 {
        1
    }
    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
        Ok(TrainOutput {
            dense: task.dense.clone(),
            shards: task.shards.clone(),
            loss: 0.0,
            control: None,
        })
    }
}

/// An evaluator that costs nothing, for the same reason.
pub(crate) struct NoEvaluation;

impl Evaluator for NoEvaluation {
    fn evaluate(&self, _model: &ModelState) -> Result<Evaluation, EvalError> {
        Ok(Evaluation {
            accuracy: 0.0,
            loss: 0.0,
        })
    }
}

/// Peak resident set size of this process (VmHWM), 0 where /proc is unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

pub fn orchestration(args: &OrchestrationArgs) -> anyhow::Result<OrchestrationReport> {
    let per_round = args.per_round.unwrap_or(args.clients);
    anyhow::ensure!(
        args.clients >= 1 && args.rounds >= 1 && per_round >= 1,
        "--clients, --per-round and --rounds must be at least 1"
    );
    anyhow::ensure!(
        per_round <= args.clients,
        "--per-round {per_round}: at most --clients ({})",
        args.clients
    );
    let trainer = EchoTrainer::on_a_core();
    let ids = 0..args.clients as ClientId;
    let federation = Federation::new(
        RuntimeConfig {
            seed: 0,
            rounds: args.rounds,
            aggregator: AggregatorName::Fedavg,
            sharding: None,
            recipe: Recipe {
                learning_rate: 0.1,
                epochs: 1,
                batch_size: 1,
                momentum: 0.0,
                weight_decay: 0.0,
                clip_lr: None,
                proximal_mu: 0.0,
            },
            cosine_schedule: false,
            deadline: Duration::from_secs(600),
            min_successful: 1,
            compressor: Compressor::Identity,
            compression: Default::default(),
            max_update_norm: None,
            privacy: None,
            secure: None,
            server_optimizer: None,
            over_commit: None,
            asynchronous: None,
            clock: None,
            scaffold: false,
        },
        ModelState::new(vec![NamedTensor::zeros("weight", vec![10])])
            .map_err(anyhow::Error::msg)?,
        Registry {
            clients: ids
                .clone()
                .map(|id| {
                    (
                        id,
                        ClientRecord {
                            id,
                            keep_ratio: 1.0,
                            samples: 1,
                            failures: 0,
                        },
                    )
                })
                .collect(),
            selector: SelectorName::Uniform,
            budget: per_round as f64,
            max_clusters: None,
        },
        Arc::new(NoEvaluation),
    );
    let runtime = crate::runtime::build()?;
    let trainers = ids.map(|id| (id, Arc::clone(&trainer))).collect();
    let (_, summary) = runtime
        .block_on(run(federation, trainers))
        .map_err(anyhow::Error::msg)?;
    let round_seconds: f64 =
        summary.per_round.iter().map(|r| r.seconds).sum::<f64>() / args.rounds as f64;
    Ok(OrchestrationReport {
        clients: args.clients,
        per_round,
        rounds: args.rounds,
        seconds_per_round: round_seconds,
        per_client_overhead_us: round_seconds / per_round as f64 * 1e6,
        peak_rss_bytes: peak_rss_bytes(),
    })
}
