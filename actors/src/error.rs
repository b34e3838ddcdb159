//! The actor runtime's errors: one enum a caller can match, whose `Display` names the thing that
//! failed and what was expected of it.

use crate::checkpoint::CheckpointError;
use fedshard_protocol::task::{ClientId, EvalError};
use fedshard_strategies::StrategyError;
use fedshard_strategies::selection::SelectorName;
use std::path::PathBuf;

/// What can stop a round, a run, or the runtime's set-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A policy the run was configured with cannot take part in its schedule (checked when the
    /// round engine is built, before any client trains, by [`crate::policies::Policies::check`]).
    #[error("{policy} `{name}` cannot run {schedule}: {why}")]
    Unsupported {
        policy: Policy,
        name: String,
        schedule: &'static str,
        why: &'static str,
    },
    /// A setting outside its domain; `field` is its name in the config.
    #[error("field `{field}`: expected {expected}, found {found}")]
    Invalid {
        field: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("no live client to select")]
    NoLiveClient,
    #[error("selector {selector}: {source}")]
    Selector {
        selector: SelectorName,
        source: StrategyError,
    },
    #[error("aggregator {name}: {source}")]
    Aggregator {
        name: &'static str,
        source: StrategyError,
    },
    /// The server optimizer's step could not be taken (its moments do not fit the model).
    #[error("server optimizer {name}: {source}")]
    ServerOptimizer {
        name: &'static str,
        source: StrategyError,
    },
    /// The privacy accountant or clipping refused its settings.
    #[error("privacy: {0}")]
    Privacy(StrategyError),
    /// A secure-aggregation session could not be set up or finished.
    #[error("secure aggregation: {0}")]
    SecureAggregation(fedshard_secagg::Error),
    #[error("client {0} is not in the registry")]
    UnknownClient(ClientId),
    /// An accepted update that does not fit the model it is folded into.
    #[error("client {client}: {reason}")]
    Update { client: ClientId, reason: String },
    #[error("no client can be given work (none registered)")]
    NoClient,
    /// The shard plan of a round (its SVDs and draws).
    #[error("sharding plan: {0}")]
    Plan(#[source] fedshard_protocol::Error),
    /// The hand-out of an async version built no task for the client it picked.
    #[error("no task was built for client {0}")]
    NoTask(ClientId),
    /// The compressor's settings for a task.
    #[error("uplink settings: {0}")]
    Uplink(#[source] fedshard_protocol::Error),
    /// The compressor's memory after the aggregate of `version`.
    #[error("uplink state after version {version}: {source}")]
    UplinkState {
        version: u64,
        source: fedshard_protocol::Error,
    },
    /// The held-out evaluation of the new model failed: the model no longer fits the
    /// evaluator, which no round may hide behind a NaN accuracy.
    #[error("evaluation: {0}")]
    Evaluation(#[from] EvalError),
    /// Blocking work (plan, aggregate, evaluation, checkpoint writer) panicked.
    #[error("{what} panicked: {reason}")]
    Panicked { what: &'static str, reason: String },
    #[error("{actor} failed to start: {reason}")]
    Spawn { actor: &'static str, reason: String },
    #[error("coordinator unreachable: {0}")]
    CoordinatorUnreachable(String),
    #[error("the coordinator died")]
    CoordinatorDied,
    #[error("server stopped before the first round: {0}")]
    ServerStopped(String),
    #[error("server stopped without a result")]
    NoResult,
    #[error("round {round}: {source}")]
    Round { round: u64, source: Box<Error> },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// SCAFFOLD's client variates cannot be read from or kept in their folder.
    #[error(transparent)]
    Variates(#[from] crate::variates::VariatesError),
    /// A resume of a folder without a checkpoint: starting over from round 1 would overwrite
    /// the outputs of whatever ran there.
    #[error(
        "{} holds no {file} to resume from (a run writes one after each round); start the run \
         afresh with its config instead of --resume",
        .dir.display(),
        file = crate::run_folder::CHECKPOINT_FILE
    )]
    NoCheckpoint { dir: PathBuf },
    #[error("checkpoint in {dir} was written with seed {found}, the config says {expected}")]
    SeedMismatch {
        dir: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("checkpoint model does not fit the configured model: {0}")]
    IncompatibleModel(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("a round record as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot serve metrics on {addr}: {source}")]
    Serve {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The policy an [`Error::Unsupported`] refuses: a caller that reads a config maps it to its
/// field, and its `Display` is the policy's name in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    Aggregator,
    Selector,
    /// Buffered asynchronous aggregation as a whole.
    Mode,
    /// Closing a round at its first accepted updates.
    OverCommit,
    /// The server's bound on each update's norm.
    MaxUpdateNorm,
    Compressor,
    /// How the clients of a private release are drawn.
    Sampling,
    /// The layers sent as factor columns.
    ShardedLayers,
    /// The sharding strategy.
    Strategy,
    /// Secure aggregation as a whole.
    SecureAggregation,
    /// Differential privacy as a whole.
    Privacy,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Aggregator => "aggregator",
            Policy::Selector => "selector",
            Policy::Mode => "mode",
            Policy::OverCommit => "over-commitment",
            Policy::MaxUpdateNorm => "update-norm bound",
            Policy::Compressor => "compressor",
            Policy::Sampling => "sampling",
            Policy::ShardedLayers => "sharded layers",
            Policy::Strategy => "strategy",
            Policy::SecureAggregation => "secure aggregation",
            Policy::Privacy => "differential privacy",
        })
    }
}

impl Error {
    /// A panic (or cancellation) of blocking work, from its join error.
    pub(crate) fn panicked(what: &'static str, e: tokio::task::JoinError) -> Self {
        Error::Panicked {
            what,
            reason: e.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
