//! One round as plain functions over plain data, so each step is unit-tested without actors:
//! build every participant's task ([`build_tasks`]), sort the clients' answers into updates and
//! failures ([`classify`]), open and check each update against its task ([`validate`]), fold the
//! accepted ones through the aggregation policy ([`fold`]) and sum the round up ([`record`]).
//! The server actor only moves messages between these.

use crate::client::ClientReply;
use crate::coordinator::Registry;
use crate::record::{KlmsStats, RoundRecord};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::payload::{DecodedUpdate, RejectionKind, UpdateEnvelope, open};
use fedshard_protocol::shard_plan::{Participant, ShardPlan, ShardingPolicy, dense_part};
use fedshard_protocol::task::{ClientId, Recipe, TrainTask};
use fedshard_protocol::uplink::Uplink;
use fedshard_strategies::aggregation::{
    Aggregator, BlockUpdate, Contribution, Failure, Fit, FitRound, RoundOutcome,
};
use fedshard_strategies::svd::apply_term_changes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why a selected client gave no update; the label is the `reason` of the failure counters in
/// `metrics.jsonl` and Prometheus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Local training returned an error.
    Error,
    /// Local training panicked (the client actor is restarted).
    Panic,
    /// No answer before the round's deadline.
    Timeout,
    /// The client could not be reached, or answered out of protocol.
    Unreachable,
}

impl FailureKind {
    pub const ALL: [FailureKind; 4] = [
        FailureKind::Error,
        FailureKind::Panic,
        FailureKind::Timeout,
        FailureKind::Unreachable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Error => "error",
            FailureKind::Panic => "panic",
            FailureKind::Timeout => "timeout",
            FailureKind::Unreachable => "unreachable",
        }
    }
}

/// A failed client: what kind of failure, and the text for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientFailure {
    pub kind: FailureKind,
    pub reason: String,
}

/// How one dispatched client ended its phase, as the transport saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Reply(ClientReply),
    Timeout,
    Unreachable(String),
}

/// The tasks of a round and the bits they take on the downlink.
#[derive(Debug, Clone, PartialEq)]
pub struct Tasks {
    pub tasks: BTreeMap<ClientId, TrainTask>,
    /// 8 × the bincode length of every task.
    pub downlink_bits: u64,
}

/// Every participant's task: the dense part of the model, its shards of the plan (none without
/// a sharding policy) and the round's recipe.
pub fn build_tasks(
    global: &ModelState,
    policy: Option<&ShardingPolicy>,
    plan: Option<&ShardPlan>,
    participants: &[Participant],
    (seed, round): (u64, u64),
    recipe: &Recipe,
) -> Tasks {
    let dense = dense_part(global, policy);
    let mut tasks = BTreeMap::new();
    let mut downlink_bits = 0u64;
    for p in participants {
        let shards = plan
            .and_then(|pl| pl.shards.get(&p.client).cloned())
            .unwrap_or_default();
        let task = TrainTask {
            round,
            client: p.client,
            seed,
            dense: dense.clone(),
            shards,
            recipe: recipe.clone(),
            uplink: Uplink::default(),
        };
        downlink_bits += task_bits(&task);
        tasks.insert(p.client, task);
    }
    Tasks {
        tasks,
        downlink_bits,
    }
}

impl Tasks {
    /// Sets every task's uplink from `uplink` (the compressor's settings for that task) and
    /// recounts the downlink bits, which include them.
    pub fn attach_uplinks(
        &mut self,
        uplink: impl Fn(&TrainTask) -> Result<Uplink, String>,
    ) -> Result<(), String> {
        self.downlink_bits = 0;
        for task in self.tasks.values_mut() {
            task.uplink = uplink(task)?;
            self.downlink_bits += task_bits(task);
        }
        Ok(())
    }
}

fn task_bits(task: &TrainTask) -> u64 {
    8 * bincode::serde::encode_to_vec(task, bincode::config::standard())
        .map_or(0, |b| b.len() as u64)
}

/// The answers of one phase, sorted.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Classified {
    /// Uploaded updates, keyed by the client the task went to.
    pub envelopes: BTreeMap<ClientId, UpdateEnvelope>,
    /// Phase one of a two-phase round: the update norms of the clients that trained.
    pub norms: BTreeMap<ClientId, f64>,
    pub failures: BTreeMap<ClientId, ClientFailure>,
}

/// Sorts the outcomes of the clients in `asked`: an update, a norm (phase one), or a failure. A
/// client in `asked` without an outcome is `unreachable`; an outcome of a client not asked is
/// ignored.
pub fn classify(
    asked: impl IntoIterator<Item = ClientId>,
    mut outcomes: BTreeMap<ClientId, Outcome>,
) -> Classified {
    let mut c = Classified::default();
    for id in asked {
        let failure = |kind, reason: String| ClientFailure { kind, reason };
        match outcomes.remove(&id) {
            Some(Outcome::Reply(ClientReply::Update(e))) => {
                c.envelopes.insert(id, e);
            }
            Some(Outcome::Reply(ClientReply::Trained { update_norm, .. })) => {
                c.norms.insert(id, update_norm);
            }
            Some(Outcome::Reply(ClientReply::Failed {
                reason, panicked, ..
            })) => {
                let kind = if panicked {
                    FailureKind::Panic
                } else {
                    FailureKind::Error
                };
                c.failures.insert(id, failure(kind, reason));
            }
            Some(Outcome::Timeout) => {
                let reason = "missed the round deadline".into();
                c.failures.insert(id, failure(FailureKind::Timeout, reason));
            }
            Some(Outcome::Unreachable(reason)) => {
                c.failures
                    .insert(id, failure(FailureKind::Unreachable, reason));
            }
            None => {
                let reason = "no reply".into();
                c.failures
                    .insert(id, failure(FailureKind::Unreachable, reason));
            }
        }
    }
    c
}

/// An update that passed every check, with what the record needs of its envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub client: ClientId,
    pub update: DecodedUpdate,
    pub loss: f64,
    pub train_seconds: f64,
}

/// The updates that may touch the model, and the others counted by reason.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Validated {
    /// Ascending by client.
    pub accepted: Vec<Accepted>,
    pub rejected: BTreeMap<RejectionKind, usize>,
}

/// Opens every envelope against the task its client was given ([`open`]: the right client and
/// round, a payload that decodes to the task's tensors and indices, finite values), then, with a
/// bound (`[federation] max_update_norm`), rejects as [`RejectionKind::NormBound`] every update
/// whose norm [`update_norm`], computed here against the task and never taken from the
/// envelope's own `update_norm`, exceeds it. Without a bound nothing more is checked.
pub fn validate(
    envelopes: &BTreeMap<ClientId, UpdateEnvelope>,
    tasks: &BTreeMap<ClientId, TrainTask>,
    max_update_norm: Option<f64>,
) -> Validated {
    let mut v = Validated::default();
    for (id, envelope) in envelopes {
        match check(*id, envelope, tasks.get(id), max_update_norm) {
            Ok(accepted) => v.accepted.push(accepted),
            Err(kind) => *v.rejected.entry(kind).or_default() += 1,
        }
    }
    v
}

/// One envelope of [`validate`], from client `id` that was given `task` (`None`: no task, so
/// `forged`): the accepted update, or why it was rejected.
pub fn check(
    id: ClientId,
    envelope: &UpdateEnvelope,
    task: Option<&TrainTask>,
    max_update_norm: Option<f64>,
) -> Result<Accepted, RejectionKind> {
    let task = task.ok_or(RejectionKind::Forged)?;
    let update = open(envelope, task).map_err(|rejection| {
        tracing::warn!(client = id, %rejection, "update rejected");
        rejection.kind()
    })?;
    if let Some(bound) = max_update_norm {
        let norm = update_norm(&update, task);
        // A NaN norm (which finite values never give) is rejected too.
        if norm.is_nan() || norm > bound {
            tracing::warn!(
                client = id,
                norm,
                bound,
                "update rejected: its norm exceeds federation.max_update_norm"
            );
            return Err(RejectionKind::NormBound);
        }
    }
    Ok(Accepted {
        client: id,
        update,
        loss: envelope.loss,
        train_seconds: envelope.train_seconds,
    })
}

/// ‖values − sent‖₂ of a decoded update against its task, in f64: over every dense tensor
/// (matched by name) and, for each sharded layer, over the returned factor columns `U'_I`, `V'_I`
/// against the ones sent. This is the server's own measure of the envelope's `update_norm`.
pub fn update_norm(update: &DecodedUpdate, task: &TrainTask) -> f64 {
    let squared = |new: &[f32], old: &[f32]| -> f64 {
        new.iter()
            .zip(old)
            .map(|(&a, &b)| {
                let d = f64::from(a) - f64::from(b);
                d * d
            })
            .sum::<f64>()
    };
    let mut sum = 0.0;
    for t in &update.dense.tensors {
        if let Some(sent) = task.dense.get(&t.name) {
            sum += squared(&t.data, &sent.data);
        }
    }
    for (got, sent) in update.shards.iter().zip(&task.shards) {
        sum += squared(&got.left, &sent.left) + squared(&got.right, &sent.right);
    }
    sum.sqrt()
}

/// What folding a round did to the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Folded {
    /// The global model is the aggregate.
    Updated,
    /// The model is unchanged; the text says why (too few updates, the policy declined).
    Unchanged(String),
    /// The aggregate overflowed f32 (finite updates can sum past its range); the model is
    /// unchanged.
    NonFinite,
}

/// Everything the aggregation policy is told about the round besides the updates.
#[derive(Debug, Clone, Copy)]
pub struct FoldContext<'a> {
    pub registry: &'a Registry,
    /// p_k of each participant (1 when every client takes part).
    pub probabilities: &'a BTreeMap<ClientId, f64>,
    pub failures: &'a BTreeMap<ClientId, ClientFailure>,
    /// Below this many accepted updates the model stays.
    pub min_successful: usize,
}

/// Folds the accepted updates into `global` through `aggregator`.
///
/// The model is laid out as blocks: every dense tensor, then each singular vector of each
/// sharded layer's factors `U'` and `V'` (the round's SVD in `plan`). A client's update covers
/// the dense blocks and the vectors it held, so the policy's fold is the per-singular-vector
/// average of docs/algorithms.md §1.1 step 5 (vectors nobody held stay). Sharded layers then move by
/// the change of their terms, `W ← W + Σ_i (u'_i v'_iᵀ − ū'_i v̄'_iᵀ)`, which is the paper's
/// recomposition `W = Σ u'_i v'_iᵀ` in exact arithmetic without its rounding where nothing
/// changed ([`apply_term_changes`]). Results go to the policy in client-id order with the
/// registry's D_c as their sample count, never a client's own claim.
///
/// The aggregate is built on a copy; `global` changes only when the policy moved it and every
/// value is finite.
pub fn fold(
    global: &mut ModelState,
    plan: Option<&ShardPlan>,
    accepted: &[Accepted],
    aggregator: &dyn Aggregator,
    ctx: FoldContext<'_>,
) -> Result<Folded, String> {
    if accepted.len() < ctx.min_successful.max(1) {
        return Ok(Folded::Unchanged(format!(
            "{} accepted updates, the minimum is {}",
            accepted.len(),
            ctx.min_successful.max(1)
        )));
    }
    let mut order: Vec<&Accepted> = accepted.iter().collect();
    order.sort_by_key(|a| a.client);
    let samples = |id: ClientId| -> Result<f64, String> {
        ctx.registry
            .clients
            .get(&id)
            .map(|c| c.samples as f64)
            .ok_or_else(|| format!("client {id} is not in the registry"))
    };
    let results = order
        .iter()
        .map(|a| {
            Ok(Contribution {
                client: a.client,
                samples: samples(a.client)?,
                inclusion_probability: ctx.probabilities.get(&a.client).copied().unwrap_or(1.0),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let failures: Vec<Failure> = ctx
        .failures
        .iter()
        .map(|(id, f)| Failure {
            client: *id,
            reason: format!("{}: {}", f.kind.label(), f.reason),
        })
        .collect();
    let population_samples = ctx
        .registry
        .clients
        .values()
        .map(|c| c.samples as f64)
        .sum();

    let mut next = global.clone();
    let mut factors: Vec<_> = plan
        .map(|p| p.factors.iter().map(|(_, f)| f.clone()).collect())
        .unwrap_or_default();
    let dense_index: BTreeMap<&str, usize> = global
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    // Block b < tensors: tensor b; then, layer by layer, U' terms then V' terms.
    let mut layer_start = Vec::with_capacity(factors.len());
    let mut start = global.tensors.len();
    for f in &factors {
        layer_start.push(start);
        start += 2 * f.singular_values.len();
    }
    let updates = order
        .iter()
        .map(|a| blocks_of(a, &dense_index, &factors, &layer_start))
        .collect::<Result<Vec<_>, String>>()?;
    let mut blocks: Vec<&mut [f32]> = next
        .tensors
        .iter_mut()
        .map(|t| t.data.as_mut_slice())
        .collect();
    for f in factors.iter_mut() {
        let (rows, cols) = (f.rows, f.cols);
        blocks.extend(f.left.chunks_mut(rows));
        blocks.extend(f.right.chunks_mut(cols));
    }
    let round = FitRound {
        outcome: RoundOutcome {
            results: &results,
            failures: &failures,
            population_samples,
        },
        updates: &updates,
    };
    let fit = aggregator
        .aggregate_fit(&mut blocks, &round)
        .map_err(|e| format!("aggregator {}: {e}", aggregator.name()))?;
    if let Fit::NoUpdate(why) = fit {
        return Ok(Folded::Unchanged(why));
    }
    if let Some(plan) = plan {
        for ((name, sent), f) in plan.factors.iter().zip(&factors) {
            if let Some(tensor) = next.get_mut(name) {
                apply_term_changes(&mut tensor.data, sent, f);
            }
        }
    }
    if !next.is_finite() {
        return Ok(Folded::NonFinite);
    }
    *global = next;
    Ok(Folded::Updated)
}

/// The cosine similarity between the update the server applied to the global model and the one
/// its accepted clients asked for (the sharding paper, Sec. 5 / Fig. 4).
///
/// `Δ = after − before`, flattened over every tensor, is compared with the sample-weighted
/// mean `ū = Σ_c D_c u_c / Σ_c D_c` (D_c from the registry, as in the fold) of each client's own
/// update `u_c` in the full weight space: `values − sent` for a dense tensor, and for a sharded
/// layer the change of the effective weight over the terms the client held,
/// `U'_new V'_newᵀ − U'_sent V'_sentᵀ` (columns `I` only, without the frozen multipliers ω, so in
/// the same space as the server's recomposition `W = Σ u'_i v'_iᵀ`); tensors a client did not
/// train count as zero in its `u_c`. All sums are in f64.
///
/// Why: FedAvg of dense updates gives `Δ = ū` exactly (cosine 1). Spectral sharding averages
/// each singular vector over the clients that held it and recomposes, so `Δ` differs from `ū` by
/// the cross terms of the product and by whom each term was averaged over; a strategy whose
/// aggregate points away from what the clients asked for (a biased sampler, a large ω scaling
/// one term, an aggregator that re-weights) shows a cosine well below 1, however its accuracy
/// happens to move. `None` when the model did not change (`Δ = 0`), when the clients asked for
/// no change (`ū = 0`), or when there is no accepted update.
pub fn update_cosine(
    before: &ModelState,
    after: &ModelState,
    accepted: &[Accepted],
    tasks: &BTreeMap<ClientId, TrainTask>,
    registry: &Registry,
) -> Option<f64> {
    let weight = |id: ClientId| registry.clients.get(&id).map_or(0.0, |c| c.samples as f64);
    let total: f64 = accepted.iter().map(|a| weight(a.client)).sum();
    if accepted.is_empty() || total <= 0.0 {
        return None;
    }
    let (mut dot, mut applied, mut asked) = (0.0f64, 0.0f64, 0.0f64);
    for new in &after.tensors {
        let old = before.get(&new.name)?;
        if old.data.len() != new.data.len() {
            return None;
        }
        let (rows, cols) = new.matrix_shape();
        // ū restricted to this tensor.
        let mut mean = vec![0.0f64; new.data.len()];
        for a in accepted {
            let w = weight(a.client) / total;
            let Some(task) = tasks.get(&a.client) else {
                continue;
            };
            if let (Some(t), Some(sent)) =
                (a.update.dense.get(&new.name), task.dense.get(&new.name))
            {
                for ((m, &v), &s) in mean.iter_mut().zip(&t.data).zip(&sent.data) {
                    *m += w * (f64::from(v) - f64::from(s));
                }
            }
            let shards = a.update.shards.iter().zip(&task.shards);
            for (got, sent) in shards.filter(|(g, _)| g.name == new.name) {
                // w Σ_j (u'_j v'_jᵀ − ū'_j v̄'_jᵀ), as one product over the stacked terms.
                let mut terms = Vec::with_capacity(2 * got.indices.len());
                for j in 0..got.indices.len() {
                    let (Some(ul), Some(ur), Some(sl), Some(sr)) = (
                        got.left.get(j * rows..(j + 1) * rows),
                        got.right.get(j * cols..(j + 1) * cols),
                        sent.left.get(j * rows..(j + 1) * rows),
                        sent.right.get(j * cols..(j + 1) * cols),
                    ) else {
                        return None;
                    };
                    terms.extend([(w, ul, ur), (-w, sl, sr)]);
                }
                let change = fedshard_strategies::svd::weighted_outer_sum(&terms, rows, cols);
                for (m, d) in mean.iter_mut().zip(change) {
                    *m += d;
                }
            }
        }
        for ((m, &n), &o) in mean.iter().zip(&new.data).zip(&old.data) {
            let d = f64::from(n) - f64::from(o);
            dot += d * m;
            applied += d * d;
            asked += m * m;
        }
    }
    if applied == 0.0 || asked == 0.0 {
        return None;
    }
    let cosine = dot / (applied.sqrt() * asked.sqrt());
    cosine.is_finite().then_some(cosine.clamp(-1.0, 1.0))
}

/// The blocks one accepted update trained: its dense tensors by name, and for each sharded layer
/// the U' and V' vectors of the terms it held.
fn blocks_of<'a>(
    a: &'a Accepted,
    dense_index: &BTreeMap<&str, usize>,
    factors: &[fedshard_strategies::svd::Factors<f32>],
    layer_start: &[usize],
) -> Result<Vec<BlockUpdate<'a>>, String> {
    let mut blocks = Vec::new();
    for t in &a.update.dense.tensors {
        let b = dense_index
            .get(t.name.as_str())
            .ok_or_else(|| format!("client {}: unknown tensor `{}`", a.client, t.name))?;
        blocks.push((*b, t.data.as_slice()));
    }
    if a.update.shards.len() != factors.len() {
        return Err(format!(
            "client {}: {} sharded layers in the update, {} in the plan",
            a.client,
            a.update.shards.len(),
            factors.len()
        ));
    }
    for ((shard, f), &start) in a.update.shards.iter().zip(factors).zip(layer_start) {
        let terms = f.singular_values.len();
        for (j, &term) in shard.indices.iter().enumerate() {
            let left = shard.left.get(j * f.rows..(j + 1) * f.rows);
            let right = shard.right.get(j * f.cols..(j + 1) * f.cols);
            let (Some(left), Some(right)) = (left, right) else {
                return Err(format!(
                    "client {}: short factors of `{}`",
                    a.client, shard.name
                ));
            };
            blocks.push((start + term, left));
            blocks.push((start + terms + term, right));
        }
    }
    Ok(blocks)
}

/// Everything a round's record is made of.
#[derive(Debug, Clone)]
pub struct RoundSummary<'a> {
    pub round: u64,
    pub tasks: &'a Tasks,
    pub envelopes: &'a BTreeMap<ClientId, UpdateEnvelope>,
    pub failures: &'a BTreeMap<ClientId, ClientFailure>,
    pub validated: &'a Validated,
    pub folded: &'a Folded,
    pub plan: Option<&'a ShardPlan>,
    pub evaluation: fedshard_protocol::task::Evaluation,
    pub parameters: usize,
    pub learning_rate: f64,
    pub seconds: f64,
    /// [`update_cosine`] of the round (`None` when the model did not change).
    pub update_cosine: Option<f64>,
}

/// The round's [`RoundRecord`]: counts by kind, bits on both links, losses and timings.
pub fn record(s: &RoundSummary<'_>) -> RoundRecord {
    let accepted = &s.validated.accepted;
    let mut failures: BTreeMap<FailureKind, usize> = BTreeMap::new();
    for f in s.failures.values() {
        *failures.entry(f.kind).or_default() += 1;
    }
    let mut rejected = s.validated.rejected.clone();
    if *s.folded == Folded::NonFinite {
        *rejected
            .entry(RejectionKind::NonFiniteAggregate)
            .or_default() += 1;
    }
    let uplink_bits: u64 = s.envelopes.values().map(|e| e.payload.bits).sum();
    let train_loss = if accepted.is_empty() {
        f64::NAN
    } else {
        accepted.iter().map(|a| a.loss).sum::<f64>() / accepted.len() as f64
    };
    let (anme, groups) = s
        .plan
        .map_or((0.0, vec![]), |p| (p.anme(), p.groups.clone()));
    RoundRecord {
        round: s.round,
        participants: s.tasks.tasks.len(),
        successes: accepted.len(),
        failures,
        rejected,
        model_updated: *s.folded == Folded::Updated,
        accuracy: s.evaluation.accuracy,
        loss: s.evaluation.loss,
        train_loss,
        uplink_bits,
        client_uplink_bits: s
            .envelopes
            .iter()
            .map(|(id, e)| (*id, e.payload.bits))
            .collect(),
        downlink_bits: s.tasks.downlink_bits,
        bits_per_parameter: if accepted.is_empty() {
            0.0
        } else {
            uplink_bits as f64 / s.parameters.max(1) as f64 / s.envelopes.len() as f64
        },
        anme,
        groups,
        learning_rate: s.learning_rate,
        client_train_seconds: accepted.iter().map(|a| a.train_seconds).collect(),
        seconds: s.seconds,
        update_cosine: s.update_cosine,
        late: 0,
        staleness: vec![],
        phases: Default::default(),
        klms: KlmsStats::of(accepted.iter().filter_map(|a| a.update.side.as_ref())),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::coordinator::ClientRecord;
    use fedshard_protocol::model::NamedTensor;
    use fedshard_protocol::payload::encode;
    use fedshard_protocol::shard_plan::plan_shards;
    use fedshard_protocol::task::{Evaluation, TrainOutput};
    use fedshard_strategies::aggregation::AggregatorName;
    use fedshard_strategies::sampling::SamplerName;
    use fedshard_strategies::selection::SelectorName;
    use fedshard_strategies::sharding::plan::{Base, StrategySpec};
    use fedshard_strategies::svd::recompose;

    pub(crate) fn global() -> ModelState {
        ModelState::new(vec![
            NamedTensor::new("b", vec![2], vec![0.5, -0.5]).unwrap(),
            NamedTensor::new("w", vec![2, 3], vec![3.0, 0.0, 1.0, 0.0, 2.0, 0.5]).unwrap(),
        ])
        .unwrap()
    }

    pub(crate) fn policy() -> ShardingPolicy {
        ShardingPolicy {
            strategy: StrategySpec::new(Base::TopN),
            sampler: SamplerName::ConditionalPoisson,
            layers: vec!["w".into()],
        }
    }

    pub(crate) fn recipe() -> Recipe {
        Recipe {
            learning_rate: 0.1,
            epochs: 1,
            batch_size: 4,
            momentum: 0.9,
            weight_decay: 0.0,
            clip_lr: None,
        }
    }

    pub(crate) fn registry(samples: &[(ClientId, u64)]) -> Registry {
        Registry {
            clients: samples
                .iter()
                .map(|&(id, samples)| {
                    let record = ClientRecord {
                        id,
                        keep_ratio: 0.5,
                        samples,
                        failures: 0,
                    };
                    (id, record)
                })
                .collect(),
            selector: SelectorName::Uniform,
            budget: samples.len() as f64,
            max_clusters: None,
        }
    }

    /// The round's plan and tasks for clients 1 and 2 at keep ratio 0.5 (one of two terms).
    pub(crate) fn planned() -> (ShardPlan, Tasks) {
        planned_with(&[(1, 0.5), (2, 0.5)])
    }

    /// The round's plan and tasks for `(client, keep ratio)` participants.
    pub(crate) fn planned_with(clients: &[(ClientId, f64)]) -> (ShardPlan, Tasks) {
        let participants: Vec<Participant> = clients
            .iter()
            .map(|&(client, keep_ratio)| Participant { client, keep_ratio })
            .collect();
        let plan = plan_shards(&global(), &policy(), &participants, 7, 3).unwrap();
        let tasks = build_tasks(
            &global(),
            Some(&policy()),
            Some(&plan),
            &participants,
            (7, 3),
            &recipe(),
        );
        (plan, tasks)
    }

    pub(crate) fn envelope(task: &TrainTask, output: &TrainOutput) -> UpdateEnvelope {
        UpdateEnvelope {
            client: task.client,
            round: task.round,
            loss: 1.0,
            update_norm: 0.0,
            train_seconds: 0.25,
            payload: encode(task, output).expect("identity encodes"),
        }
    }

    /// What a client that trained zero steps returns: its task, unchanged.
    pub(crate) fn unchanged(task: &TrainTask) -> TrainOutput {
        TrainOutput {
            dense: task.dense.clone(),
            shards: task.shards.clone(),
            loss: 1.0,
        }
    }

    /// Adds `step` to every factor value of the output's first shard.
    pub(crate) fn shift_factors(out: &mut TrainOutput, step: f32) {
        let s = &mut out.shards[0];
        s.left
            .iter_mut()
            .chain(s.right.iter_mut())
            .for_each(|x| *x += step);
    }

    pub(crate) fn accepted(
        tasks: &Tasks,
        edit: impl Fn(ClientId, &mut TrainOutput),
    ) -> Vec<Accepted> {
        let envelopes = tasks
            .tasks
            .iter()
            .map(|(id, t)| {
                let mut out = unchanged(t);
                edit(*id, &mut out);
                (*id, envelope(t, &out))
            })
            .collect();
        let v = validate(&envelopes, &tasks.tasks, None);
        assert!(v.rejected.is_empty(), "{:?}", v.rejected);
        v.accepted
    }

    pub(crate) fn context<'a>(
        registry: &'a Registry,
        probabilities: &'a BTreeMap<ClientId, f64>,
        failures: &'a BTreeMap<ClientId, ClientFailure>,
        min_successful: usize,
    ) -> FoldContext<'a> {
        FoldContext {
            registry,
            probabilities,
            failures,
            min_successful,
        }
    }

    pub(crate) fn fedavg() -> Box<dyn Aggregator> {
        AggregatorName::Fedavg.build().unwrap()
    }

    /// FedAvg over `updates` with full participation and no failures.
    fn fold_fedavg(
        model: &mut ModelState,
        plan: &ShardPlan,
        updates: &[Accepted],
        registry: &Registry,
        min_successful: usize,
    ) -> Folded {
        let (p, f) = (BTreeMap::new(), BTreeMap::new());
        let ctx = context(registry, &p, &f, min_successful);
        fold(model, Some(plan), updates, fedavg().as_ref(), ctx).unwrap()
    }

    #[test]
    fn tasks_carry_the_dense_part_and_each_clients_shards() {
        let (plan, tasks) = planned();
        assert_eq!(tasks.tasks.len(), 2);
        let mut bits = 0;
        for (id, task) in &tasks.tasks {
            assert_eq!((task.client, task.round, task.seed), (*id, 3, 7));
            assert_eq!(task.dense.tensors.len(), 1, "only `b` is trained densely");
            assert_eq!(task.shards, plan.shards[id]);
            assert_eq!(
                task.shards[0].indices,
                vec![0],
                "top-n keeps the largest term"
            );
            bits += 8 * bincode::serde::encode_to_vec(task, bincode::config::standard())
                .unwrap()
                .len() as u64;
        }
        assert_eq!(tasks.downlink_bits, bits);
        let dense = build_tasks(
            &global(),
            None,
            None,
            &[Participant {
                client: 4,
                keep_ratio: 1.0,
            }],
            (7, 3),
            &recipe(),
        );
        assert_eq!(dense.tasks[&4].dense, global());
        assert!(dense.tasks[&4].shards.is_empty());
    }

    #[test]
    fn every_outcome_is_sorted_and_silence_is_unreachable() {
        let (_, tasks) = planned();
        let task = &tasks.tasks[&1];
        let update = envelope(task, &unchanged(task));
        let outcomes = BTreeMap::from([
            (1, Outcome::Reply(ClientReply::Update(update.clone()))),
            (
                2,
                Outcome::Reply(ClientReply::Trained {
                    client: 2,
                    update_norm: 0.5,
                }),
            ),
            (
                3,
                Outcome::Reply(ClientReply::Failed {
                    client: 3,
                    reason: "boom".into(),
                    panicked: true,
                }),
            ),
            (
                4,
                Outcome::Reply(ClientReply::Failed {
                    client: 4,
                    reason: "diverged".into(),
                    panicked: false,
                }),
            ),
            (5, Outcome::Timeout),
            (6, Outcome::Unreachable("node down".into())),
            (8, Outcome::Timeout),
        ]);
        let c = classify(1..=7, outcomes);
        assert_eq!(c.envelopes, BTreeMap::from([(1, update)]));
        assert_eq!(c.norms, BTreeMap::from([(2, 0.5)]));
        let kinds: Vec<(ClientId, FailureKind)> =
            c.failures.iter().map(|(id, f)| (*id, f.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (3, FailureKind::Panic),
                (4, FailureKind::Error),
                (5, FailureKind::Timeout),
                (6, FailureKind::Unreachable),
                (7, FailureKind::Unreachable),
            ],
            "client 8 was not asked and is ignored"
        );
        assert_eq!(c.failures[&3].reason, "boom");
    }

    #[test]
    fn stale_forged_and_malformed_envelopes_are_counted_never_accepted() {
        let (_, tasks) = planned();
        let good = |id: ClientId| envelope(&tasks.tasks[&id], &unchanged(&tasks.tasks[&id]));
        let mut stale = good(2);
        stale.round = 2;
        // Client 2's actor answers, but the envelope claims to come from client 1.
        let mut forged = good(1);
        forged.client = 1;
        let mut truncated = good(2);
        truncated.payload.bytes.truncate(5);
        for (envelope, kind) in [
            (stale, RejectionKind::Stale),
            (forged, RejectionKind::Forged),
            (truncated, RejectionKind::Malformed),
        ] {
            let envelopes = BTreeMap::from([(1, good(1)), (2, envelope)]);
            let v = validate(&envelopes, &tasks.tasks, None);
            assert_eq!(v.rejected, BTreeMap::from([(kind, 1)]), "{kind:?}");
            assert_eq!(v.accepted.len(), 1);
            assert_eq!(v.accepted[0].client, 1);
        }
        let mut foreign = good(1);
        foreign.client = 9;
        // An envelope from a client that was given no task at all.
        let v = validate(&BTreeMap::from([(9, foreign)]), &tasks.tasks, None);
        assert_eq!(v.rejected, BTreeMap::from([(RejectionKind::Forged, 1)]));
        assert!(v.accepted.is_empty());
    }

    /// Client 1 moves `b` by +4 (norm √32 ≈ 5.66, whatever its envelope claims); client 2 sends
    /// its task back. A bound of 1 rejects client 1 as `norm_bound` and the fold never sees it; a
    /// bound of 10, or none, lets both through.
    #[test]
    fn an_update_over_the_norm_bound_is_counted_and_never_reaches_the_model() {
        let (plan, tasks) = planned();
        let envelopes: BTreeMap<ClientId, UpdateEnvelope> = tasks
            .tasks
            .iter()
            .map(|(id, t)| {
                let mut out = unchanged(t);
                if *id == 1 {
                    out.dense.tensors[0].data.iter_mut().for_each(|x| *x += 4.0);
                }
                (*id, envelope(t, &out))
            })
            .collect();
        let all = validate(&envelopes, &tasks.tasks, None);
        assert!(all.rejected.is_empty());
        let norm = update_norm(&all.accepted[0].update, &tasks.tasks[&1]);
        assert!((norm - 32f64.sqrt()).abs() < 1e-12, "{norm}");
        assert_eq!(update_norm(&all.accepted[1].update, &tasks.tasks[&2]), 0.0);

        let bounded = validate(&envelopes, &tasks.tasks, Some(1.0));
        assert_eq!(
            bounded.rejected,
            BTreeMap::from([(RejectionKind::NormBound, 1)])
        );
        assert_eq!(RejectionKind::NormBound.label(), "norm_bound");
        assert_eq!(bounded.accepted.len(), 1);
        assert_eq!(bounded.accepted[0].client, 2);
        let reg = registry(&[(1, 1), (2, 1)]);
        let mut model = global();
        let folded = fold_fedavg(&mut model, &plan, &bounded.accepted, &reg, 1);
        assert_eq!(folded, Folded::Updated);
        assert_eq!(
            model.get("b").unwrap().data,
            global().get("b").unwrap().data,
            "client 1's +4 never reaches the model"
        );

        let loose = validate(&envelopes, &tasks.tasks, Some(10.0));
        assert!(loose.rejected.is_empty());
        assert_eq!(loose.accepted, all.accepted);
        let mut model = global();
        fold_fedavg(&mut model, &plan, &loose.accepted, &reg, 1);
        assert_eq!(model.get("b").unwrap().data, vec![2.5, 1.5]);
    }

    /// Tasks of clients 1 and 2 for the whole model, trained densely.
    pub(crate) fn dense_tasks() -> Tasks {
        let participants = [1, 2].map(|client| Participant {
            client,
            keep_ratio: 1.0,
        });
        build_tasks(&global(), None, None, &participants, (7, 3), &recipe())
    }

    /// Identical clients under FedAvg on a dense model: the applied update is exactly what they
    /// asked for, cosine 1. A policy that follows only one of two orthogonal requests has cosine
    /// 1/√2; a round that leaves the model has none.
    #[test]
    fn the_update_cosine_is_one_for_identical_dense_clients_and_less_when_the_policy_strays() {
        let tasks = dense_tasks();
        let updates = accepted(&tasks, |_, out| {
            for t in &mut out.dense.tensors {
                for (i, x) in t.data.iter_mut().enumerate() {
                    *x += 0.125 * (i as f32 + 1.0);
                }
            }
        });
        let reg = registry(&[(1, 2), (2, 5)]);
        let (p, f) = (BTreeMap::new(), BTreeMap::new());
        let mut model = global();
        let folded = fold(
            &mut model,
            None,
            &updates,
            fedavg().as_ref(),
            context(&reg, &p, &f, 1),
        );
        assert_eq!(folded.unwrap(), Folded::Updated);
        let cosine = update_cosine(&global(), &model, &updates, &tasks.tasks, &reg).unwrap();
        assert!((cosine - 1.0).abs() < 1e-12, "{cosine}");
        // Nothing changed: no cosine.
        assert_eq!(
            update_cosine(&global(), &global(), &updates, &tasks.tasks, &reg),
            None
        );

        // Client 1 asks for +1 on b[0], client 2 for +1 on b[1]; the last-wins policy applies
        // client 2's alone: Δ = (0, 1), ū = (½, ½).
        let updates = accepted(&tasks, |id, out| {
            out.dense.get_mut("b").unwrap().data[id as usize - 1] += 1.0;
        });
        let reg = registry(&[(1, 1), (2, 1)]);
        let mut model = global();
        fold(
            &mut model,
            None,
            &updates,
            &LastWins,
            context(&reg, &p, &f, 1),
        )
        .unwrap();
        let cosine = update_cosine(&global(), &model, &updates, &tasks.tasks, &reg).unwrap();
        assert!((cosine - 0.5f64.sqrt()).abs() < 1e-12, "{cosine}");
    }

    /// On a sharded layer a client's update is the change of U'_I V'_Iᵀ: one client that scales
    /// the only term it holds asks for exactly what FedAvg applies, so the cosine is 1 up to the
    /// SVD's f32 rounding.
    #[test]
    fn the_update_cosine_counts_a_sharded_clients_effective_weight_change() {
        let (plan, tasks) = planned();
        let updates = accepted(&tasks, |_, out| {
            out.shards[0].left.iter_mut().for_each(|x| *x *= 1.5);
        });
        let reg = registry(&[(1, 1), (2, 1)]);
        let mut model = global();
        assert_eq!(
            fold_fedavg(&mut model, &plan, &updates, &reg, 1),
            Folded::Updated
        );
        let cosine = update_cosine(&global(), &model, &updates, &tasks.tasks, &reg).unwrap();
        assert!((cosine - 1.0).abs() < 1e-5, "{cosine}");
    }

    /// Client 1 (D = 1) and client 2 (D = 3) both hold term 0 of `w`; client 1 moves `b` by +4
    /// and every factor value by +1, client 2 moves nothing. FedAvg weights from the registry are
    /// 1/4 and 3/4, so each coordinate moves by a quarter of client 1's change.
    #[test]
    fn the_fold_is_the_hand_computed_weighted_mean_with_the_registrys_weights() {
        let (plan, tasks) = planned();
        let updates = accepted(&tasks, |id, out| {
            if id == 1 {
                out.dense.tensors[0].data.iter_mut().for_each(|x| *x += 4.0);
                shift_factors(out, 1.0);
            }
        });
        let reg = registry(&[(1, 1), (2, 3)]);
        let mut model = global();
        let folded = fold_fedavg(&mut model, &plan, &updates, &reg, 1);
        assert_eq!(folded, Folded::Updated);
        assert_eq!(model.get("b").unwrap().data, vec![1.5, 0.5]);
        let mut factors = plan.factors[0].1.clone();
        let (rows, cols) = (factors.rows, factors.cols);
        factors.left[..rows].iter_mut().for_each(|x| *x += 0.25);
        factors.right[..cols].iter_mut().for_each(|x| *x += 0.25);
        let want = recompose(&factors);
        for (g, w) in model.get("w").unwrap().data.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
        // The envelope carries no sample count: only the registry decides. D = (3, 1) moves the
        // model by three quarters instead.
        let reg = registry(&[(1, 3), (2, 1)]);
        let mut model = global();
        fold_fedavg(&mut model, &plan, &updates, &reg, 1);
        assert_eq!(model.get("b").unwrap().data, vec![3.5, 2.5]);
    }

    /// The sharding paper, Sec. 3.1: a client at keep ratio 1 (every term, ω = 1) and a sharded one in
    /// the same round. Each singular vector is averaged over the clients that held it, so term
    /// 0 (both) moves by the mean of their changes, +1.5, and term 1 (client 1 alone) by client
    /// 1's, +1; the dense bias moves by the mean, +2. `W` is then the recomposition.
    #[test]
    fn a_whole_model_client_and_a_sharded_one_combine_per_singular_vector() {
        let (plan, tasks) = planned_with(&[(1, 1.0), (2, 0.5)]);
        assert_eq!(tasks.tasks[&1].shards[0].indices, vec![0, 1]);
        assert_eq!(tasks.tasks[&2].shards[0].indices, vec![0]);
        let updates = accepted(&tasks, |id, out| {
            if id == 1 {
                out.dense.tensors[0].data.iter_mut().for_each(|x| *x += 4.0);
            }
            shift_factors(out, if id == 1 { 1.0 } else { 2.0 });
        });
        let mut model = global();
        let folded = fold_fedavg(&mut model, &plan, &updates, &registry(&[(1, 1), (2, 1)]), 1);
        assert_eq!(folded, Folded::Updated);
        assert_eq!(model.get("b").unwrap().data, vec![2.5, 1.5]);
        let mut factors = plan.factors[0].1.clone();
        let (rows, cols) = (factors.rows, factors.cols);
        factors.left[..rows].iter_mut().for_each(|x| *x += 1.5);
        factors.right[..cols].iter_mut().for_each(|x| *x += 1.5);
        factors.left[rows..].iter_mut().for_each(|x| *x += 1.0);
        factors.right[cols..].iter_mut().for_each(|x| *x += 1.0);
        let want = recompose(&factors);
        for (g, w) in model.get("w").unwrap().data.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    #[test]
    fn zero_local_steps_leave_the_model_bit_identical() {
        let (plan, tasks) = planned();
        let updates = accepted(&tasks, |_, _| {});
        let reg = registry(&[(1, 5), (2, 7)]);
        let mut model = global();
        fold_fedavg(&mut model, &plan, &updates, &reg, 1);
        assert_eq!(
            model.get("b").unwrap().data,
            global().get("b").unwrap().data
        );
        // Sharded layers move by the change of their terms: none, so not even the SVD's
        // rounding reaches them.
        assert_eq!(model.to_bytes(), global().to_bytes());
    }

    #[test]
    fn too_few_updates_or_an_overflowing_aggregate_leave_the_model() {
        let (plan, tasks) = planned();
        let reg = registry(&[(1, 1), (2, 1)]);
        let updates = accepted(&tasks, |_, _| {});
        let mut model = global();
        let folded = fold_fedavg(&mut model, &plan, &updates, &reg, 3);
        assert!(matches!(folded, Folded::Unchanged(_)), "{folded:?}");
        assert_eq!(model.to_bytes(), global().to_bytes());

        let huge = accepted(&tasks, |_, out| {
            let s = &mut out.shards[0];
            s.left
                .iter_mut()
                .chain(s.right.iter_mut())
                .for_each(|x| *x = f32::MAX);
        });
        let folded = fold_fedavg(&mut model, &plan, &huge, &reg, 1);
        assert_eq!(folded, Folded::NonFinite);
        assert_eq!(model.to_bytes(), global().to_bytes());
    }

    /// A policy the runtime has never seen plugs in through the trait alone: this one moves
    /// every block to its last holder's values, and declines rounds with a failure.
    #[derive(Debug)]
    struct LastWins;

    impl Aggregator for LastWins {
        fn name(&self) -> &'static str {
            "last-wins"
        }
        fn aggregate_fit(
            &self,
            global: &mut [&mut [f32]],
            round: &FitRound,
        ) -> fedshard_strategies::Result<Fit> {
            if !round.outcome.failures.is_empty() {
                return Ok(Fit::NoUpdate("a client failed".into()));
            }
            for blocks in round.updates {
                for (b, values) in blocks {
                    global[*b].copy_from_slice(values);
                }
            }
            Ok(Fit::Updated)
        }
    }

    #[test]
    fn any_aggregator_folds_the_round_and_may_decline() {
        let (plan, tasks) = planned();
        let updates = accepted(&tasks, |id, out| {
            out.dense.tensors[0].data = vec![id as f32; 2];
        });
        let reg = registry(&[(1, 1), (2, 1)]);
        let p = BTreeMap::new();
        let mut model = global();
        let none = BTreeMap::new();
        let folded = fold(
            &mut model,
            Some(&plan),
            &updates,
            &LastWins,
            context(&reg, &p, &none, 1),
        );
        assert_eq!(folded.unwrap(), Folded::Updated);
        assert_eq!(
            model.get("b").unwrap().data,
            vec![2.0, 2.0],
            "client 2 folds last"
        );
        let failed = BTreeMap::from([(
            3,
            ClientFailure {
                kind: FailureKind::Timeout,
                reason: "late".into(),
            },
        )]);
        let mut model = global();
        let folded = fold(
            &mut model,
            Some(&plan),
            &updates,
            &LastWins,
            context(&reg, &p, &failed, 1),
        );
        assert_eq!(folded.unwrap(), Folded::Unchanged("a client failed".into()));
        assert_eq!(model.to_bytes(), global().to_bytes());
    }

    #[test]
    fn the_record_counts_by_kind_and_bits_by_envelope() {
        let (plan, tasks) = planned();
        let envelopes: BTreeMap<ClientId, UpdateEnvelope> = tasks
            .tasks
            .iter()
            .map(|(id, t)| (*id, envelope(t, &unchanged(t))))
            .collect();
        let validated = validate(&envelopes, &tasks.tasks, None);
        let failures = BTreeMap::from([(
            5,
            ClientFailure {
                kind: FailureKind::Timeout,
                reason: "late".into(),
            },
        )]);
        let r = record(&RoundSummary {
            round: 3,
            tasks: &tasks,
            envelopes: &envelopes,
            failures: &failures,
            validated: &validated,
            folded: &Folded::NonFinite,
            plan: Some(&plan),
            evaluation: Evaluation {
                accuracy: 0.5,
                loss: 1.5,
            },
            parameters: 8,
            learning_rate: 0.1,
            seconds: 1.0,
            update_cosine: None,
        });
        let uplink: u64 = envelopes.values().map(|e| e.payload.bits).sum();
        assert_eq!(r.uplink_bits, uplink);
        assert_eq!(r.client_uplink_bits.values().sum::<u64>(), uplink);
        assert_eq!(
            r.client_uplink_bits.keys().collect::<Vec<_>>(),
            envelopes.keys().collect::<Vec<_>>()
        );
        assert_eq!(r.downlink_bits, tasks.downlink_bits);
        assert_eq!(r.bits_per_parameter, uplink as f64 / 8.0 / 2.0);
        assert_eq!(r.failures, BTreeMap::from([(FailureKind::Timeout, 1)]));
        assert_eq!(
            r.rejected,
            BTreeMap::from([(RejectionKind::NonFiniteAggregate, 1)])
        );
        assert!(!r.model_updated);
        assert_eq!((r.successes, r.participants), (2, 2));
        assert_eq!(r.train_loss, 1.0);
        assert_eq!(r.client_train_seconds, vec![0.25, 0.25]);
    }
}
