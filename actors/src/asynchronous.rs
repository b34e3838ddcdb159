//! Buffered asynchronous aggregation (FedBuff; `[federation] mode = "async"`): `concurrency`
//! clients train at any time, each against the model version current when it was given its task;
//! every `buffer` accepted updates the server applies one aggregate, weighting each update by
//! its staleness s(τ), and hands out new work as soon as a client answers.
//!
//! Each update is folded as the change it asks for in the full weight space, computed against
//! the task it was trained from ([`weight_change`]): a dense tensor's `values − sent`, and for a
//! sharded layer the change of the terms it held on the SVD basis *of that task*,
//! `Σ_{i∈I} (u'_i v'_iᵀ − u_i v_iᵀ)`. That is exactly how a synchronous round moves a sharded
//! layer ([`crate::round::fold`] applies `W ← W + Σ_i (u'_i v'_iᵀ − ū'_i v̄'_iᵀ)`), so the
//! paper's recomposition needs no basis after the change is formed; re-projecting the change onto
//! the newer version's singular vectors would only drop the part outside the terms kept, and
//! averaging singular vectors of different versions term by term has no meaning (term i of two
//! SVDs are different vectors). The aggregate is FedBuff's
//! `W ← W + Σ_i (D_i / Σ_j D_j) s(τ_i) ΔW_i` over the buffer, D from the registry.
//!
//! What an outstanding client needs of its version, the task it was sent (its dense values, its
//! factor columns and its uplink settings, which a KLMS decoder needs as side information), is
//! kept with it until it answers: at most `concurrency` versions' worth, never the whole history.

use crate::coordinator::Registry;
use crate::record::{KlmsStats, PhaseSeconds, RoundRecord};
use crate::round::{Accepted, ClientFailure, FailureKind, Folded, Outcome, build_tasks, check};
use crate::schedule::{Arrivals, Staleness};
use crate::server::{ServerState, call_client};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::payload::RejectionKind;
use fedshard_protocol::shard_plan::{Participant, plan_shards};
use fedshard_protocol::task::{ClientId, Recipe, TrainTask};
use fedshard_protocol::uplink::Cohort;
use fedshard_strategies::rng::{Purpose, stream, uniform};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// A task given out and not answered yet.
#[derive(Debug)]
struct Outstanding {
    /// The model version it was trained from.
    version: u64,
    task: TrainTask,
}

/// An accepted update waiting in the buffer.
#[derive(Debug, Clone)]
pub struct Buffered {
    pub accepted: Accepted,
    /// The task it answers, whose values it is measured against.
    pub task: TrainTask,
    /// The model version its client trained from.
    pub version: u64,
}

/// What happened since the last applied version, for its record.
#[derive(Debug)]
struct Since {
    started: Instant,
    answered: usize,
    failures: BTreeMap<FailureKind, usize>,
    rejected: BTreeMap<RejectionKind, usize>,
    client_uplink_bits: BTreeMap<ClientId, u64>,
    envelopes: usize,
    downlink_bits: u64,
    /// Time spent handing out work (plans, tasks) and waiting for answers; the version's
    /// aggregate and evaluation are timed where they run.
    phases: PhaseSeconds,
}

impl Since {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            answered: 0,
            failures: BTreeMap::new(),
            rejected: BTreeMap::new(),
            client_uplink_bits: BTreeMap::new(),
            envelopes: 0,
            downlink_bits: 0,
            phases: PhaseSeconds::default(),
        }
    }
}

/// The state of an async run between model versions.
pub struct AsyncRun {
    arrivals: Arrivals,
    outstanding: BTreeMap<ClientId, Outstanding>,
    buffer: Vec<Buffered>,
    /// Tasks handed out so far; the n-th has `round = n`, which keys its client's training
    /// stream and its fault draws, and which its envelope must carry back.
    dispatched: u64,
    since: Since,
}

impl AsyncRun {
    /// A run continuing after `history` (empty for a fresh one): the work outstanding at a
    /// checkpoint is not in it and is handed out afresh, numbered after every task answered.
    fn new(clock: Option<BTreeMap<ClientId, u64>>, history: &[RoundRecord]) -> Self {
        Self {
            arrivals: Arrivals::new(clock),
            outstanding: BTreeMap::new(),
            buffer: Vec::new(),
            dispatched: history.iter().map(|r| r.participants as u64).sum(),
            since: Since::new(),
        }
    }
}

/// Adds `scale` × the weight-space change `update` asks for against `task` to `change` (one f64
/// vector per tensor of `global`, in its order): `values − sent` for a dense tensor, and for a
/// sharded layer `Σ_{i∈I} (u'_i v'_iᵀ − u_i v_iᵀ)` over the terms it held, on the task's basis.
pub fn weight_change(
    change: &mut [Vec<f64>],
    global: &ModelState,
    update: &Accepted,
    task: &TrainTask,
    scale: f64,
) -> Result<(), String> {
    let index = |name: &str| {
        global
            .tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| format!("client {}: unknown tensor `{name}`", update.client))
    };
    for t in &update.update.dense.tensors {
        let i = index(&t.name)?;
        let sent = task
            .dense
            .get(&t.name)
            .ok_or_else(|| format!("client {}: `{}` was not sent", update.client, t.name))?;
        for ((c, &new), &old) in change[i].iter_mut().zip(&t.data).zip(&sent.data) {
            *c += scale * (f64::from(new) - f64::from(old));
        }
    }
    for (got, sent) in update.update.shards.iter().zip(&task.shards) {
        let i = index(&got.name)?;
        let (rows, cols) = global.tensors[i].matrix_shape();
        for j in 0..got.indices.len() {
            let (Some(ul), Some(ur), Some(sl), Some(sr)) = (
                got.left.get(j * rows..(j + 1) * rows),
                got.right.get(j * cols..(j + 1) * cols),
                sent.left.get(j * rows..(j + 1) * rows),
                sent.right.get(j * cols..(j + 1) * cols),
            ) else {
                return Err(format!(
                    "client {}: short factors of `{}`",
                    update.client, got.name
                ));
            };
            for r in 0..rows {
                let (un, us) = (scale * f64::from(ul[r]), scale * f64::from(sl[r]));
                let row = &mut change[i][r * cols..(r + 1) * cols];
                for ((c, &vn), &vs) in row.iter_mut().zip(ur).zip(sr) {
                    *c += un * f64::from(vn) - us * f64::from(vs);
                }
            }
        }
    }
    Ok(())
}

/// Applies the buffer to `global`, which is version `current`:
/// `W ← W + Σ_i (D_i / Σ_j D_j) s(current − version_i) ΔW_i` ([`weight_change`]). Returns what
/// happened and the staleness of each update, in buffer order; `global` changes only when every
/// value of the result is finite.
pub fn fold_buffered(
    global: &mut ModelState,
    buffer: &[Buffered],
    registry: &Registry,
    staleness: Staleness,
    current: u64,
) -> Result<(Folded, Vec<u64>), String> {
    let taus: Vec<u64> = buffer
        .iter()
        .map(|b| current.saturating_sub(b.version))
        .collect();
    let samples = |id: ClientId| -> Result<f64, String> {
        registry
            .clients
            .get(&id)
            .map(|c| c.samples as f64)
            .ok_or_else(|| format!("client {id} is not in the registry"))
    };
    let total: f64 = buffer
        .iter()
        .map(|b| samples(b.accepted.client))
        .sum::<Result<f64, String>>()?;
    if buffer.is_empty() || total <= 0.0 {
        return Ok((Folded::Unchanged("an empty buffer".into()), taus));
    }
    let mut change: Vec<Vec<f64>> = global
        .tensors
        .iter()
        .map(|t| vec![0.0; t.data.len()])
        .collect();
    for (b, &tau) in buffer.iter().zip(&taus) {
        let scale = samples(b.accepted.client)? / total * staleness.weight(tau);
        weight_change(&mut change, global, &b.accepted, &b.task, scale)?;
    }
    let mut next = global.clone();
    for (t, c) in next.tensors.iter_mut().zip(&change) {
        for (x, &d) in t.data.iter_mut().zip(c) {
            // An untouched value stays bit-identical.
            if d != 0.0 {
                *x = (f64::from(*x) + d) as f32;
            }
        }
    }
    if !next.is_finite() {
        return Ok((Folded::NonFinite, taus));
    }
    *global = next;
    Ok((Folded::Updated, taus))
}

impl ServerState {
    /// Runs the async schedule until model version `version` is applied and recorded.
    pub(crate) async fn async_step(&mut self, version: u64) -> Result<(), String> {
        let mut run = match self.asynchronous.take() {
            Some(run) => run,
            None => AsyncRun::new(self.fed.config.arrival_clock.clone(), &self.fed.history),
        };
        let result = self.async_step_with(&mut run, version).await;
        self.asynchronous = Some(run);
        result
    }

    async fn async_step_with(&mut self, run: &mut AsyncRun, version: u64) -> Result<(), String> {
        let config = self.fed.config.clone();
        let Some(settings) = config.asynchronous else {
            return Err("async step in a synchronous run".into());
        };
        while run.buffer.len() < settings.buffer {
            let handing = Instant::now();
            self.hand_out(run, version, settings.concurrency).await?;
            let waiting = Instant::now();
            run.since.phases.plan += (waiting - handing).as_secs_f64();
            let next = run.arrivals.next().await;
            run.since.phases.train += waiting.elapsed().as_secs_f64();
            let Some((id, outcome)) = next else {
                return Err("no client can be given work (none registered)".into());
            };
            let Some(out) = run.outstanding.remove(&id) else {
                continue;
            };
            run.since.answered += 1;
            let failure = |kind, reason: String| ClientFailure { kind, reason };
            let failed = match outcome {
                Outcome::Reply(crate::client::ClientReply::Update(e)) => {
                    run.since.envelopes += 1;
                    *run.since.client_uplink_bits.entry(id).or_default() += e.payload.bits;
                    match check(id, &e, Some(&out.task), config.max_update_norm) {
                        Ok(accepted) => run.buffer.push(Buffered {
                            accepted,
                            task: out.task,
                            version: out.version,
                        }),
                        Err(kind) => *run.since.rejected.entry(kind).or_default() += 1,
                    }
                    None
                }
                Outcome::Reply(crate::client::ClientReply::Failed {
                    reason, panicked, ..
                }) => {
                    let kind = if panicked {
                        FailureKind::Panic
                    } else {
                        FailureKind::Error
                    };
                    Some(failure(kind, reason))
                }
                Outcome::Reply(crate::client::ClientReply::Trained { .. }) => Some(failure(
                    FailureKind::Unreachable,
                    "answered out of protocol".into(),
                )),
                Outcome::Timeout => Some(failure(
                    FailureKind::Timeout,
                    "missed the task deadline".into(),
                )),
                Outcome::Unreachable(reason) => Some(failure(FailureKind::Unreachable, reason)),
            };
            if let Some(f) = failed {
                tracing::warn!(client = id, "{}: {}", f.kind.label(), f.reason);
                *run.since.failures.entry(f.kind).or_default() += 1;
                let _ = self
                    .coordinator
                    .cast(crate::coordinator::CoordinatorMsg::CountFailure { client: id });
            }
        }
        self.apply_buffer(run, version).await
    }

    /// Gives work to idle clients, each drawn uniformly with the stream (seed, n, 0, Selection)
    /// of the n-th task, until `concurrency` are training or none is idle.
    async fn hand_out(
        &mut self,
        run: &mut AsyncRun,
        version: u64,
        concurrency: usize,
    ) -> Result<(), String> {
        let config = self.fed.config.clone();
        let clusters = self.fed.registry.cluster_keep_ratios();
        while run.outstanding.len() < concurrency {
            let idle: Vec<ClientId> = self
                .fed
                .registry
                .clients
                .keys()
                .copied()
                .filter(|c| !run.outstanding.contains_key(c) && self.clients.contains_key(c))
                .collect();
            if idle.is_empty() {
                break;
            }
            run.dispatched += 1;
            let n = run.dispatched;
            let mut rng = stream(config.seed, n, 0, Purpose::Selection);
            let pick = idle[((uniform(&mut rng) * idle.len() as f64) as usize).min(idle.len() - 1)];
            let participant = Participant {
                client: pick,
                keep_ratio: clusters.get(&pick).copied().unwrap_or(1.0),
            };
            let model = self.fed.model.clone();
            let policy = config.sharding.clone();
            let seed = config.seed;
            let plan = tokio::task::spawn_blocking(move || match &policy {
                Some(policy) => {
                    plan_shards(&model, policy, &[participant], seed, n).map(|p| Some(Arc::new(p)))
                }
                None => Ok(None),
            })
            .await
            .map_err(|e| format!("sharding plan panicked: {e}"))??;
            let recipe = Recipe {
                learning_rate: config.learning_rate(version),
                ..config.recipe.clone()
            };
            let mut tasks = build_tasks(
                &self.fed.model,
                config.sharding.as_ref(),
                plan.as_deref(),
                &[participant],
                (seed, n),
                &recipe,
            );
            let cohort = Cohort {
                population: self.fed.registry.clients.len(),
                participants: concurrency,
                round: version,
            };
            let state = &self.fed.uplink;
            tasks.attach_uplinks(|task| {
                state.uplink(config.compressor, &config.compression, cohort, task)
            })?;
            run.since.downlink_bits += tasks.downlink_bits;
            let Some(task) = tasks.tasks.remove(&pick) else {
                return Err(format!("no task was built for client {pick}"));
            };
            let Some(actor) = self.clients.get(&pick).cloned() else {
                continue;
            };
            let work = call_client(
                actor,
                Some(Box::new(task.clone())),
                true,
                n,
                config.deadline,
            );
            run.arrivals.push(pick, work);
            run.outstanding.insert(
                pick,
                Outstanding {
                    version: version - 1,
                    task,
                },
            );
        }
        if run.outstanding.is_empty() {
            return Err("no client can be given work (none registered)".into());
        }
        Ok(())
    }

    /// Folds the full buffer into the model (version − 1 → version), evaluates and records.
    async fn apply_buffer(&mut self, run: &mut AsyncRun, version: u64) -> Result<(), String> {
        let config = self.fed.config.clone();
        let staleness = config.asynchronous.map(|a| a.staleness).unwrap_or_default();
        let aggregating = Instant::now();
        let buffer = std::mem::take(&mut run.buffer);
        let mut since = std::mem::replace(&mut run.since, Since::new());
        let sides: Vec<_> = buffer
            .iter()
            .filter_map(|b| Some((&b.task, b.accepted.update.side.as_ref()?)))
            .collect();
        self.fed
            .uplink
            .observe(config.compressor, &config.compression, &sides)
            .map_err(|e| format!("uplink state after version {version}: {e}"))?;
        let mut model = std::mem::take(&mut self.fed.model);
        let registry = self.fed.registry.clone();
        let (model, folded, buffer) = tokio::task::spawn_blocking(move || {
            let folded = fold_buffered(&mut model, &buffer, &registry, staleness, version - 1);
            (model, folded, buffer)
        })
        .await
        .map_err(|e| format!("aggregation panicked: {e}"))?;
        self.fed.model = model;
        let (folded, taus) = folded?;
        if folded == Folded::NonFinite {
            tracing::warn!(
                version,
                "the buffered aggregate is not finite; global model unchanged"
            );
        }
        let evaluating = Instant::now();
        since.phases.aggregate = (evaluating - aggregating).as_secs_f64();
        let evaluator = Arc::clone(&self.fed.evaluator);
        let model = self.fed.model.clone();
        let evaluation = tokio::task::spawn_blocking(move || evaluator.evaluate(&model))
            .await
            .map_err(|e| format!("evaluation panicked: {e}"))?
            .unwrap_or_else(|e| {
                tracing::error!(version, "evaluation failed: {e}");
                fedshard_protocol::task::Evaluation::FAILED
            });
        since.phases.evaluate = evaluating.elapsed().as_secs_f64();
        let mut rejected = since.rejected;
        if folded == Folded::NonFinite {
            *rejected
                .entry(RejectionKind::NonFiniteAggregate)
                .or_default() += 1;
        }
        let uplink_bits: u64 = since.client_uplink_bits.values().sum();
        let parameters = self.fed.model.num_parameters();
        let record = RoundRecord {
            round: version,
            participants: since.answered,
            successes: buffer.len(),
            failures: since.failures,
            rejected,
            model_updated: folded == Folded::Updated,
            accuracy: evaluation.accuracy,
            loss: evaluation.loss,
            train_loss: buffer.iter().map(|b| b.accepted.loss).sum::<f64>() / buffer.len() as f64,
            uplink_bits,
            client_uplink_bits: since.client_uplink_bits,
            downlink_bits: since.downlink_bits,
            bits_per_parameter: if since.envelopes == 0 {
                0.0
            } else {
                uplink_bits as f64 / parameters.max(1) as f64 / since.envelopes as f64
            },
            anme: 0.0,
            groups: vec![],
            learning_rate: config.learning_rate(version),
            client_train_seconds: buffer.iter().map(|b| b.accepted.train_seconds).collect(),
            seconds: since.started.elapsed().as_secs_f64(),
            update_cosine: None,
            late: 0,
            staleness: taus,
            phases: since.phases,
            klms: KlmsStats::of(
                buffer
                    .iter()
                    .filter_map(|b| b.accepted.update.side.as_ref()),
            ),
        };
        self.fed.history.push(record.clone());
        self.persist(&record).await?;
        if let Some(events) = &self.fed.events {
            let _ = events.send(record);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::tests::{accepted, context, dense_tasks, fedavg, global, planned, registry};
    use crate::round::{Tasks, fold};

    fn buffer(tasks: &Tasks, updates: Vec<Accepted>, versions: &[u64]) -> Vec<Buffered> {
        updates
            .into_iter()
            .zip(versions)
            .map(|(a, &version)| Buffered {
                task: tasks.tasks[&a.client].clone(),
                accepted: a,
                version,
            })
            .collect()
    }

    /// Dense clients of one version with s ≡ 1: FedBuff's buffer is the FedAvg round.
    #[test]
    fn a_fresh_dense_buffer_with_constant_weights_is_the_fedavg_round() {
        let tasks = dense_tasks();
        let updates = accepted(&tasks, |id, out| {
            for t in &mut out.dense.tensors {
                for (i, x) in t.data.iter_mut().enumerate() {
                    *x += 0.25 * (i as f32 + 1.0) * id as f32;
                }
            }
        });
        let reg = registry(&[(1, 2), (2, 5)]);
        let (p, f) = (BTreeMap::new(), BTreeMap::new());
        let mut sync = global();
        fold(
            &mut sync,
            None,
            &updates,
            fedavg().as_ref(),
            context(&reg, &p, &f, 1),
        )
        .unwrap();
        let mut buffered = global();
        let (folded, taus) = fold_buffered(
            &mut buffered,
            &buffer(&tasks, updates, &[4, 4]),
            &reg,
            Staleness::Constant,
            4,
        )
        .unwrap();
        assert_eq!((folded, taus), (Folded::Updated, vec![0, 0]));
        for (a, b) in sync.tensors.iter().zip(&buffered.tensors) {
            for (x, y) in a.data.iter().zip(&b.data) {
                assert!((x - y).abs() < 1e-6, "{x} vs {y}");
            }
        }
    }

    /// Client 1 (D = 1) moves `b` by +4 from version 0, client 2 (D = 3) by +8 from version 2;
    /// the model is version 2 and s(τ) = (1 + τ)⁻¹. The change is ¼ · s(2) · 4 + ¾ · s(0) · 8
    /// = ¼ · ⅓ · 4 + 6 = 19/3.
    #[test]
    fn stale_updates_move_the_model_by_their_hand_computed_weight() {
        let tasks = dense_tasks();
        let updates = accepted(&tasks, |id, out| {
            let step = if id == 1 { 4.0 } else { 8.0 };
            out.dense
                .get_mut("b")
                .unwrap()
                .data
                .iter_mut()
                .for_each(|x| *x += step);
        });
        let reg = registry(&[(1, 1), (2, 3)]);
        let mut model = global();
        let (folded, taus) = fold_buffered(
            &mut model,
            &buffer(&tasks, updates, &[0, 2]),
            &reg,
            Staleness::Polynomial { a: 1.0 },
            2,
        )
        .unwrap();
        assert_eq!((folded, taus), (Folded::Updated, vec![2, 0]));
        let want = [0.5 + 19.0 / 3.0, -0.5 + 19.0 / 3.0];
        for (g, w) in model.get("b").unwrap().data.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{g} vs {w}");
        }
        // `w` was sent and returned unchanged: not a bit of it moves.
        assert_eq!(
            model.get("w").unwrap().data,
            global().get("w").unwrap().data
        );
    }

    /// A sharded client trained on version 0's SVD; the model has moved on (0.5 added to every
    /// value of `w`). Its term change `1.5 u vᵀ − u vᵀ`, formed on the old basis, is added to the new
    /// weights as it is.
    #[test]
    fn a_term_change_from_an_older_basis_is_added_to_the_newer_model() {
        let (_, tasks) = planned();
        let updates: Vec<Accepted> = accepted(&tasks, |id, out| {
            if id == 1 {
                out.shards[0].left.iter_mut().for_each(|x| *x *= 1.5);
            }
        })
        .into_iter()
        .filter(|a| a.client == 1)
        .collect();
        let task = &tasks.tasks[&1];
        assert_eq!(task.shards[0].indices.len(), 1);
        let (u, v) = (&task.shards[0].left, &task.shards[0].right);
        let mut newer = global();
        newer
            .get_mut("w")
            .unwrap()
            .data
            .iter_mut()
            .for_each(|x| *x += 0.5);
        let before = newer.clone();
        let (folded, taus) = fold_buffered(
            &mut newer,
            &buffer(&tasks, updates, &[0]),
            &registry(&[(1, 1), (2, 1)]),
            Staleness::Constant,
            1,
        )
        .unwrap();
        assert_eq!((folded, taus), (Folded::Updated, vec![1]));
        let (rows, cols) = (u.len(), v.len());
        let got = &newer.get("w").unwrap().data;
        let old = &before.get("w").unwrap().data;
        for r in 0..rows {
            for c in 0..cols {
                let want = f64::from(old[r * cols + c]) + 0.5 * f64::from(u[r]) * f64::from(v[c]);
                let g = f64::from(got[r * cols + c]);
                assert!((g - want).abs() < 1e-6, "({r}, {c}): {g} vs {want}");
            }
        }
        assert_eq!(newer.get("b").unwrap().data, before.get("b").unwrap().data);
    }

    /// Each update asks for +MAX on `b` of a model already at MAX: the sum leaves f32, so the
    /// model stays as it was.
    #[test]
    fn an_overflowing_buffer_leaves_the_model() {
        let tasks = dense_tasks();
        let updates = accepted(&tasks, |_, out| {
            out.dense.get_mut("b").unwrap().data = vec![f32::MAX; 2];
        });
        let mut model = global();
        model.get_mut("b").unwrap().data = vec![f32::MAX; 2];
        let before = model.clone();
        let (folded, _) = fold_buffered(
            &mut model,
            &buffer(&tasks, updates, &[0, 0]),
            &registry(&[(1, 1), (2, 1)]),
            Staleness::Constant,
            0,
        )
        .unwrap();
        assert_eq!(folded, Folded::NonFinite);
        assert_eq!(model.to_bytes(), before.to_bytes());
    }
}
