//! SCAFFOLD's local side against Algorithm 1 of its paper (option II), with full batches and
//! plain SGD so that each step is `y ← y − η (∇F(y) + c − c_i)` exactly: the first corrected
//! iterate is plain SGD's moved by `−η (c − c_i)`, and after `K` steps the new variate
//! `c_i⁺ = c_i + Δc_i` is the mean of the full gradients at the `K` corrected iterates, each
//! read off a plain one-step run from that iterate. In a cohort each client is corrected by its
//! own variates.

use crate::models::net::Architecture;
use crate::train::cohort::{Member, Trained, train};
use crate::train::neural::{CpuTraining, single_client_task};
use crate::train::proximal::tests::{arch, random, recipe};
use fedshard_protocol::model::{ModelState, NamedTensor};
use fedshard_protocol::task::{Recipe, Variates};

/// `state` with every value replaced by `f(position)`.
fn filled(state: &ModelState, f: impl Fn(usize) -> f32) -> ModelState {
    let tensors = state
        .tensors
        .iter()
        .map(|t| {
            let data = (0..t.data.len()).map(&f).collect();
            NamedTensor::new(t.name.clone(), t.shape.clone(), data).expect("same shape")
        })
        .collect();
    ModelState::new(tensors).expect("valid")
}

fn run(
    sent: &ModelState,
    data: &crate::data::Dataset,
    recipe: &Recipe,
    variates: Option<&Variates>,
) -> Trained {
    let member = Member {
        dense: sent,
        shards: &[],
        width: None,
        examples: data,
        seed: 1,
        round: 1,
        client: 0,
        variates,
    };
    train::<CpuTraining, Architecture>(&arch(), recipe, &[member], &Default::default())
        .pop()
        .expect("one result")
        .expect("trains")
}

fn flat(s: &ModelState) -> Vec<f32> {
    s.tensors.iter().flat_map(|t| t.data.clone()).collect()
}

/// The full-batch gradient at `at`: `(at − y)/η` of one plain step.
fn gradient(at: &ModelState, data: &crate::data::Dataset, full: &Recipe) -> Vec<f64> {
    let y = run(at, data, full, None).dense;
    let lr = full.learning_rate;
    flat(at)
        .iter()
        .zip(flat(&y))
        .map(|(&a, b)| (f64::from(a) - f64::from(b)) / lr)
        .collect()
}

#[test]
fn corrected_steps_and_the_new_variate_follow_algorithm_one() {
    let (state, shardable) = arch().initial_state(5).expect("builds");
    let (x, _) = single_client_task(&state, &shardable, 1.0, 9).expect("plans");
    let data = random(16, 6, 3, 2);
    let variates = Variates {
        server: filled(&x, |i| 0.3 * (i as f32 * 0.7).sin()),
        client: Some(filled(&x, |i| 0.2 * (i as f32 * 1.3).cos())),
    };
    let own = variates.client.as_ref().expect("set");
    let one = recipe(1, 0.0, 16);
    let lr = one.learning_rate as f32;
    // Line 10: the first corrected step is plain SGD's moved by −η (c − c_i).
    let plain = flat(&run(&x, &data, &one, None).dense);
    let corrected = run(&x, &data, &one, Some(&variates));
    let (c, ci) = (flat(&variates.server), flat(own));
    for (i, (&p, &y)) in plain.iter().zip(&flat(&corrected.dense)).enumerate() {
        let expected = p - lr * (c[i] - ci[i]);
        assert!((y - expected).abs() <= 1e-6, "value {i}: {y} vs {expected}");
    }
    // Lines 12–13 after K = 2 steps: c_i + Δc_i is the mean full gradient at x and at the
    // first corrected iterate.
    let two = run(&x, &data, &recipe(2, 0.0, 16), Some(&variates));
    let change = flat(two.control.as_ref().expect("a Δc_i"));
    let (g0, g1) = (
        gradient(&x, &data, &one),
        gradient(&corrected.dense, &data, &one),
    );
    for i in 0..change.len() {
        let next = f64::from(ci[i] + change[i]);
        let mean = 0.5 * (g0[i] + g1[i]);
        assert!(
            (next - mean).abs() <= 2e-4 * (1.0 + mean.abs()),
            "value {i}: {next} vs {mean}"
        );
    }
    // A first participation (c_i = 0) is corrected by c alone.
    let first = Variates {
        client: None,
        ..variates.clone()
    };
    let zero = Variates {
        client: Some(filled(&x, |_| 0.0)),
        ..variates.clone()
    };
    assert_eq!(
        run(&x, &data, &one, Some(&first)),
        run(&x, &data, &one, Some(&zero))
    );
}

/// Two clients of different sizes and variates (one leaves the cohort first, so the model and
/// the correction are rebuilt) train to the bytes, and the Δc_i, each gets alone.
#[test]
fn a_scaffold_cohort_trains_each_client_as_alone() {
    let (state, shardable) = arch().initial_state(5).expect("builds");
    let (x, _) = single_client_task(&state, &shardable, 1.0, 9).expect("plans");
    let data = [random(12, 6, 3, 3), random(28, 6, 3, 4)];
    let variates: Vec<Variates> = (0..2)
        .map(|c| Variates {
            server: filled(&x, |i| 0.1 * (i as f32).sin()),
            client: Some(filled(&x, move |i| 0.05 * (i as f32 + c as f32).cos())),
        })
        .collect();
    let members: Vec<Member<'_>> = data
        .iter()
        .zip(&variates)
        .enumerate()
        .map(|(c, (d, v))| Member {
            dense: &x,
            shards: &[],
            width: None,
            examples: d,
            seed: 1,
            round: 1,
            client: c as u64,
            variates: Some(v),
        })
        .collect();
    let recipe = recipe(2, 0.0, 8);
    let device = Default::default();
    let together = train::<CpuTraining, _>(&arch(), &recipe, &members, &device);
    for (m, cohort) in members.iter().zip(together) {
        let alone = train::<CpuTraining, _>(&arch(), &recipe, std::slice::from_ref(m), &device)
            .pop()
            .expect("one");
        let (cohort, alone) = (cohort.expect("trains"), alone.expect("trains"));
        assert!(cohort.control.is_some());
        assert_eq!(cohort, alone);
    }
}
