//! The server actor: holds the global model, drives rounds, supervises the clients.
//!
//! One round (DESIGN.md "One round"): ask the coordinator for participants, plan every
//! participant's shards, dispatch tasks under a deadline, decode and validate each update,
//! aggregate in client-id order, evaluate, checkpoint, report. Heavy work (SVD, aggregation,
//! evaluation) runs on blocking threads so the executor keeps delivering messages.

use crate::checkpoint::{self, Checkpoint, FORMAT_VERSION};
use crate::client::{ClientActor, ClientMsg, ClientReply, UpdateEnvelope};
use crate::coordinator::{Coordinator, CoordinatorMsg, Registry, RoundSelection};
use crate::model::ModelState;
use crate::payload::{DecodedUpdate, Encoding, decode_and_validate};
use crate::record::{RoundRecord, Summary};
use crate::round::{
    Participant, ShardPlan, ShardingPolicy, WeightedUpdate, aggregate, dense_part, plan_shards,
};
use crate::trainer::{ClientId, Evaluator, LocalTrainer, Recipe, TrainTask};
use fedshard_strategies::aggregation::{AggregatorName, Contribution, Failure, RoundOutcome};
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent, call};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

/// The runtime's part of a run configuration (validated by the caller).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    pub seed: u64,
    pub rounds: u64,
    pub aggregator: AggregatorName,
    pub sharding: Option<ShardingPolicy>,
    /// The local recipe with the base learning rate.
    pub recipe: Recipe,
    /// Cosine annealing of the learning rate over the run (ALGORITHMS.md §1.7), per round.
    pub cosine_schedule: bool,
    /// Time a round waits for its clients; late clients count as `timeout` failures.
    pub deadline: Duration,
    /// Below this many accepted updates the round leaves the model unchanged.
    pub min_successful: usize,
    pub encoding: Encoding,
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
    pub trainers: BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
    pub evaluator: Arc<dyn Evaluator>,
    /// Where checkpoints and `metrics.jsonl` go; `None` keeps the run in memory.
    pub run_dir: Option<PathBuf>,
    /// Rounds already completed (from a checkpoint).
    pub history: Vec<RoundRecord>,
    /// Receives every round's record as soon as it is written.
    pub events: Option<mpsc::UnboundedSender<RoundRecord>>,
}

impl Federation {
    /// Continues from the checkpoint in `run_dir`, if there is one: model, registry and history
    /// are replaced by the checkpoint's, and `metrics.jsonl` is rewritten from the history so it
    /// holds exactly the completed rounds.
    pub fn resume_from_checkpoint(&mut self) -> Result<bool, String> {
        let Some(dir) = &self.run_dir else {
            return Ok(false);
        };
        let Some(cp) = checkpoint::load(dir).map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        if cp.seed != self.config.seed {
            return Err(format!(
                "checkpoint in {} was written with seed {}, the config says {}",
                dir.display(),
                cp.seed,
                self.config.seed
            ));
        }
        cp.model
            .check_compatible(&self.model)
            .map_err(|e| format!("checkpoint model does not fit the configured model: {e}"))?;
        self.model = cp.model;
        self.registry = cp.registry;
        self.history = cp.history;
        let mut lines = String::new();
        for r in &self.history {
            lines.push_str(&serde_json::to_string(r).map_err(|e| e.to_string())?);
            lines.push('\n');
        }
        checkpoint::write_atomically(&dir.join("metrics.jsonl"), lines.as_bytes())
            .map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// Runs the federation to its last round and returns the final model and summary.
pub async fn run(federation: Federation) -> Result<(ModelState, Summary), String> {
    let (done, finished) = oneshot::channel();
    let (server, handle) = Actor::spawn(None, Server, (federation, done))
        .await
        .map_err(|e| format!("server failed to start: {e}"))?;
    let result = finished
        .await
        .map_err(|_| "server stopped without a result".to_string())?;
    server.stop(None);
    let _ = handle.await;
    result
}

pub struct Server;

pub enum ServerMsg {
    /// Run the next round.
    NextRound,
}

pub struct ServerState {
    fed: Federation,
    coordinator: ActorRef<CoordinatorMsg>,
    clients: BTreeMap<ClientId, ActorRef<ClientMsg>>,
    by_actor: HashMap<ActorId, ClientId>,
    done: Option<oneshot::Sender<Result<(ModelState, Summary), String>>>,
}

type DoneSender = oneshot::Sender<Result<(ModelState, Summary), String>>;

impl Actor for Server {
    type Msg = ServerMsg;
    type State = ServerState;
    type Arguments = (Federation, DoneSender);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (fed, done): Self::Arguments,
    ) -> Result<ServerState, ActorProcessingErr> {
        let (coordinator, _) =
            Actor::spawn_linked(None, Coordinator, fed.registry.clone(), myself.get_cell()).await?;
        let mut state = ServerState {
            fed,
            coordinator,
            clients: BTreeMap::new(),
            by_actor: HashMap::new(),
            done: Some(done),
        };
        let ids: Vec<ClientId> = state.fed.trainers.keys().copied().collect();
        for id in ids {
            state.spawn_client(id, myself.get_cell()).await?;
        }
        myself.send_message(ServerMsg::NextRound)?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut ServerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ServerMsg::NextRound => {
                let round = state.fed.history.len() as u64 + 1;
                if round > state.fed.config.rounds {
                    state.finish(Ok(()));
                    return Ok(());
                }
                match state.run_round(round).await {
                    Ok(()) => myself.send_message(ServerMsg::NextRound)?,
                    Err(e) => state.finish(Err(format!("round {round}: {e}"))),
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut ServerState,
    ) -> Result<(), ActorProcessingErr> {
        let dead = match &event {
            SupervisionEvent::ActorFailed(cell, _) => Some(cell.get_id()),
            SupervisionEvent::ActorTerminated(cell, _, _) => Some(cell.get_id()),
            _ => None,
        };
        if let Some(actor) = dead {
            if let Some(client) = state.by_actor.remove(&actor) {
                if state.done.is_some() {
                    tracing::warn!(client, "client actor died; restarting it");
                    state.spawn_client(client, myself.get_cell()).await?;
                }
            } else if actor == state.coordinator.get_id() && state.done.is_some() {
                state.finish(Err("the coordinator died".into()));
            }
        }
        Ok(())
    }
}

/// How a dispatched client ended its phase.
enum Outcome {
    Reply(ClientReply),
    Timeout,
    Unreachable(String),
}

impl ServerState {
    async fn spawn_client(
        &mut self,
        id: ClientId,
        supervisor: ActorCell,
    ) -> Result<(), ActorProcessingErr> {
        let trainer = Arc::clone(&self.fed.trainers[&id]);
        let (actor, _) = Actor::spawn_linked(None, ClientActor, (id, trainer), supervisor).await?;
        self.by_actor.insert(actor.get_id(), id);
        self.clients.insert(id, actor);
        Ok(())
    }

    fn finish(&mut self, result: Result<(), String>) {
        if let Some(done) = self.done.take() {
            let summary = Summary::from_history(&self.fed.history);
            let _ = done.send(result.map(|()| (self.fed.model.clone(), summary)));
        }
    }

    async fn select(
        &self,
        round: u64,
        norms: Option<BTreeMap<ClientId, f64>>,
    ) -> Result<RoundSelection, String> {
        let seed = self.fed.config.seed;
        call!(self.coordinator, |reply| CoordinatorMsg::Select {
            seed,
            round,
            norms,
            reply
        })
        .map_err(|e| format!("coordinator unreachable: {e}"))?
    }

    /// Sends every task and waits for the replies until the deadline.
    async fn dispatch(
        &self,
        messages: Vec<(ClientId, Option<Box<TrainTask>>)>,
        upload: bool,
        round: u64,
    ) -> BTreeMap<ClientId, Outcome> {
        let deadline = self.fed.config.deadline;
        let encoding = self.fed.config.encoding;
        let mut set = JoinSet::new();
        for (id, task) in messages {
            let Some(actor) = self.clients.get(&id).cloned() else {
                continue;
            };
            set.spawn(async move {
                let result = match task {
                    Some(task) => {
                        actor
                            .call(
                                |reply| ClientMsg::Train {
                                    task,
                                    upload,
                                    encoding,
                                    reply,
                                },
                                Some(deadline),
                            )
                            .await
                    }
                    None => {
                        actor
                            .call(|reply| ClientMsg::Upload { round, reply }, Some(deadline))
                            .await
                    }
                };
                let outcome = match result {
                    Ok(ractor::rpc::CallResult::Success(reply)) => Outcome::Reply(reply),
                    Ok(ractor::rpc::CallResult::Timeout) => Outcome::Timeout,
                    Ok(ractor::rpc::CallResult::SenderError) => {
                        Outcome::Unreachable("client dropped the reply".into())
                    }
                    Err(e) => Outcome::Unreachable(e.to_string()),
                };
                (id, outcome)
            });
        }
        let mut outcomes = BTreeMap::new();
        while let Some(joined) = set.join_next().await {
            if let Ok((id, outcome)) = joined {
                outcomes.insert(id, outcome);
            }
        }
        outcomes
    }

    async fn run_round(&mut self, round: u64) -> Result<(), String> {
        let started = Instant::now();
        let config = self.fed.config.clone();
        let two_phase = self.fed.registry.two_phase();
        let first = self.select(round, None).await?;

        // Plan every first-phase participant's shards off the executor.
        let participants: Vec<Participant> = first
            .participants
            .iter()
            .map(|&(client, keep_ratio)| Participant { client, keep_ratio })
            .collect();
        let model = self.fed.model.clone();
        let policy = config.sharding.clone();
        let seed = config.seed;
        let planned = participants.clone();
        let plan: Option<ShardPlan> = tokio::task::spawn_blocking(move || match &policy {
            Some(policy) => plan_shards(&model, policy, &planned, seed, round).map(Some),
            None => Ok(None),
        })
        .await
        .map_err(|e| format!("sharding plan panicked: {e}"))??;
        let dense = dense_part(&self.fed.model, config.sharding.as_ref());
        let recipe = Recipe {
            learning_rate: config.learning_rate(round),
            ..config.recipe.clone()
        };
        let mut tasks: BTreeMap<ClientId, TrainTask> = BTreeMap::new();
        let mut downlink_bits = 0u64;
        for p in &participants {
            let shards = plan
                .as_ref()
                .and_then(|pl| pl.shards.get(&p.client).cloned())
                .unwrap_or_default();
            let task = TrainTask {
                round,
                client: p.client,
                seed: config.seed,
                dense: dense.clone(),
                shards,
                recipe: recipe.clone(),
            };
            downlink_bits += 8 * bincode::serde::encode_to_vec(&task, bincode::config::standard())
                .map_or(0, |b| b.len() as u64);
            tasks.insert(p.client, task);
        }

        let mut failures: BTreeMap<ClientId, (String, String)> = BTreeMap::new();
        let mut envelopes: BTreeMap<ClientId, UpdateEnvelope> = BTreeMap::new();
        let mut probabilities: BTreeMap<ClientId, f64> = first
            .participants
            .iter()
            .map(|p| p.0)
            .zip(first.probabilities.iter().copied())
            .collect();
        let messages = tasks
            .iter()
            .map(|(id, t)| (*id, Some(Box::new(t.clone()))))
            .collect();
        let outcomes = self.dispatch(messages, !two_phase, round).await;
        let mut norms = BTreeMap::new();
        for (id, outcome) in outcomes {
            match outcome {
                Outcome::Reply(ClientReply::Update(e)) => {
                    envelopes.insert(id, e);
                }
                Outcome::Reply(ClientReply::Trained { update_norm, .. }) => {
                    norms.insert(id, update_norm);
                }
                other => {
                    failures.insert(id, failure_reason(other));
                }
            }
        }
        for id in tasks.keys() {
            if !envelopes.contains_key(id) && !norms.contains_key(id) && !failures.contains_key(id)
            {
                failures.insert(*id, ("unreachable".into(), "no reply".into()));
            }
        }
        if two_phase {
            let second = self.select(round, Some(norms)).await?;
            probabilities = second
                .participants
                .iter()
                .map(|p| p.0)
                .zip(second.probabilities.iter().copied())
                .collect();
            let uploads = second.participants.iter().map(|p| (p.0, None)).collect();
            for (id, outcome) in self.dispatch(uploads, true, round).await {
                match outcome {
                    Outcome::Reply(ClientReply::Update(e)) => {
                        envelopes.insert(id, e);
                    }
                    other => {
                        failures.insert(id, failure_reason(other));
                    }
                }
            }
        }

        // Decode and validate before anything touches the model.
        let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
        let mut accepted: Vec<(ClientId, DecodedUpdate, &UpdateEnvelope)> = Vec::new();
        let uplink_bits: u64 = envelopes.values().map(|e| e.payload.bits).sum();
        for (id, envelope) in &envelopes {
            match decode_and_validate(&envelope.payload, &tasks[id]) {
                Ok(update) => accepted.push((*id, update, envelope)),
                Err(rejection) => {
                    tracing::warn!(client = id, %rejection, "update rejected");
                    *rejected.entry(rejection.label().to_string()).or_default() += 1;
                }
            }
        }
        for id in failures.keys() {
            let _ = self
                .coordinator
                .cast(CoordinatorMsg::CountFailure { client: *id });
        }

        let contributions: Vec<Contribution> = accepted
            .iter()
            .map(|(id, _, e)| Contribution {
                client: *id,
                samples: e.samples as f64,
                inclusion_probability: probabilities.get(id).copied().unwrap_or(1.0),
            })
            .collect();
        let failure_list: Vec<Failure> = failures
            .iter()
            .map(|(id, (_, reason))| Failure {
                client: *id,
                reason: reason.clone(),
            })
            .collect();
        let population_samples = self
            .fed
            .registry
            .clients
            .values()
            .map(|c| c.samples as f64)
            .sum();
        let mut model_updated = accepted.len() >= config.min_successful.max(1);
        let (anme, groups) = plan
            .as_ref()
            .map_or((0.0, vec![]), |p| (p.anme(), p.groups.clone()));
        if model_updated {
            let weights = config
                .aggregator
                .build()
                .map_err(|e| format!("aggregator {}: {e}", config.aggregator))?
                .weights(&RoundOutcome {
                    results: &contributions,
                    failures: &failure_list,
                    population_samples,
                })
                .map_err(|e| format!("aggregator {}: {e}", config.aggregator))?;
            let normalised = config.aggregator != AggregatorName::InverseProbability;
            let mut model = std::mem::take(&mut self.fed.model);
            let updates: Vec<(ClientId, f64, DecodedUpdate)> = accepted
                .iter()
                .zip(&weights)
                .map(|((id, u, _), w)| (*id, *w, u.clone()))
                .collect();
            let plan = plan.unwrap_or_default();
            // Finite updates can still sum past f32's range (large ω, a high learning rate):
            // such an aggregate never replaces the global model. The copy kept for that case
            // and the check run with the aggregation, off the actor's executor thread.
            let (model, finite) = tokio::task::spawn_blocking(move || {
                let previous = model.clone();
                let mut weighted: Vec<WeightedUpdate> = updates
                    .iter()
                    .map(|(client, weight, update)| WeightedUpdate {
                        client: *client,
                        weight: *weight,
                        update,
                    })
                    .collect();
                aggregate(&mut model, &plan, &mut weighted, normalised);
                if model.is_finite() {
                    (model, true)
                } else {
                    (previous, false)
                }
            })
            .await
            .map_err(|e| format!("aggregation panicked: {e}"))?;
            self.fed.model = model;
            if !finite {
                tracing::warn!(
                    round,
                    "the aggregate of the accepted updates is not finite (diverging local training: lower the learning rate); global model unchanged"
                );
                model_updated = false;
                *rejected
                    .entry("non_finite_aggregate".to_string())
                    .or_default() += 1;
            }
        } else {
            tracing::warn!(
                round,
                accepted = accepted.len(),
                minimum = config.min_successful,
                "too few successful clients; global model unchanged"
            );
        }

        let evaluator = Arc::clone(&self.fed.evaluator);
        let model = self.fed.model.clone();
        let evaluation = tokio::task::spawn_blocking(move || evaluator.evaluate(&model))
            .await
            .map_err(|e| format!("evaluation panicked: {e}"))?;
        let mut failure_counts: BTreeMap<String, usize> = BTreeMap::new();
        for (kind, _) in failures.values() {
            *failure_counts.entry(kind.clone()).or_default() += 1;
        }
        let train_loss = if accepted.is_empty() {
            f64::NAN
        } else {
            accepted.iter().map(|(_, _, e)| e.loss).sum::<f64>() / accepted.len() as f64
        };
        let parameters = self.fed.model.num_parameters().max(1) as f64;
        let record = RoundRecord {
            round,
            participants: tasks.len(),
            successes: accepted.len(),
            failures: failure_counts,
            rejected,
            model_updated,
            accuracy: evaluation.accuracy,
            loss: evaluation.loss,
            train_loss,
            uplink_bits,
            downlink_bits,
            bits_per_parameter: if accepted.is_empty() {
                0.0
            } else {
                uplink_bits as f64 / parameters / envelopes.len() as f64
            },
            anme,
            groups,
            learning_rate: recipe.learning_rate,
            client_train_seconds: accepted.iter().map(|(_, _, e)| e.train_seconds).collect(),
            seconds: started.elapsed().as_secs_f64(),
        };
        self.fed.history.push(record.clone());
        self.persist(&record).await?;
        if let Some(events) = &self.fed.events {
            let _ = events.send(record);
        }
        Ok(())
    }

    /// Checkpoint first, then the metrics line: a crash between the two is repaired on resume,
    /// which rewrites `metrics.jsonl` from the checkpoint's history.
    async fn persist(&mut self, record: &RoundRecord) -> Result<(), String> {
        let Some(dir) = self.fed.run_dir.clone() else {
            return Ok(());
        };
        let registry = call!(self.coordinator, |reply| CoordinatorMsg::Snapshot { reply })
            .map_err(|e| format!("coordinator unreachable: {e}"))?;
        self.fed.registry = registry.clone();
        let cp = Checkpoint {
            version: FORMAT_VERSION,
            seed: self.fed.config.seed,
            rounds_completed: record.round,
            model: self.fed.model.clone(),
            registry,
            history: self.fed.history.clone(),
        };
        let line = serde_json::to_string(record).map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || -> Result<(), String> {
            checkpoint::save(&dir, &cp).map_err(|e| e.to_string())?;
            let path = dir.join("metrics.jsonl");
            let mut file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            writeln!(file, "{line}").map_err(|e| format!("{}: {e}", path.display()))
        })
        .await
        .map_err(|e| format!("checkpoint writer panicked: {e}"))?
    }
}

fn failure_reason(outcome: Outcome) -> (String, String) {
    match outcome {
        Outcome::Reply(ClientReply::Failed {
            reason, panicked, ..
        }) => ((if panicked { "panic" } else { "error" }).into(), reason),
        Outcome::Timeout => ("timeout".into(), "missed the round deadline".into()),
        Outcome::Unreachable(e) => ("unreachable".into(), e),
        Outcome::Reply(other) => ("error".into(), format!("unexpected reply {other:?}")),
    }
}
