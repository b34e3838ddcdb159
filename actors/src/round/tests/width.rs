//! A width-sliced round, end to end through plain functions: the plan cuts each task, the
//! clients' hand-made updates fold value by value over the clients whose slice kept them.

use super::*;
use crate::round::Tasks;
use crate::round::{Buffered, fold_buffered};
use fedshard_protocol::shard_plan::{ShardPlan, WidthPlan, plan_round};
use fedshard_protocol::width::{Axis, WidthGroup, WidthPolicy};
use fedshard_strategies::sharding::width::WidthStrategy;

/// A 2 → 4 → 1 network: width `h` (4 units) runs along `a.weight`'s rows, `a.bias` and
/// `b.weight`'s columns; `b.bias` is no width's.
fn net() -> (ModelState, Vec<WidthGroup>) {
    let axis = |tensor: &str, axis| Axis {
        tensor: tensor.into(),
        axis,
        block: 1,
    };
    let groups = vec![WidthGroup {
        name: "h".into(),
        units: 4,
        norm_groups: 1,
        axes: vec![axis("a.weight", 0), axis("a.bias", 0), axis("b.weight", 1)],
    }];
    let t = |name: &str, shape: Vec<usize>, data: Vec<f32>| {
        NamedTensor::new(name, shape, data).unwrap()
    };
    let global = ModelState::new(vec![
        t("a.weight", vec![4, 2], vec![0.0; 8]),
        t("a.bias", vec![4], vec![0.0; 4]),
        t("b.weight", vec![1, 4], vec![0.0; 4]),
        t("b.bias", vec![1], vec![0.0]),
    ])
    .unwrap();
    (global, groups)
}

/// [`two_nested_clients`], folded by FedAvg, by hand: units 0 and 1 are held by
/// both, (1·1 + 3·2)/4 = 1.75; unit 2 by client 2 alone, 2; unit 3 by nobody, 0 (untouched);
/// `b.bias` by both, 1.75.
/// HeteroFL's round of client 1 (D = 1) at r = 0.5, units {0, 1}, and client 2 (D = 3) at
/// r = 0.75, units {0, 1, 2}: the global model, its widths, the plan and the accepted updates of
/// clients that each added their id to every value they held.
fn two_nested_clients() -> (ModelState, Vec<WidthGroup>, ShardPlan, Tasks, Vec<Accepted>) {
    let (global, groups) = net();
    let sharding = Sharding::Width(WidthPolicy {
        strategy: WidthStrategy::HeteroFl,
        groups: groups.clone(),
    });
    let participants =
        [(1, 0.5), (2, 0.75)].map(|(client, keep_ratio)| Participant { client, keep_ratio });
    let plan = plan_round(&global, &sharding, &participants, 7, 2).unwrap();
    let round = (7, 2);
    let tasks = build_tasks(
        &global,
        Some(&sharding),
        Some(&plan),
        &participants,
        round,
        &recipe(),
    )
    .unwrap();
    let updates = accepted(&tasks, |id, out| {
        for t in out.dense.tensors.iter_mut() {
            t.data.iter_mut().for_each(|v| *v += id as f32);
        }
    });
    (global, groups, plan, tasks, updates)
}

#[test]
fn every_value_moves_to_the_mean_of_the_clients_that_kept_it() {
    let (global, _, plan, tasks, updates) = two_nested_clients();
    let width: &WidthPlan = plan.width.as_ref().unwrap();
    assert_eq!(width.slices[&1].kept["h"], vec![0, 1]);
    assert_eq!(width.slices[&2].kept["h"], vec![0, 1, 2]);
    assert_eq!(tasks.tasks[&1].dense.get("a.weight").unwrap().shape, [2, 2]);
    assert_eq!(tasks.tasks[&2].dense.get("b.weight").unwrap().shape, [1, 3]);
    let registry = registry(&[(1, 1), (2, 3)]);
    let (probabilities, failures) = (BTreeMap::new(), BTreeMap::new());
    let mut model = global.clone();
    let folded = fold(
        &mut model,
        Some(&plan),
        &updates,
        fedavg().as_ref(),
        context(&registry, &probabilities, &failures, 1),
    )
    .unwrap();
    assert_eq!(folded, Folded::Updated);
    let both = (1.0 + 3.0 * 2.0) / 4.0;
    assert_eq!(
        model.get("a.weight").unwrap().data,
        vec![both, both, both, both, 2.0, 2.0, 0.0, 0.0]
    );
    assert_eq!(
        model.get("a.bias").unwrap().data,
        vec![both, both, 2.0, 0.0]
    );
    assert_eq!(
        model.get("b.weight").unwrap().data,
        vec![both, both, 2.0, 0.0]
    );
    assert_eq!(model.get("b.bias").unwrap().data, vec![both]);
}

/// An update whose sliced tensor holds more values than its slice kept is an error naming the
/// client, and the model is untouched.
#[test]
fn an_update_that_does_not_fit_its_slice_is_refused() {
    let (global, groups) = net();
    let sharding = Sharding::Width(WidthPolicy {
        strategy: WidthStrategy::FedRolex,
        groups,
    });
    let participants = [Participant {
        client: 1,
        keep_ratio: 0.5,
    }];
    let plan = plan_round(&global, &sharding, &participants, 7, 3).unwrap();
    let tasks = build_tasks(
        &global,
        Some(&sharding),
        Some(&plan),
        &participants,
        (7, 3),
        &recipe(),
    )
    .unwrap();
    let mut updates = accepted(&tasks, |_, _| {});
    let t = updates[0].update.dense.get_mut("a.bias").unwrap();
    t.data.push(1.0);
    t.shape = vec![3];
    let registry = registry(&[(1, 1)]);
    let (probabilities, failures) = (BTreeMap::new(), BTreeMap::new());
    let mut model = global.clone();
    let err = fold(
        &mut model,
        Some(&plan),
        &updates,
        fedavg().as_ref(),
        context(&registry, &probabilities, &failures, 1),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("client 1") && err.contains("a.bias"), "{err}");
    assert_eq!(model, global);
}

/// A FedBuff buffer of [`two_nested_clients`]' updates (both of version 0, s ≡ 1) folds as
/// weight-space changes at their slices' coordinates, FedBuff's `W ← W + Σ_c w_c ΔW_c` with
/// `w = (1/4, 3/4)`: a value both kept moves by 1/4 · 1 + 3/4 · 2 = 1.75, one only client 2
/// kept by 3/4 · 2 = 1.5 (the buffer's mean, not its holders': §8.3), one nobody kept stays.
#[test]
fn a_buffer_of_sliced_updates_folds_their_changes_at_their_coordinates() {
    let (global, groups, _, tasks, updates) = two_nested_clients();
    let buffer: Vec<Buffered> = updates
        .into_iter()
        .map(|a| Buffered {
            task: tasks.tasks[&a.client].clone(),
            accepted: a,
            version: 0,
        })
        .collect();
    let registry = registry(&[(1, 1), (2, 3)]);
    let mut model = global.clone();
    let (folded, taus) = fold_buffered(
        &mut model,
        &buffer,
        (fedavg().as_ref(), &groups),
        &registry,
        (crate::schedule::Staleness::Constant, 0),
    )
    .unwrap();
    assert_eq!((folded, taus), (Folded::Updated, vec![0, 0]));
    assert_eq!(
        model.get("a.bias").unwrap().data,
        vec![1.75, 1.75, 1.5, 0.0]
    );
    assert_eq!(
        model.get("b.weight").unwrap().data,
        vec![1.75, 1.75, 1.5, 0.0]
    );
    assert_eq!(model.get("b.bias").unwrap().data, vec![1.75]);
    // Without the widths the sliced values cannot be placed: an error, the model untouched.
    let mut untouched = global.clone();
    let no_widths = fold_buffered(
        &mut untouched,
        &buffer,
        (fedavg().as_ref(), &[]),
        &registry,
        (crate::schedule::Staleness::Constant, 0),
    );
    assert!(no_widths.is_err());
    assert_eq!(untouched, global);
}
