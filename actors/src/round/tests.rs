//! The round's plain functions against hand-computed oracles; the buffered fold's in
//! [`buffered`].

mod buffered;
mod private;
mod width;

use super::*;
use crate::client::ClientReply;
use crate::coordinator::{ClientRecord, Registry};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::model::NamedTensor;
use fedshard_protocol::payload::encode;
use fedshard_protocol::payload::{RejectionKind, UpdateEnvelope};
use fedshard_protocol::shard_plan::{Participant, ShardPlan, ShardingPolicy};
use fedshard_protocol::shard_plan::{Sharding, plan_shards};
use fedshard_protocol::task::{ClientId, Recipe, TrainTask};
use fedshard_protocol::task::{Evaluation, TrainOutput};
use fedshard_strategies::aggregation::AggregatorName;
use fedshard_strategies::aggregation::{Aggregator, Fit, FitRound};
use fedshard_strategies::sampling::SamplerName;
use fedshard_strategies::selection::SelectorName;
use fedshard_strategies::sharding::plan::{Base, StrategySpec};
use fedshard_strategies::svd::recompose;
use std::collections::BTreeMap;

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
        proximal_mu: 0.0,
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
        Some(&Sharding::Spectral(policy())),
        Some(&plan),
        &participants,
        (7, 3),
        &recipe(),
    )
    .unwrap();
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
        control: None,
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

pub(crate) fn accepted(tasks: &Tasks, edit: impl Fn(ClientId, &mut TrainOutput)) -> Vec<Accepted> {
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
    assert_eq!(tasks.downlink_bits(), bits);
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
    )
    .unwrap();
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
    // Updates are what a plain phase takes; in phase one of a two-phase round a norm.
    let updates = classify(1..=1, outcomes.clone(), Expect::Updates);
    assert_eq!(updates.envelopes, BTreeMap::from([(1, update)]));
    let c = classify(1..=7, outcomes, Expect::Norms);
    assert!(
        c.envelopes.is_empty(),
        "an upload before the second phase is out of protocol"
    );
    assert_eq!(c.norms, BTreeMap::from([(2, 0.5)]));
    let kinds: Vec<(ClientId, FailureKind)> =
        c.failures.iter().map(|(id, f)| (*id, f.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (1, FailureKind::Unreachable),
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
    build_tasks(&global(), None, None, &participants, (7, 3), &recipe()).unwrap()
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
    let mut tally = Tally {
        participants: tasks.tasks.len(),
        ..Tally::default()
    };
    tally.hand_out(&tasks);
    tally.answers(&Classified {
        envelopes: envelopes.clone(),
        norms: BTreeMap::new(),
        failures,
        ..Classified::default()
    });
    tally.rejected(&validated);
    let accepted: Vec<&Accepted> = validated.accepted.iter().collect();
    // One accepted client is byzantine; client 99 is too, but sent nothing this round.
    let byzantine = std::collections::BTreeSet::from([accepted[0].client, 99]);
    let r = record(RoundSummary {
        round: 3,
        tally: &tally,
        accepted: &accepted,
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
        late: 0,
        staleness: vec![],
        phases: Default::default(),
        privacy: None,
        secure: None,
        byzantine: &byzantine,
    });
    assert_eq!(r.byzantine, 1);
    let uplink: u64 = envelopes.values().map(|e| e.payload.bits).sum();
    assert_eq!(r.uplink_bits, uplink);
    assert_eq!(r.client_uplink_bits.values().sum::<u64>(), uplink);
    assert_eq!(
        r.client_uplink_bits.keys().collect::<Vec<_>>(),
        envelopes.keys().collect::<Vec<_>>()
    );
    assert_eq!(r.downlink_bits, tasks.downlink_bits());
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
