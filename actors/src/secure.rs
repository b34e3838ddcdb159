//! Secure aggregation of a synchronous round (SecAgg+ on [`fedshard_secagg`]; docs/secagg.md,
//! docs/algorithms.md §7): the server learns the sum of the round's updates and nothing of any
//! one of them.
//!
//! A secure round starts like phase one of a two-phase round: every participant trains and keeps
//! its update ([`ClientReply::Ready`](crate::client::ClientReply::Ready)). Four exchanges of the
//! protocol then carry each client's *input*: its update as the plain fold's blocks (every dense
//! tensor, and each singular vector `u'_i`, `v'_i` of each sharded layer, so sharded layers are
//! summed over the union of the factor columns), as changes against what it was sent, zero where
//! it held nothing, clipped to `clip_norm`, premultiplied by its aggregation weight and encoded in
//! fixed point. The server decodes the sum and moves each block by it over the total weight of
//! the surviving clients that held the block: the plain fold's per-block weighted mean
//! ([`fedshard_strategies::aggregation::fold_weighted`]) for FedAvg and uniform weights, up to
//! the fixed-point rounding and the clip. The weights and who held which block are the server's
//! own knowledge (the registry's sample counts, the round's shard plan); only the values are
//! hidden.

use crate::client::AfterTraining;
use crate::engine::RoundUpdates;
use crate::error::{Error, Result};
use crate::record::{PhaseSeconds, SimulatedTime};
use crate::round::{
    Accepted, ClientFailure, Expect, Folded, Tally, Tasks, check, classify, fold_blocks,
};
use crate::server::{Ask, ServerState, selection_probabilities};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::payload::RejectionKind;
use fedshard_protocol::payload::UpdateEnvelope;
use fedshard_protocol::shard_plan::Participant;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_secagg::message::Round as Step;
use fedshard_secagg::{ClientMessage, FixedPoint, Graph, Params, ServerMessage, SessionId};
use fedshard_strategies::aggregation::AggregatorName;
use fedshard_strategies::privacy::clip_factor;
use fedshard_strategies::rng::{Purpose, stream};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// `[secure_aggregation]` as the runtime uses it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SecureSettings {
    /// Every client scales its change down to this L2 norm before encoding: it bounds every
    /// coordinate, hence the fixed-point range `[−clip_norm, clip_norm]`.
    pub clip_norm: f64,
    /// Fixed-point steps per unit: each client's value moves by at most `1 / (2 · scale)`.
    pub scale: f64,
    /// `t` as a fraction of the holders of each secret (a client's neighbours and itself):
    /// `t = ⌈threshold · holders⌉`, in `(1/2, 1]` so that the server cannot split the clients
    /// into two sessions (Bonawitz et al. 2017).
    pub threshold: f64,
    /// SecAgg+'s graph degree `k` (even): each client masks with and shares its secrets among
    /// `k` neighbours; `None`, the complete graph of SecAgg.
    pub degree: Option<usize>,
    /// How a client's change is weighted: FedAvg's sample counts or uniform weights.
    pub weighting: SecureWeighting,
}

/// The aggregators whose fold is a per-block weighted mean with a weight each client can
/// premultiply: the only ones a sum can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SecureWeighting {
    /// FedAvg: `D_c`, the registry's sample count.
    Samples,
    /// Every client alike.
    Uniform,
}

impl SecureWeighting {
    /// The weighting of `aggregator`, or why a sum cannot fold it.
    pub fn of(aggregator: AggregatorName) -> std::result::Result<Self, &'static str> {
        match aggregator {
            AggregatorName::Fedavg => Ok(SecureWeighting::Samples),
            AggregatorName::Uniform => Ok(SecureWeighting::Uniform),
            AggregatorName::InverseProbability => Err(
                "its weights n_c / (p_c Σ n) are summed, not averaged, and are not wired to \
                 secure aggregation",
            ),
            AggregatorName::Fesc | AggregatorName::FescOracle => {
                Err("its weights depend on which clients answered, known only after the sum")
            }
        }
    }
}

impl SecureSettings {
    /// The fixed-point encoding of every input.
    pub fn fixed_point(&self) -> Result<FixedPoint> {
        FixedPoint::new(self.clip_norm, self.scale).map_err(Error::SecureAggregation)
    }

    /// The public parameters of round `round`'s session among `clients` (ascending) over
    /// vectors of `vector_len`: a session id and the graph's relabelling drawn from the run's
    /// stream, `t` from [`SecureSettings::threshold`], and the bits that hold the sum of all of
    /// them without wrapping.
    pub fn params(
        &self,
        seed: u64,
        round: u64,
        clients: &[ClientId],
        vector_len: usize,
    ) -> Result<Params> {
        let mut rng = stream(seed, round, 0, Purpose::SecureSession);
        let mut session = [0u8; 16];
        rng.fill_bytes(&mut session);
        let graph = match self.degree {
            Some(degree) => Graph::RandomRegular {
                degree,
                seed: rng.next_u64(),
            },
            None => Graph::Complete,
        };
        let clients = clients
            .iter()
            .map(|&c| session_id(c))
            .collect::<Result<Vec<_>>>()?;
        let mut params = Params {
            session: SessionId(session),
            bits: self
                .fixed_point()?
                .bits_for(clients.len())
                .map_err(Error::SecureAggregation)?,
            clients,
            threshold: 1,
            graph,
            vector_len,
        };
        let holders = params.holders_per_secret();
        params.threshold = ((self.threshold * holders as f64).ceil() as usize).clamp(1, holders);
        params.validate().map_err(Error::SecureAggregation)?;
        Ok(params)
    }
}

/// A federation client's id in a session (sessions number clients in 32 bits).
pub fn session_id(client: ClientId) -> Result<fedshard_secagg::ClientId> {
    fedshard_secagg::ClientId::try_from(client).map_err(|_| {
        Error::SecureAggregation(fedshard_secagg::Error::Params(format!(
            "client id {client} does not fit a session's 32-bit ids"
        )))
    })
}

/// Where each block of a round's model sits in a secure input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockLayout {
    /// The tensors the round trains densely, in the global model's order, with their lengths.
    pub dense: Vec<(String, usize)>,
    /// The sharded layers, in the plan's order: all their terms' `u'` vectors, then all `v'`.
    pub layers: Vec<LayerLayout>,
}

/// One sharded layer's place in a [`BlockLayout`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerLayout {
    pub name: String,
    /// Terms of the round's SVD (the union of every client's columns).
    pub terms: usize,
    pub rows: usize,
    pub cols: usize,
}

impl BlockLayout {
    /// The layout of a round over `global` with `plan`: the dense tensors any task carries and
    /// every term of every sharded layer.
    pub fn of(global: &ModelState, plan: Option<&ShardPlan>, tasks: &[&TrainTask]) -> BlockLayout {
        let dense = global
            .tensors
            .iter()
            .filter(|t| tasks.iter().any(|task| task.dense.get(&t.name).is_some()))
            .map(|t| (t.name.clone(), t.data.len()))
            .collect();
        let layers = plan
            .map(|p| {
                p.factors
                    .iter()
                    .map(|(name, f)| LayerLayout {
                        name: name.clone(),
                        terms: f.singular_values.len(),
                        rows: f.rows,
                        cols: f.cols,
                    })
                    .collect()
            })
            .unwrap_or_default();
        BlockLayout { dense, layers }
    }

    /// Values in an input.
    pub fn len(&self) -> usize {
        let dense: usize = self.dense.iter().map(|(_, n)| n).sum();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.terms * (l.rows + l.cols))
            .sum();
        dense + layers
    }

    /// Whether an input would be empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The offset and length of dense tensor `name`.
    fn dense(&self, name: &str) -> Option<(usize, usize)> {
        let mut offset = 0;
        for (n, len) in &self.dense {
            if n == name {
                return Some((offset, *len));
            }
            offset += len;
        }
        None
    }

    /// The offset of each sharded layer's first `u'` vector.
    fn layer_starts(&self) -> Vec<usize> {
        let mut start: usize = self.dense.iter().map(|(_, n)| n).sum();
        self.layers
            .iter()
            .map(|l| {
                let s = start;
                start += l.terms * (l.rows + l.cols);
                s
            })
            .collect()
    }
}

/// What a client needs, besides its update and its task, to form its input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    pub layout: BlockLayout,
    /// [`SecureSettings::clip_norm`].
    pub clip_norm: f64,
    /// This client's weight over the largest of the round, in `(0, 1]`, so a weighted value
    /// stays inside the clip.
    pub weight: f64,
    pub fixed: FixedPoint,
    /// With `[privacy]`: one more value, `clip_norm` when the change needed no clipping and 0
    /// otherwise, so that the sum also counts the unclipped updates (adaptive clipping's only
    /// input) without telling whose.
    pub count_unclipped: bool,
}

/// One step of a client's session, as the server sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SecureStep {
    /// Round 0: the session's public parameters and how to form the input. The client forms
    /// it, draws its secrets from the operating system and advertises its keys.
    Begin {
        params: Params,
        input: Box<InputSpec>,
    },
    /// Rounds 1–3: the server's message (the neighbours' keys, the shares addressed to the
    /// client, the request to unmask).
    Continue(ServerMessage),
}

/// `update`'s blocks as changes against `task`, laid out by `spec.layout`, clipped, weighted and
/// encoded: a client's input to the sum. The update is opened and checked against its task as
/// the server would check it in the clear.
pub fn input(
    task: &TrainTask,
    update: &UpdateEnvelope,
    spec: &InputSpec,
) -> std::result::Result<Vec<u64>, String> {
    let Accepted { update, .. } = check(task.client, update, Some(task), None)
        .map_err(|kind| format!("its own update does not open against its task ({kind:?})"))?;
    let layout = &spec.layout;
    let mut values = vec![0f64; layout.len()];
    for t in &update.dense.tensors {
        let (offset, len) = layout
            .dense(&t.name)
            .ok_or_else(|| format!("tensor `{}` is not in the round's layout", t.name))?;
        let sent = task
            .dense
            .get(&t.name)
            .ok_or_else(|| format!("tensor `{}` was not sent", t.name))?;
        if t.data.len() != len || sent.data.len() != len {
            return Err(format!("tensor `{}` has another length", t.name));
        }
        for ((v, &new), &old) in values[offset..offset + len]
            .iter_mut()
            .zip(&t.data)
            .zip(&sent.data)
        {
            *v = f64::from(new) - f64::from(old);
        }
    }
    if update.shards.len() != layout.layers.len() {
        return Err(format!(
            "{} sharded layers, the round has {}",
            update.shards.len(),
            layout.layers.len()
        ));
    }
    let starts = layout.layer_starts();
    for (((got, sent), layer), start) in update
        .shards
        .iter()
        .zip(&task.shards)
        .zip(&layout.layers)
        .zip(starts)
    {
        let (rows, cols) = (layer.rows, layer.cols);
        for (j, &term) in got.indices.iter().enumerate() {
            let blocks = [
                (start + term * rows, rows, &got.left, &sent.left),
                (
                    start + layer.terms * rows + term * cols,
                    cols,
                    &got.right,
                    &sent.right,
                ),
            ];
            for (offset, len, new, old) in blocks {
                let (Some(new), Some(old)) = (
                    new.get(j * len..(j + 1) * len),
                    old.get(j * len..(j + 1) * len),
                ) else {
                    return Err(format!("short factors of `{}`", got.name));
                };
                if term >= layer.terms {
                    return Err(format!("term {term} of `{}` outside the plan", got.name));
                }
                for ((v, &n), &o) in values[offset..offset + len].iter_mut().zip(new).zip(old) {
                    *v = f64::from(n) - f64::from(o);
                }
            }
        }
    }
    let norm = values.iter().map(|v| v * v).sum::<f64>().sqrt();
    let scale = clip_factor(norm, spec.clip_norm) * spec.weight;
    let mut scaled: Vec<f32> = values.iter().map(|v| (v * scale) as f32).collect();
    if spec.count_unclipped {
        let unclipped = norm <= spec.clip_norm;
        scaled.push(if unclipped {
            spec.clip_norm as f32
        } else {
            0.0
        });
    }
    spec.fixed.encode(&scaled).map_err(|e| e.to_string())
}

/// A client's side of a round's session, kept by its host between the exchanges.
pub struct SecureClient {
    round: u64,
    /// The task and the update, until the input is formed.
    trained: Option<(Box<TrainTask>, Box<UpdateEnvelope>)>,
    /// The state machine and the input, once the session began.
    session: Option<(fedshard_secagg::Client, Vec<u64>)>,
    /// Fault injection's `dropout`: the client leaves before its masked input.
    leaves: bool,
}

impl SecureClient {
    /// The client trained `task` into `update`; with `leaves` it will leave the session before
    /// its masked input ([`crate::faults::FaultKind::Dropout`]).
    pub fn new(task: Box<TrainTask>, update: Box<UpdateEnvelope>, leaves: bool) -> SecureClient {
        SecureClient {
            round: task.round,
            trained: Some((task, update)),
            session: None,
            leaves,
        }
    }

    /// The round this session belongs to.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Whether the client sent its last message (its unmasking shares).
    pub fn finished(&self) -> bool {
        self.trained.is_none() && self.session.is_none()
    }

    /// Answers `step`; an error ends the client's part in the session.
    pub fn answer(&mut self, step: &SecureStep) -> std::result::Result<ClientMessage, String> {
        match step {
            SecureStep::Begin {
                params,
                input: spec,
            } => {
                let (task, update) = self.trained.take().ok_or("the session had already begun")?;
                let input = input(&task, &update, spec)?;
                // The client's secrets: from the operating system, never from the run's
                // streams, which the server can rebuild.
                let mut seed = [0u8; 32];
                getrandom::fill(&mut seed).map_err(|e| format!("no OS entropy: {e}"))?;
                let id = session_id(task.client).map_err(|e| e.to_string())?;
                let mut client = fedshard_secagg::Client::new(params.clone(), id, seed)
                    .map_err(|e| e.to_string())?;
                let message = client.advertise_keys().map_err(|e| e.to_string())?;
                self.session = Some((client, input));
                Ok(message)
            }
            SecureStep::Continue(message) => {
                let (client, input) = self.session.as_mut().ok_or("no session has begun")?;
                let answer = match message.round {
                    Step::MaskedInput if self.leaves => {
                        self.session = None;
                        return Err("injected dropout: left the session before its masked \
                                    input"
                            .into());
                    }
                    Step::ShareKeys => client.share_keys(message),
                    Step::MaskedInput => client.masked_input(message, input),
                    Step::Unmask => client.unmask(message),
                    Step::AdvertiseKeys => {
                        return Err("advertising keys begins a session".into());
                    }
                };
                let finished = message.round == Step::Unmask;
                let answer = answer.map_err(|e| e.to_string());
                if finished || answer.is_err() {
                    self.session = None;
                }
                answer
            }
        }
    }
}

/// What a round's session came to: the decoded sum, and who is in it.
#[derive(Debug, Clone, PartialEq)]
pub struct SecureSum {
    pub layout: BlockLayout,
    /// The sum of the survivors' weighted, clipped changes, decoded.
    pub sum: Vec<f64>,
    /// With `[privacy]`: how many of the survivors' changes needed no clipping.
    pub unclipped: Option<usize>,
    /// The clients whose inputs are in the sum, with their weights.
    pub survivors: BTreeMap<ClientId, f64>,
}

impl SecureSum {
    /// The sum as one f64 vector per tensor of `global` (zero for a tensor no task carried):
    /// the weight-space sum DP-FedAvg releases ([`crate::round::release`]). Only an unsharded
    /// model's blocks are its weights; a sharded layer's factor columns are not.
    pub fn weight_space(&self, global: &ModelState) -> Result<Vec<Vec<f64>>> {
        if !self.layout.layers.is_empty() {
            return Err(Error::Update {
                client: 0,
                reason: "a secure sum over factor columns is not a weight-space change".into(),
            });
        }
        Ok(global
            .tensors
            .iter()
            .map(|t| {
                let mut offset = 0;
                for (name, len) in &self.layout.dense {
                    if *name == t.name && *len == t.data.len() {
                        return self.sum[offset..offset + len].to_vec();
                    }
                    offset += len;
                }
                vec![0.0; t.data.len()]
            })
            .collect())
    }
}

/// Moves `global` (with `plan`, the round's SVD) by a session's sum: each block by the sum over
/// the total weight of the survivors whose task held it; a block nobody held stays. The blocks
/// and the recomposition of the sharded layers are the plain fold's ([`fold_blocks`]).
pub fn fold_secure(
    global: &mut ModelState,
    plan: Option<&ShardPlan>,
    tasks: &BTreeMap<ClientId, TrainTask>,
    secure: &SecureSum,
) -> Result<Folded> {
    let layout = &secure.layout;
    let total = |held: &dyn Fn(&TrainTask) -> bool| -> f64 {
        secure
            .survivors
            .iter()
            .filter(|(id, _)| tasks.get(id).is_some_and(held))
            .map(|(_, w)| w)
            .sum()
    };
    let moved = |block: &mut [f32], sum: &[f64], weight: f64| {
        if weight > 0.0 {
            for (x, s) in block.iter_mut().zip(sum) {
                *x = (f64::from(*x) + s / weight) as f32;
            }
        }
    };
    fold_blocks(global, plan, |blocks, names, layer_starts| {
        let mut offset = 0;
        for (name, len) in &layout.dense {
            let b = names
                .iter()
                .position(|n| n == name)
                .ok_or_else(|| Error::Update {
                    client: 0,
                    reason: format!("the layout names an unknown tensor `{name}`"),
                })?;
            let weight = total(&|t| t.dense.get(name).is_some());
            moved(blocks[b], &secure.sum[offset..offset + len], weight);
            offset += len;
        }
        for (l, (layer, &first)) in layout.layers.iter().zip(layer_starts).enumerate() {
            for term in 0..layer.terms {
                let weight = total(&|t| {
                    t.shards
                        .get(l)
                        .is_some_and(|s| s.indices.binary_search(&term).is_ok())
                });
                let u = offset + term * layer.rows;
                let v = offset + layer.terms * layer.rows + term * layer.cols;
                moved(blocks[first + term], &secure.sum[u..u + layer.rows], weight);
                let right = first + layer.terms + term;
                moved(blocks[right], &secure.sum[v..v + layer.cols], weight);
            }
            offset += layer.terms * (layer.rows + layer.cols);
        }
        Ok(None)
    })
}

/// What a secure round's session came to.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionOutcome {
    Finished {
        sum: SecureSum,
        record: SessionRecord,
    },
    /// Too few clients were left to finish it (or to start it); the text says why.
    NotFinished(String),
}

impl SessionOutcome {
    /// The record of a finished session.
    pub fn record(&self) -> Option<SessionRecord> {
        match self {
            SessionOutcome::Finished { record, .. } => Some(*record),
            SessionOutcome::NotFinished(_) => None,
        }
    }
}

/// A secure round's session, as its record tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Clients whose inputs are in the sum.
    pub survivors: usize,
    /// Clients that shared their keys but whose masked input never came: the server removed
    /// their masks with the shares of the others.
    pub dropped: usize,
    /// `t`: shares that rebuild a secret, and the fewest clients that may finish.
    pub threshold: usize,
    /// The bits of every value of the session's modulus.
    pub bits: u32,
}

/// Why a client's session message is refused, by the kind the round counts.
fn rejection(error: &fedshard_secagg::Error) -> RejectionKind {
    use fedshard_secagg::Error as E;
    match error {
        E::WrongSession { .. } | E::WrongRound { .. } => RejectionKind::Stale,
        E::UnknownClient(_) | E::NotExpected { .. } | E::Duplicate { .. } => RejectionKind::Forged,
        _ => RejectionKind::Malformed,
    }
}

/// The server's side of one round's session, between its exchanges.
struct Session<'a> {
    round: u64,
    server: fedshard_secagg::Server,
    tally: &'a mut Tally,
    failures: &'a mut BTreeMap<ClientId, ClientFailure>,
    time: &'a mut SimulatedTime,
}

impl ServerState {
    /// A secure round's collection: every participant trains and keeps its update, then the
    /// clients that did run the four exchanges of the session over their inputs. Returns the
    /// round with no update in the clear and, when the session finished, its decoded sum.
    pub(crate) async fn collect_secure_round(
        &mut self,
        round: u64,
        settings: SecureSettings,
        tally: &mut Tally,
        phases: &mut PhaseSeconds,
    ) -> Result<RoundUpdates> {
        let started = Instant::now();
        let first = self.select(round, None, None).await?;
        let participants: Vec<Participant> = first
            .participants
            .iter()
            .map(|&(client, keep_ratio)| Participant { client, keep_ratio })
            .collect();
        let (plan, tasks) = self
            .prepare(&participants, round, round, participants.len())
            .await?;
        let messages = tasks
            .tasks
            .iter()
            .map(|(id, t)| (*id, Ask::Train(Box::new(t.clone()), AfterTraining::Secure)))
            .collect();
        phases.plan = started.elapsed().as_secs_f64();
        let start = self.simulated_now();
        let trained = self
            .dispatch(messages, &tasks.bits, (round, start), None)
            .await;
        let mut time = SimulatedTime {
            start,
            end: trained.end,
            clients: trained.times,
        };
        let answers = classify(tasks.tasks.keys().copied(), trained.outcomes, Expect::Ready);
        let mut failures = answers.failures;
        tally.participants = tasks.tasks.len();
        tally.hand_out(&tasks);
        let needed = self.fed.config.min_successful.max(1);
        let session = if answers.ready.len() >= needed {
            self.secure_session(
                round,
                &settings,
                (plan.as_deref(), &tasks),
                &answers.ready,
                (tally, &mut failures, &mut time),
            )
            .await?
        } else {
            SessionOutcome::NotFinished(format!(
                "{} clients trained, the minimum is {needed}",
                answers.ready.len()
            ))
        };
        phases.train = started.elapsed().as_secs_f64() - phases.plan;
        for f in failures.values() {
            *tally.failures.entry(f.kind).or_default() += 1;
        }
        self.count_failures(round, tasks.tasks.len(), &failures);
        tally.time = self.clock.is_some().then_some(time);
        Ok(RoundUpdates {
            plan,
            tasks,
            probabilities: selection_probabilities(&first),
            failures,
            accepted: vec![],
            late: 0,
            secure: Some(Box::new(session)),
        })
    }

    /// Runs the session of the clients in `ready` (ascending); when too few clients were left
    /// to finish it, the round's model stays.
    async fn secure_session(
        &self,
        round: u64,
        settings: &SecureSettings,
        (plan, tasks): (Option<&ShardPlan>, &Tasks),
        ready: &[ClientId],
        (tally, failures, time): (
            &mut Tally,
            &mut BTreeMap<ClientId, ClientFailure>,
            &mut SimulatedTime,
        ),
    ) -> Result<SessionOutcome> {
        let layout = {
            let held: Vec<&TrainTask> = ready.iter().filter_map(|id| tasks.tasks.get(id)).collect();
            BlockLayout::of(&self.fed.model, plan, &held)
        };
        // With [privacy] the clip is DP-FedAvg's of this round, and the sum also counts the
        // unclipped changes.
        let private = self.engine.privacy.as_ref();
        let clip_norm = private.map_or(settings.clip_norm, |(p, _)| p.clip_norm(&self.fed.history));
        let count_unclipped = private.is_some();
        let settings = SecureSettings {
            clip_norm,
            ..*settings
        };
        let vector_len = layout.len() + usize::from(count_unclipped);
        let params = settings.params(self.fed.config.seed, round, ready, vector_len)?;
        let weights = self.secure_weights(settings.weighting, ready)?;
        let fixed = settings.fixed_point()?;
        let mut session = Session {
            round,
            server: fedshard_secagg::Server::new(params.clone())
                .map_err(Error::SecureAggregation)?,
            tally,
            failures,
            time,
        };
        let begin = ready.iter().map(|&id| {
            let input = InputSpec {
                layout: layout.clone(),
                clip_norm,
                weight: weights.get(&id).copied().unwrap_or(0.0),
                fixed,
                count_unclipped,
            };
            let step = SecureStep::Begin {
                params: params.clone(),
                input: Box::new(input),
            };
            (id, step)
        });
        let outcome = async {
            self.exchange(&mut session, begin.collect()).await;
            let directories = session.server.close_advertise_keys()?;
            self.exchange(&mut session, continued(directories)).await;
            let inboxes = session.server.close_share_keys()?;
            self.exchange(&mut session, continued(inboxes)).await;
            let request = session.server.close_masked_input()?;
            let survivors = session.server.survivors();
            let unmask = survivors.iter().map(|&c| (c, request.clone())).collect();
            self.exchange(&mut session, continued(unmask)).await;
            session.server.finish()
        }
        .await;
        let aggregate = match outcome {
            Ok(aggregate) => aggregate,
            Err(e) => {
                return Ok(SessionOutcome::NotFinished(format!(
                    "the secure aggregation did not finish: {e}"
                )));
            }
        };
        let record = SessionRecord {
            survivors: aggregate.survivors.len(),
            dropped: aggregate.dropped.len(),
            threshold: params.threshold,
            bits: params.bits,
        };
        session.tally.envelopes += aggregate.survivors.len();
        let mut decoded = fixed.decode_sum(&aggregate.sum, aggregate.survivors.len());
        let unclipped = count_unclipped
            .then(|| decoded.pop())
            .flatten()
            .map(|v| (v / clip_norm).round().max(0.0) as usize);
        let sum = SecureSum {
            sum: decoded,
            unclipped,
            survivors: aggregate
                .survivors
                .iter()
                .map(|&c| {
                    let id = ClientId::from(c);
                    (id, weights.get(&id).copied().unwrap_or(0.0))
                })
                .collect(),
            layout,
        };
        Ok(SessionOutcome::Finished { sum, record })
    }

    /// Each client's weight over the largest of `clients`: the registry's sample count (never
    /// the client's own claim) for FedAvg, 1 for uniform weights.
    fn secure_weights(
        &self,
        weighting: SecureWeighting,
        clients: &[ClientId],
    ) -> Result<BTreeMap<ClientId, f64>> {
        let raw = clients
            .iter()
            .map(|&id| {
                let w = match weighting {
                    SecureWeighting::Uniform => 1.0,
                    SecureWeighting::Samples => self
                        .fed
                        .registry
                        .clients
                        .get(&id)
                        .map(|c| c.samples as f64)
                        .ok_or(Error::UnknownClient(id))?,
                };
                Ok((id, w))
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        let largest = raw.values().copied().fold(0.0, f64::max);
        Ok(raw
            .into_iter()
            .map(|(id, w)| (id, if largest > 0.0 { w / largest } else { 0.0 }))
            .collect())
    }

    /// One exchange: sends each client its step, waits for the answers until the deadline, and
    /// hands the server every message that its sender signed as itself. A client that failed
    /// or did not answer in time has dropped out, and stays out (the server refuses its late
    /// messages).
    async fn exchange(&self, session: &mut Session<'_>, steps: Vec<(ClientId, SecureStep)>) {
        let asked: Vec<ClientId> = steps.iter().map(|(id, _)| *id).collect();
        let asks = steps
            .into_iter()
            .map(|(id, step)| (id, Ask::Secure(Box::new(step))))
            .collect();
        let start = session.time.end;
        let answered = self
            .dispatch(asks, &BTreeMap::new(), (session.round, start), None)
            .await;
        for (id, t) in answered.times {
            session.time.clients.entry(id).or_default().upload += t.total();
        }
        session.time.end = answered.end;
        let answers = classify(asked, answered.outcomes, Expect::Secure);
        session.failures.extend(answers.failures);
        for (id, message) in answers.secure {
            let bits = 8 * fedshard_secagg::wire::encode(&message).len() as u64;
            *session.tally.client_uplink_bits.entry(id).or_default() += bits;
            let signed = session_id(id).is_ok_and(|s| s == message.header.sender);
            let received = if signed {
                session.server.receive(message)
            } else {
                Err(fedshard_secagg::Error::UnknownClient(message.header.sender))
            };
            if let Err(e) = received {
                tracing::warn!(
                    round = session.round,
                    client = id,
                    "secure aggregation message refused: {e}"
                );
                session.tally.reject(rejection(&e));
            }
        }
    }
}

/// The server's messages as the steps that carry them.
fn continued(
    outbox: Vec<(fedshard_secagg::ClientId, ServerMessage)>,
) -> Vec<(ClientId, SecureStep)> {
    outbox
        .into_iter()
        .map(|(to, message)| (ClientId::from(to), SecureStep::Continue(message)))
        .collect()
}
