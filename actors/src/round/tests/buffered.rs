//! FedBuff's buffered fold through the aggregator, against the synchronous round and
//! hand-computed changes.

use super::{accepted, context, dense_tasks, fedavg, global, planned, registry};
use crate::round::{Accepted, Buffered, Folded, Tasks, fold, fold_buffered};
use crate::schedule::Staleness;
use std::collections::BTreeMap;

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
        (fedavg().as_ref(), &[]),
        &reg,
        (Staleness::Constant, 4),
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
        (fedavg().as_ref(), &[]),
        &reg,
        (Staleness::Polynomial { a: 1.0 }, 2),
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
        (fedavg().as_ref(), &[]),
        &registry(&[(1, 1), (2, 1)]),
        (Staleness::Constant, 1),
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
        (fedavg().as_ref(), &[]),
        &registry(&[(1, 1), (2, 1)]),
        (Staleness::Constant, 0),
    )
    .unwrap();
    assert_eq!(folded, Folded::NonFinite);
    assert_eq!(model.to_bytes(), before.to_bytes());
}
