//! FedProx's term against its update equation: with full batches and no momentum or decay, the
//! first step is plain SGD's (`w¹ = w⁰ − η ∇F(w⁰)`, the term is zero at `w⁰`) and the second is
//! `w² = w¹ − η (∇F(w¹) + μ (w¹ − w⁰))`, so a proximal run's second iterate is plain SGD's
//! second iterate pulled back by exactly `η μ (w¹ − w⁰)`, for dense tensors and for a spectral
//! shard's factors alike. In a cohort, each client is held to its own sent values.

use crate::data::Dataset;
use crate::models::net::Architecture;
use crate::train::cohort::{Member, Trained, train};
use crate::train::neural::{CpuTraining, single_client_task};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::{LayerShard, Recipe};
use fedshard_strategies::rng::{Purpose, stream, uniform};

pub(crate) fn random(len: usize, dim: usize, classes: usize, seed: u64) -> Dataset {
    let mut rng = stream(seed, 0, 0, Purpose::Data);
    let x = (0..len * dim)
        .map(|_| (2.0 * uniform(&mut rng) - 1.0) as f32)
        .collect();
    let y = (0..len).map(|i| (i % classes) as u32).collect();
    Dataset::new(x, y, dim, classes).expect("valid")
}

pub(crate) fn recipe(epochs: usize, proximal_mu: f64, batch_size: usize) -> Recipe {
    Recipe {
        learning_rate: 0.1,
        epochs,
        batch_size,
        momentum: 0.0,
        weight_decay: 0.0,
        clip_lr: None,
        proximal_mu,
    }
}

fn run(task: &(ModelState, Vec<LayerShard>), data: &Dataset, recipe: &Recipe) -> Trained {
    let arch = arch();
    let member = Member {
        dense: &task.0,
        shards: &task.1,
        width: None,
        examples: data,
        seed: 1,
        round: 1,
        client: 0,
        variates: None,
    };
    train::<CpuTraining, _>(&arch, recipe, &[member], &Default::default())
        .pop()
        .expect("one result")
        .expect("trains")
}

/// Three layers, so the middle one is shardable.
pub(crate) fn arch() -> Architecture {
    Architecture::Mlp {
        inputs: 6,
        hidden: vec![10, 8],
        classes: 3,
    }
}

/// Every trained value, dense tensors then shard factors, in order.
fn values(t: &Trained) -> Vec<f32> {
    let mut out: Vec<f32> = t
        .dense
        .tensors
        .iter()
        .flat_map(|t| t.data.clone())
        .collect();
    for s in &t.shards {
        out.extend(&s.left);
        out.extend(&s.right);
    }
    out
}

fn sent(task: &(ModelState, Vec<LayerShard>)) -> Vec<f32> {
    values(&Trained {
        dense: task.0.clone(),
        shards: task.1.clone(),
        loss: 0.0,
        control: None,
    })
}

#[test]
fn the_second_step_is_pulled_back_by_eta_mu_times_the_first_move() {
    let (state, shardable) = arch().initial_state(5).expect("builds");
    let data = random(16, 6, 3, 2);
    let (lr, mu) = (0.1f32, 0.5);
    for keep_ratio in [1.0, 0.5] {
        let task = single_client_task(&state, &shardable, keep_ratio, 9).expect("plans");
        assert_eq!(task.1.is_empty(), keep_ratio == 1.0);
        let w0 = sent(&task);
        let w1 = values(&run(&task, &data, &recipe(1, 0.0, 16)));
        let w1_prox = values(&run(&task, &data, &recipe(1, mu, 16)));
        assert_eq!(w1, w1_prox, "the term is zero at the sent values");
        let w2 = values(&run(&task, &data, &recipe(2, 0.0, 16)));
        let w2_prox = values(&run(&task, &data, &recipe(2, mu, 16)));
        let mut moved = 0;
        for i in 0..w0.len() {
            let expected = w2[i] - lr * mu as f32 * (w1[i] - w0[i]);
            assert!(
                (w2_prox[i] - expected).abs() <= 1e-5,
                "r = {keep_ratio}, value {i}: {} vs {expected}",
                w2_prox[i]
            );
            moved += usize::from(w1[i] != w0[i]);
        }
        assert!(moved > w0.len() / 2, "the first step moved most values");
    }
}

/// Two clients of different sizes (one leaves the cohort first, so the model is rebuilt) with
/// a proximal term train to the bytes each gets alone.
#[test]
fn a_proximal_cohort_trains_each_client_as_alone() {
    let (state, shardable) = arch().initial_state(5).expect("builds");
    let tasks: Vec<_> = (0..2)
        .map(|c| single_client_task(&state, &shardable, 0.5, 20 + c).expect("plans"))
        .collect();
    let data = [random(12, 6, 3, 3), random(28, 6, 3, 4)];
    let recipe = Recipe {
        momentum: 0.5,
        weight_decay: 1e-4,
        ..recipe(2, 0.3, 8)
    };
    let members: Vec<Member<'_>> = tasks
        .iter()
        .zip(&data)
        .enumerate()
        .map(|(c, (t, d))| Member {
            dense: &t.0,
            shards: &t.1,
            width: None,
            examples: d,
            seed: 1,
            round: 1,
            client: c as u64,
            variates: None,
        })
        .collect();
    let device = Default::default();
    let together = train::<CpuTraining, _>(&arch(), &recipe, &members, &device);
    for (m, cohort) in members.iter().zip(together) {
        let alone = train::<CpuTraining, _>(&arch(), &recipe, std::slice::from_ref(m), &device)
            .pop()
            .expect("one");
        assert_eq!(cohort.expect("trains"), alone.expect("trains"));
    }
}
