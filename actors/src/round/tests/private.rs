//! The private fold: every client's weight-space change is inside the clip ball, sharded layers
//! included; the noise on the model has the scale `z·C/m̄`; the same seed gives the same model.

use super::*;
use crate::error::Result;
use crate::privacy::{Clipping, PrivacyRecord, PrivacySettings};
use fedshard_strategies::aggregation::UniformWeights;
use fedshard_strategies::privacy::{Epsilon, Sampling};
use proptest::prelude::*;

fn settings(norm: f64, z: f64, expected: f64) -> PrivacySettings {
    PrivacySettings {
        noise_multiplier: z,
        clipping: Clipping::Fixed { norm },
        delta: 1e-5,
        sampling: Sampling::Poisson { rate: 0.5 },
        expected_updates: expected,
        target_epsilon: None,
        domain: None,
    }
}

fn private(settings: &PrivacySettings, release: u64) -> Release<'_> {
    let clip_norm = match settings.clipping {
        Clipping::Fixed { norm } => norm,
        Clipping::Adaptive { initial, .. } => initial,
    };
    Release {
        settings,
        clip_norm,
        seed: 11,
        release,
        epsilon: Epsilon {
            epsilon: 1.0,
            order: 2.0,
        },
        min_successful: 1,
    }
}

fn updates<'a>(
    tasks: &'a Tasks,
    accepted: &'a [Accepted],
) -> Vec<(&'a Accepted, &'a TrainTask, f64)> {
    accepted
        .iter()
        .map(|a| (a, &tasks.tasks[&a.client], 1.0))
        .collect()
}

/// A private release of `updates` through the seam: [`Private`] over uniform weights, folded
/// as weight-space changes, with what it spent.
fn fold_private(
    model: &mut ModelState,
    updates: &[(&Accepted, &TrainTask, f64)],
    release: Release<'_>,
) -> Result<(Folded, PrivacyRecord)> {
    let clients: Vec<(ClientId, u64)> = updates.iter().map(|(a, _, _)| (a.client, 1)).collect();
    let private = Private::new(&UniformWeights, release);
    let folded = fold_changes(model, updates, (&private, &[]), &registry(&clients))?;
    Ok((folded, private.spent()))
}

/// `update`'s change against `global`, clipped to `clip_norm`.
fn clipped(
    global: &ModelState,
    (accepted, task, scale): (&Accepted, &TrainTask, f64),
    clip_norm: f64,
) -> (Vec<Vec<f64>>, bool) {
    let lens: Vec<usize> = global.tensors.iter().map(|t| t.data.len()).collect();
    let change = Change {
        global,
        accepted,
        task,
        groups: &[],
    };
    clipped_change(&change, &lens, clip_norm, scale).unwrap()
}

fn norm(change: &[Vec<f64>]) -> f64 {
    change.iter().flatten().map(|c| c * c).sum::<f64>().sqrt()
}

proptest! {
    /// Whatever a client does to its dense tensor and to the factor columns of the sharded
    /// layer it held, the change it makes to the model's weights, clipped, has norm at most C;
    /// a change already inside the ball is left as it is.
    #[test]
    fn a_clipped_change_is_inside_the_ball_for_dense_and_sharded_layers(
        dense in proptest::collection::vec(-5.0f32..5.0, 2),
        factors in proptest::collection::vec(-5.0f32..5.0, 10),
        clip in 0.01f64..3.0,
    ) {
        let (_, tasks) = planned();
        let accepted = accepted(&tasks, |_, out| {
            for (x, d) in out.dense.tensors[0].data.iter_mut().zip(&dense) {
                *x += d;
            }
            let s = &mut out.shards[0];
            for (x, d) in s.left.iter_mut().chain(s.right.iter_mut()).zip(&factors) {
                *x += d;
            }
        });
        for update in updates(&tasks, &accepted) {
            let (raw, _) = clipped(&global(), update, f64::INFINITY);
            let (clipped, was_clipped) = clipped(&global(), update, clip);
            let n = norm(&clipped);
            prop_assert!(n <= clip * (1.0 + 1e-12), "norm {} above C = {}", n, clip);
            prop_assert_eq!(was_clipped, norm(&raw) > clip);
            if !was_clipped {
                prop_assert_eq!(clipped, raw);
            }
        }
    }
}

/// A sharded client's change is measured in weight space: shifting every factor value of its
/// one term by 1 moves `w` by `(u+1)(v+1)ᵀ − uvᵀ`, which is what the clip sees.
#[test]
fn the_clip_sees_the_sharded_layers_weight_change_not_its_factors() {
    let (_, tasks) = planned();
    let accepted = accepted(&tasks, |_, out| shift_factors(out, 1.0));
    let update = updates(&tasks, &accepted)[0];
    let task = update.1;
    let (change, _) = clipped(&global(), update, f64::INFINITY);
    let shard = &task.shards[0];
    let (u, v) = (&shard.left, &shard.right);
    let mut want = 0.0;
    for &ur in &u[..2] {
        for &vc in &v[..3] {
            let d = f64::from(ur + 1.0) * f64::from(vc + 1.0) - f64::from(ur * vc);
            want += d * d;
        }
    }
    assert!((norm(&change) - want.sqrt()).abs() < 1e-5, "{change:?}");
}

/// With clients that changed nothing, the model moves by the noise alone: each coordinate by
/// `N(0, (z·C/m̄)²)`. Over 2000 releases × 8 coordinates the sample std is within 3% of
/// z·C/m̄ = 1.5 · 0.4 / 2 = 0.3 (standard error ≈ 0.8%), and the same seed and release give
/// the same model bit for bit while another release gives another.
#[test]
fn the_noise_has_the_scale_z_c_over_m_and_comes_from_the_seed() {
    let (_, tasks) = planned();
    let accepted = accepted(&tasks, |_, _| {});
    let updates = updates(&tasks, &accepted);
    let settings = settings(0.4, 1.5, 2.0);
    let mut deltas = Vec::new();
    for release in 1..=2000 {
        let mut model = global();
        let (folded, spent) =
            fold_private(&mut model, &updates, private(&settings, release)).unwrap();
        assert_eq!(folded, Folded::Updated);
        assert_eq!((spent.clipped, spent.clip_norm), (0, 0.4));
        for (new, old) in model.tensors.iter().zip(&global().tensors) {
            for (a, b) in new.data.iter().zip(&old.data) {
                deltas.push(f64::from(*a) - f64::from(*b));
            }
        }
    }
    let n = deltas.len() as f64;
    let std = (deltas.iter().map(|d| d * d).sum::<f64>() / n).sqrt();
    assert!((std / 0.3 - 1.0).abs() < 0.03, "std {std}");

    let run = |release| {
        let mut model = global();
        fold_private(&mut model, &updates, private(&settings, release)).unwrap();
        model
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

/// A model whose values live in a range (FedPM's mask probabilities) is projected back into it
/// after the noise, which would otherwise push some out.
#[test]
fn a_model_with_a_domain_stays_in_it_under_the_noise() {
    let (_, tasks) = planned();
    let accepted = accepted(&tasks, |_, _| {});
    let updates = updates(&tasks, &accepted);
    let loud = settings(0.4, 50.0, 2.0);
    let outside = |model: &ModelState| {
        model
            .tensors
            .iter()
            .flat_map(|t| &t.data)
            .filter(|v| !(0.0..=1.0).contains(*v))
            .count()
    };
    let mut free = global();
    fold_private(&mut free, &updates, private(&loud, 1)).unwrap();
    // Values that started in [0, 1] and the unbounded release took out of it.
    let left = global()
        .tensors
        .iter()
        .zip(&free.tensors)
        .flat_map(|(before, after)| before.data.iter().zip(&after.data))
        .filter(|(b, a)| (0.0..=1.0).contains(*b) && !(0.0..=1.0).contains(*a))
        .count();
    assert!(
        left > 0,
        "the unbounded release kept every in-range value in [0, 1]"
    );
    let bounded = PrivacySettings {
        domain: Some((0.0, 1.0)),
        ..loud
    };
    let mut model = global();
    let (folded, _) = fold_private(&mut model, &updates, private(&bounded, 1)).unwrap();
    assert_eq!(folded, Folded::Updated);
    assert_eq!(outside(&model), 0);
    // Only the out-of-range values moved: the projection of the unbounded release.
    for (p, f) in model.tensors.iter().zip(&free.tensors) {
        for (a, b) in p.data.iter().zip(&f.data) {
            assert_eq!(*a, b.clamp(0.0, 1.0));
        }
    }
}

/// Adaptive clipping moves the clip norm: every update is inside a huge initial norm, so the
/// noised unclipped fraction is near 1 > γ = 0.5 and the next norm is smaller; too few updates
/// release nothing.
#[test]
fn adaptive_clipping_shrinks_a_clip_that_clips_nobody_and_too_few_updates_release_nothing() {
    let (_, tasks) = planned();
    let accepted = accepted(&tasks, |_, out| shift_factors(out, 0.1));
    let updates = updates(&tasks, &accepted);
    let adaptive = PrivacySettings {
        clipping: Clipping::Adaptive {
            initial: 100.0,
            rule: fedshard_strategies::privacy::AdaptiveClip {
                quantile: 0.5,
                learning_rate: 0.2,
                count_stddev: 0.1,
            },
        },
        ..settings(100.0, 0.1, 2.0)
    };
    let mut model = global();
    let (_, spent) = fold_private(&mut model, &updates, private(&adaptive, 1)).unwrap();
    assert!(spent.next_clip_norm < 100.0, "{spent:?}");
    assert!(spent.unclipped_fraction.is_some_and(|b| b > 0.5));

    let fixed = settings(1.0, 1.0, 2.0);
    let mut model = global();
    let few = Release {
        min_successful: 3,
        ..private(&fixed, 1)
    };
    let (folded, _) = fold_private(&mut model, &updates, few).unwrap();
    assert!(matches!(folded, Folded::Unchanged(_)));
    assert_eq!(model, global());
}

/// DP-FedAvg wraps an aggregator whose updates count equally (the bound on one client's
/// influence assumes it) and refuses the others, by their own answer; wrapped, it never folds
/// block values (it must clip each update's weight-space change) and refuses a release under
/// an aggregator it cannot wrap even when asked directly.
#[test]
fn privacy_wraps_only_equal_weights_and_folds_changes() {
    use fedshard_strategies::aggregation::{AggregatorName, FedAvg};
    for name in AggregatorName::ALL {
        let Ok(aggregator) = name.build() else {
            continue;
        };
        let wraps = Private::wraps(aggregator.as_ref());
        assert_eq!(wraps.is_ok(), name == AggregatorName::Uniform, "{name}");
    }
    let settings = settings(1.0, 1.0, 2.0);
    let uniform = Private::new(&UniformWeights, private(&settings, 1));
    assert!(!uniform.folds_blocks() && uniform.folds_changes());
    let (_, tasks) = planned();
    let accepted = accepted(&tasks, |_, out| shift_factors(out, 0.1));
    let updates = updates(&tasks, &accepted);
    let clients: Vec<(ClientId, u64)> = updates.iter().map(|(a, _, _)| (a.client, 1)).collect();
    let mut model = global();
    let fedavg = Private::new(&FedAvg, private(&settings, 1));
    assert!(fold_changes(&mut model, &updates, (&fedavg, &[]), &registry(&clients)).is_err());
    assert_eq!(model, global());
    assert_eq!(fedavg.spent().clipped, 0);
}
