//! The server actor: holds the global model and drives rounds; each [`ClientHost`] registers
//! the clients it keeps with it.
//!
//! Each `NextRound` runs the round engine ([`crate::engine`]) once, until the next model version
//! is applied: a synchronous round (docs/design.md, "One round": ask the coordinator for
//! participants, plan every participant's shards, dispatch tasks under a deadline), an
//! over-committed one (`[federation] over_commit`: ask more clients than needed and close at the
//! first updates accepted), a secure round ([`crate::secure`]) or a FedBuff buffer
//! ([`crate::asynchronous`]). Heavy work (SVD,
//! aggregation, evaluation) runs on blocking threads so the executor keeps delivering messages.

use crate::asynchronous::AsyncRun;
use crate::checkpoint::{self, Checkpoint};
use crate::clock::VirtualClock;
use crate::coordinator::{Coordinator, CoordinatorMsg, Registry, RoundSelection};
use crate::engine::Engine;
use crate::error::Error;
use crate::host::{ClientHandle, ClientHost, HostMsg, stopped_actor};
use crate::record::{RoundRecord, Summary};
use crate::run_folder::{CSV_FILE, METRICS_FILE, VARIATES_DIR};
use crate::schedule::AsyncConfig;
use crate::variates::ClientVariates;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::Sharding;
use fedshard_protocol::task::{ClientId, Evaluator, LocalTrainer, Recipe};
use fedshard_protocol::uplink::state::UplinkState;
use fedshard_protocol::uplink::{CompressionConfig, Compressor};
use fedshard_strategies::aggregation::{Aggregator, AggregatorName};
use fedshard_strategies::server_optimizer::{OptimizerState, ServerOptimizer};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent, call};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The runtime's part of a run configuration (validated by the caller).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    pub seed: u64,
    pub rounds: u64,
    pub aggregator: AggregatorName,
    pub sharding: Option<Sharding>,
    /// The local recipe with the base learning rate.
    pub recipe: Recipe,
    /// Cosine annealing of the learning rate over the run (docs/algorithms.md §1.7), per round.
    pub cosine_schedule: bool,
    /// Time a round waits for its clients; late clients count as `timeout` failures.
    pub deadline: Duration,
    /// Below this many accepted updates the round leaves the model unchanged.
    pub min_successful: usize,
    /// How clients send their updates (`[federation] compressor`).
    pub compressor: Compressor,
    /// The compressors' settings (`[compression]`).
    pub compression: CompressionConfig,
    /// `[federation] max_update_norm`: an update whose norm ‖values − sent‖₂, computed by the
    /// server against its task, exceeds this is rejected as `norm_bound`; `None`, no bound.
    #[serde(default)]
    pub max_update_norm: Option<f64>,
    /// `[federation] over_commit` c: a round asks ⌈c · m⌉ clients and closes at the first ⌊m⌋
    /// accepted updates ([`crate::coordinator::over_committed`]); the others are `late`. `None`:
    /// wait for all.
    #[serde(default)]
    pub over_commit: Option<f64>,
    /// `[federation] mode = "async"` and its settings; `None`: synchronous rounds.
    #[serde(default)]
    pub asynchronous: Option<AsyncConfig>,
    /// The cost model of simulated time ([`VirtualClock`]): with `--clock virtual`, deadlines,
    /// over-commitment and async arrivals go by it and nothing sleeps; on the wall clock it is
    /// there only when the stragglers simulate a training time (`base_delay_ms`), and orders
    /// the answers ([`crate::schedule::Arrivals`]) so that over-commitment's cut-off and async
    /// arrivals depend on the seed alone.
    #[serde(default)]
    pub clock: Option<VirtualClock>,
    /// `[privacy]`: DP-FedAvg with its accountant (docs/privacy.md); `None`, updates are
    /// folded in the clear.
    #[serde(default)]
    pub privacy: Option<crate::privacy::PrivacySettings>,
    /// `[secure_aggregation]`: the server folds each round from the sum of its updates alone
    /// ([`crate::secure`]); `None`, updates arrive in the clear.
    #[serde(default)]
    pub secure: Option<crate::secure::SecureSettings>,
    /// `[server_optimizer]`: the step the server takes with each aggregate's change
    /// (docs/algorithms.md §10); `None`, the aggregate is the new model.
    #[serde(default)]
    pub server_optimizer: Option<ServerOptimizer>,
    /// `[federation] scaffold`: SCAFFOLD's control variates correct every local step, and the
    /// server keeps its own variate `c` (docs/algorithms.md §12).
    #[serde(default)]
    pub scaffold: bool,
}

impl RuntimeConfig {
    /// Learning rate of round `round` (1-based).
    pub fn learning_rate(&self, round: u64) -> f64 {
        let base = self.recipe.learning_rate;
        if !self.cosine_schedule || self.rounds <= 1 {
            return base;
        }
        let progress = (round - 1) as f64 / self.rounds as f64;
        0.5 * base * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Everything a federation needs to start (or resume).
pub struct Federation {
    pub config: RuntimeConfig,
    pub model: ModelState,
    pub registry: Registry,
    pub evaluator: Arc<dyn Evaluator>,
    /// Where checkpoints and `metrics.jsonl` go; `None` keeps the run in memory.
    pub run_dir: Option<PathBuf>,
    /// Rounds already completed (from a checkpoint).
    pub history: Vec<RoundRecord>,
    /// Receives every round's record as soon as it is written.
    pub events: Option<mpsc::UnboundedSender<RoundRecord>>,
    /// What the compressor remembers between rounds (block ends, QSGD's symbol counts).
    pub uplink: UplinkState,
    /// The server optimizer's moments (empty without one).
    pub optimizer: OptimizerState,
    /// SCAFFOLD's server variate `c` (empty without SCAFFOLD; zeros of the model's tensors
    /// before the first round).
    pub control: ModelState,
    /// A program's own aggregation policy, used in place of the one `config.aggregator`
    /// names (`examples/custom_aggregator.rs`); the engine checks it against the schedule,
    /// privacy and secure aggregation by the same rules ([`crate::policies::Policies::check_with`]).
    /// `None`: the named one.
    pub aggregator: Option<Arc<dyn Aggregator>>,
    /// The clients that send malicious updates (`[faults.byzantine]`, drawn from the seed as
    /// the clients draw them), known here only to count them in each round's record; empty
    /// without.
    pub byzantine: BTreeSet<ClientId>,
}

impl Federation {
    /// A fresh run in memory: no run folder, no rounds completed, no listener, an empty uplink
    /// state, the aggregator the config names. Set the public fields to change any of these.
    pub fn new(
        config: RuntimeConfig,
        model: ModelState,
        registry: Registry,
        evaluator: Arc<dyn Evaluator>,
    ) -> Self {
        Federation {
            config,
            model,
            registry,
            evaluator,
            run_dir: None,
            history: Vec::new(),
            events: None,
            uplink: UplinkState::default(),
            optimizer: OptimizerState::default(),
            control: ModelState::default(),
            aggregator: None,
            byzantine: BTreeSet::new(),
        }
    }

    /// Continues from the checkpoint in `run_dir`: model, registry and history are replaced by
    /// the checkpoint's, and `metrics.jsonl` and `metrics.csv` are rewritten from the history so
    /// they hold exactly the completed rounds. A folder without a checkpoint is an error that
    /// leaves it untouched: starting again from round 1 would overwrite the run's outputs.
    pub fn resume_from_checkpoint(&mut self) -> Result<(), Error> {
        let Some(dir) = &self.run_dir else {
            return Err(Error::Invalid {
                field: "run_dir",
                expected: "the run folder to resume",
                found: "none".into(),
            });
        };
        let Some(cp) = checkpoint::load(dir)? else {
            return Err(Error::NoCheckpoint { dir: dir.clone() });
        };
        if cp.seed != self.config.seed {
            return Err(Error::SeedMismatch {
                dir: dir.clone(),
                found: cp.seed,
                expected: self.config.seed,
            });
        }
        cp.model
            .check_compatible(&self.model)
            .map_err(|e| Error::IncompatibleModel(e.to_string()))?;
        if self.config.asynchronous.is_some() {
            tracing::warn!(
                "resuming an async run from model version {}: the partial buffer and the work \
                 outstanding at the checkpoint are dropped and re-issued",
                cp.history.len()
            );
        }
        self.model = cp.model;
        self.registry = cp.registry;
        self.history = cp.history;
        self.uplink = cp.uplink;
        self.optimizer = cp.optimizer;
        self.control = cp.control;
        let mut lines = String::new();
        for r in &self.history {
            lines.push_str(&serde_json::to_string(r)?);
            lines.push('\n');
        }
        checkpoint::write_atomically(&dir.join(METRICS_FILE), lines.as_bytes())?;
        let csv = crate::record::csv_document(&self.history);
        checkpoint::write_atomically(&dir.join(CSV_FILE), &csv)?;
        Ok(())
    }
}

/// Runs the federation to its last round in this process and returns the final model and
/// summary. The clients are hosted by a [`ClientHost`] beside the server, as a client node
/// would host them: the server owns no trainer, it only talks to client actors that registered.
pub async fn run(
    federation: Federation,
    trainers: BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
) -> Result<(ModelState, Summary), Error> {
    let (done, mut finished) = oneshot::channel();
    let (run_dir, scaffold) = (federation.run_dir.clone(), federation.config.scaffold);
    let resumed = !federation.history.is_empty();
    let (server, server_handle) = match Actor::spawn(None, Server, (federation, done)).await {
        Ok(spawned) => spawned,
        // A run the engine refuses says why through `done` before the server gives up.
        Err(e) => {
            return Err(match finished.try_recv() {
                Ok(Err(refused)) => refused,
                _ => Error::Spawn {
                    actor: "server",
                    reason: e.to_string(),
                },
            });
        }
    };
    // Under SCAFFOLD the clients' variates live in the run folder, so that `--resume` finds
    // them where the killed run left them.
    let variates = match (&run_dir, scaffold, resumed) {
        (Some(dir), true, true) => {
            ClientVariates::open(&dir.join(VARIATES_DIR), trainers.keys().copied())?
        }
        (Some(dir), true, false) => ClientVariates::fresh(&dir.join(VARIATES_DIR))?,
        _ => ClientVariates::in_memory(),
    };
    // The host registers every client before `Start` is sent, so round 1 sees them all.
    let (host, host_handle) = Actor::spawn(None, ClientHost, (server.clone(), trainers, variates))
        .await
        .map_err(|e| Error::Spawn {
            actor: "client host",
            reason: e.to_string(),
        })?;
    server
        .send_message(ServerMsg::Start)
        .map_err(|e| Error::ServerStopped(e.to_string()))?;
    let result = finished.await.map_err(|_| Error::NoResult)?;
    host.stop(None);
    server.stop(None);
    let _ = host_handle.await;
    let _ = server_handle.await;
    result
}

pub struct Server;

pub enum ServerMsg {
    /// `host` keeps `clients` and spawns their actors for the work it is sent.
    Register {
        clients: Vec<ClientId>,
        host: ActorRef<HostMsg>,
    },
    /// Clients can be reached: start the first round, or go on after a [`ServerMsg::Hold`].
    Start,
    /// No client can be reached (a server node that lost every client node): finish the round
    /// in flight, then wait for the next `Start` instead of running rounds that nobody answers.
    Hold,
    /// Run the next round.
    NextRound,
}

/// Whether rounds may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Before the first `Start`.
    Waiting,
    Running,
    /// A `Hold` came; the next round has not asked to run yet.
    Held,
    /// A `Hold` came and the next round waits for `Start`.
    Parked,
}

pub struct ServerState {
    pub(crate) fed: Federation,
    pub(crate) coordinator: ActorRef<CoordinatorMsg>,
    /// The registered clients and their hosts; a selected client without one is `unreachable`.
    pub(crate) clients: BTreeMap<ClientId, ClientHandle>,
    done: Option<DoneSender>,
    /// The round engine: the run's schedule and aggregator.
    pub(crate) engine: Engine,
    /// Async mode: the work in flight, kept between model versions.
    pub(crate) asynchronous: Option<AsyncRun>,
    flow: Flow,
    /// [`RuntimeConfig::clock`], shared with each round's [`crate::schedule::Arrivals`].
    pub(crate) clock: Option<Arc<VirtualClock>>,
}

/// Where the run's result goes: the final model and summary, or why it stopped.
pub type DoneSender = oneshot::Sender<Result<(ModelState, Summary), Error>>;

impl Actor for Server {
    type Msg = ServerMsg;
    type State = ServerState;
    type Arguments = (Federation, DoneSender);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (mut fed, done): Self::Arguments,
    ) -> Result<ServerState, ActorProcessingErr> {
        // SCAFFOLD's server variate starts at zero (Algorithm 1's c = 0), unless a checkpoint
        // brought it.
        if fed.config.scaffold && fed.control.tensors.is_empty() {
            fed.control = fed.model.zeros_like();
        }
        let engine = match Engine::new(&fed.config, &fed.registry, fed.aggregator.clone()) {
            Ok(engine) => engine,
            Err(refused) => {
                let why = refused.to_string();
                let _ = done.send(Err(refused));
                return Err(why.into());
            }
        };
        let (coordinator, _) =
            Actor::spawn_linked(None, Coordinator, fed.registry.clone(), myself.get_cell()).await?;
        Ok(ServerState {
            coordinator,
            clients: BTreeMap::new(),
            done: Some(done),
            engine,
            asynchronous: None,
            flow: Flow::Waiting,
            clock: fed.config.clock.clone().map(Arc::new),
            fed,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut ServerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ServerMsg::Register { clients, host } => {
                let (known, unknown): (Vec<ClientId>, Vec<ClientId>) = clients
                    .into_iter()
                    .partition(|c| state.fed.registry.clients.contains_key(c));
                if !unknown.is_empty() {
                    tracing::warn!(
                        "{} client(s) the registry does not know tried to register (first: {}); ignored",
                        unknown.len(),
                        unknown[0]
                    );
                }
                for client in known {
                    let host = host.clone();
                    state.clients.insert(client, ClientHandle { host, client });
                }
            }
            ServerMsg::Start => {
                let parked = matches!(state.flow, Flow::Waiting | Flow::Parked);
                state.flow = Flow::Running;
                if parked {
                    myself.send_message(ServerMsg::NextRound)?;
                }
            }
            ServerMsg::Hold => {
                if state.flow == Flow::Running {
                    state.flow = Flow::Held;
                }
            }
            ServerMsg::NextRound => {
                let round = state.fed.history.len() as u64 + 1;
                if round > state.fed.config.rounds {
                    state.finish(Ok(()));
                    return Ok(());
                }
                if let Some(spent) = state.engine.privacy_budget_reached(round) {
                    tracing::warn!(
                        "stopping before round {round}: its release would take ε to {:.3}, past \
                         [privacy] target_epsilon",
                        spent
                    );
                    state.finish(Ok(()));
                    return Ok(());
                }
                if state.flow != Flow::Running {
                    tracing::warn!("round {round} waits until a client can be reached");
                    state.flow = Flow::Parked;
                    return Ok(());
                }
                match state.step(round).await {
                    Ok(()) => myself.send_message(ServerMsg::NextRound)?,
                    Err(e) => state.finish(Err(Error::Round {
                        round,
                        source: Box::new(e),
                    })),
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut ServerState,
    ) -> Result<(), ActorProcessingErr> {
        if stopped_actor(&event) == Some(state.coordinator.get_id()) && state.done.is_some() {
            state.finish(Err(Error::CoordinatorDied));
        }
        Ok(())
    }
}

impl ServerState {
    fn finish(&mut self, result: Result<(), Error>) {
        if let Some(done) = self.done.take() {
            let summary = Summary::from_history(&self.fed.history)
                .with_privacy(self.fed.config.privacy.as_ref());
            let _ = done.send(result.map(|()| (self.fed.model.clone(), summary)));
        }
    }

    pub(crate) async fn select(
        &self,
        round: u64,
        norms: Option<BTreeMap<ClientId, f64>>,
        budget: Option<f64>,
    ) -> Result<RoundSelection, Error> {
        let seed = self.fed.config.seed;
        call!(self.coordinator, |reply| CoordinatorMsg::Select {
            seed,
            round,
            norms,
            budget,
            reply
        })
        .map_err(|e| Error::CoordinatorUnreachable(e.to_string()))?
    }

    /// How long the wall clock waits for a client: the deadline, or under simulated time (whose
    /// deadline is simulated) an hour at least, a guard against a client that hangs for real.
    pub(crate) fn wall_deadline(&self) -> Duration {
        let deadline = self.fed.config.deadline;
        match &self.clock {
            Some(clock) if clock.is_virtual() => deadline.max(Duration::from_secs(3600)),
            _ => deadline,
        }
    }

    /// The simulated time the next round starts at: the end of the last one recorded.
    pub(crate) fn simulated_now(&self) -> f64 {
        self.fed
            .history
            .iter()
            .rev()
            .find_map(|r| r.time.as_ref().map(|t| t.end))
            .unwrap_or(0.0)
    }

    /// Checkpoint first, then the metrics lines (JSON, then CSV): a crash between them is repaired
    /// on resume, which rewrites `metrics.jsonl` and `metrics.csv` from the checkpoint's history.
    pub(crate) async fn persist(&mut self, record: &RoundRecord) -> Result<(), Error> {
        let Some(dir) = self.fed.run_dir.clone() else {
            return Ok(());
        };
        let registry = call!(self.coordinator, |reply| CoordinatorMsg::Snapshot { reply })
            .map_err(|e| Error::CoordinatorUnreachable(e.to_string()))?;
        self.fed.registry = registry.clone();
        let cp = Checkpoint {
            seed: self.fed.config.seed,
            rounds_completed: record.round,
            model: self.fed.model.clone(),
            registry,
            history: self.fed.history.clone(),
            uplink: self.fed.uplink.clone(),
            optimizer: self.fed.optimizer.clone(),
            control: self.fed.control.clone(),
        };
        let line = serde_json::to_string(record)?;
        let record = record.clone();
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            checkpoint::save(&dir, &cp)?;
            let path = dir.join(METRICS_FILE);
            let io = |source| Error::Io {
                path: path.clone(),
                source,
            };
            let mut file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(io)?;
            writeln!(file, "{line}").map_err(io)?;
            crate::record::append_csv_row(&dir.join(CSV_FILE), &record)
        })
        .await
        .map_err(|e| Error::panicked("checkpoint writer", e))?
    }
}

/// p_k of each participant of a selection.
pub(crate) fn selection_probabilities(selection: &RoundSelection) -> BTreeMap<ClientId, f64> {
    selection
        .participants
        .iter()
        .map(|p| p.0)
        .zip(selection.probabilities.iter().copied())
        .collect()
}
