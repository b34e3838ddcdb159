//! A cohort's clients end with the bytes they get trained one by one, for every shipped model,
//! with clients of different sample counts (ragged last batches, clients leaving early) and,
//! where the model is small enough to plan here, real Unbiased/CPS shards.

use super::*;
use crate::models::char_transformer::CharShape;
use crate::models::net::Architecture;
use crate::train::neural::{CharWindows, CpuTraining, round_tasks, single_client_task};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use proptest::prelude::*;

type B = CpuTraining;

/// `len` random rows of `width` features in [−1, 1] with labels in 0..classes.
struct Random {
    x: Vec<f32>,
    y: Vec<i64>,
    width: usize,
}

impl Random {
    fn new(len: usize, width: usize, classes: usize, seed: u64) -> Self {
        let mut rng = stream(seed, 0, 0, Purpose::Data);
        Self {
            x: (0..len * width)
                .map(|_| (2.0 * uniform(&mut rng) - 1.0) as f32)
                .collect(),
            y: (0..len)
                .map(|_| (uniform(&mut rng) * classes as f64) as i64 % classes as i64)
                .collect(),
            width,
        }
    }
}

impl Examples for Random {
    fn len(&self) -> usize {
        self.y.len()
    }
    fn width(&self) -> usize {
        self.width
    }
    fn targets_per_row(&self) -> usize {
        1
    }
    fn fill(&self, samples: &[usize], x: &mut Vec<f32>, y: &mut Vec<i64>) {
        for &i in samples {
            x.extend_from_slice(&self.x[i * self.width..(i + 1) * self.width]);
            y.push(self.y[i]);
        }
    }
}

fn recipe(batch_size: usize, epochs: usize, sharded: bool) -> Recipe {
    Recipe {
        learning_rate: 0.05,
        epochs,
        batch_size,
        momentum: 0.5,
        weight_decay: 1e-4,
        clip_lr: sharded.then_some(10.0),
        proximal_mu: 0.0,
    }
}

/// The tasks of `clients` clients: dense, or each with its own Unbiased/CPS shards at
/// `keep_ratio` (one shape, different terms and ω).
fn tasks(
    arch: &Architecture,
    clients: usize,
    keep_ratio: f64,
) -> Vec<(ModelState, Vec<LayerShard>)> {
    let (state, shardable) = arch.initial_state(7).expect("builds");
    (0..clients)
        .map(|c| single_client_task(&state, &shardable, keep_ratio, 11 + c as u64).expect("plans"))
        .collect()
}

/// Client `c` of the cohort: `tasks[c]` on `examples[c]`, its batch order from stream
/// `(3, 2, c)`.
fn members<'a>(
    tasks: &'a [(ModelState, Vec<LayerShard>)],
    examples: &[&'a dyn Examples],
) -> Vec<Member<'a>> {
    tasks
        .iter()
        .zip(examples)
        .enumerate()
        .map(|(c, ((dense, shards), examples))| Member {
            dense,
            shards,
            width: None,
            examples: *examples,
            seed: 3,
            round: 2,
            client: c as u64,
            variates: None,
        })
        .collect()
}

/// Trains the clients alone and as one cohort and asserts that every client trains, to the
/// same bytes and losses both ways.
fn same_alone_and_together(
    arch: &Architecture,
    tasks: &[(ModelState, Vec<LayerShard>)],
    examples: &[&dyn Examples],
    recipe: &Recipe,
) {
    let diverged = same_alone_and_together_or_same_divergence(arch, tasks, examples, recipe);
    assert_eq!(diverged, 0, "clients diverged");
}

/// Trains the clients alone and as one cohort and asserts, client by client, the same bytes
/// and losses or the same divergence (`Diverged` with the same loss bits both ways); returns
/// how many diverged.
fn same_alone_and_together_or_same_divergence(
    arch: &Architecture,
    tasks: &[(ModelState, Vec<LayerShard>)],
    examples: &[&dyn Examples],
    recipe: &Recipe,
) -> usize {
    let members = members(tasks, examples);
    let mut diverged = 0;
    let device = Default::default();
    let together = train::<B, _>(arch, recipe, &members, &device);
    for (c, (member, cohort)) in members.iter().zip(together).enumerate() {
        let alone = train::<B, _>(arch, recipe, std::slice::from_ref(member), &device)
            .pop()
            .expect("one result");
        let (cohort, alone) = match (cohort, alone) {
            (Ok(cohort), Ok(alone)) => (cohort, alone),
            (
                Err(TrainError::Diverged {
                    mean_loss: together,
                }),
                Err(TrainError::Diverged { mean_loss: alone }),
            ) => {
                assert_eq!(together.to_bits(), alone.to_bits(), "client {c}: diverged");
                diverged += 1;
                continue;
            }
            (cohort, alone) => panic!("client {c}: {cohort:?} in the cohort, {alone:?} alone"),
        };
        assert_eq!(
            cohort.loss.to_bits(),
            alone.loss.to_bits(),
            "client {c}: loss"
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (a, b) in cohort.dense.tensors.iter().zip(&alone.dense.tensors) {
            assert_eq!(bits(&a.data), bits(&b.data), "client {c}: {}", a.name);
        }
        for (a, b) in cohort.shards.iter().zip(&alone.shards) {
            assert_eq!(bits(&a.left), bits(&b.left), "client {c}: {} U", a.name);
            assert_eq!(bits(&a.right), bits(&b.right), "client {c}: {} V", a.name);
        }
        assert_ne!(alone.dense, *member.dense, "client {c} trained");
    }
    diverged
}

/// Three clients of 7, 5 and 10 samples at batch 4: last batches of 3, 1 and 2 rows, and the
/// 10-sample client trains a third step per epoch after the others leave.
fn classifiers(arch: Architecture, keep_ratio: f64, width: usize) {
    let data: Vec<Random> = [7, 5, 10]
        .iter()
        .enumerate()
        .map(|(c, &len)| Random::new(len, width, 10, c as u64))
        .collect();
    let examples: Vec<&dyn Examples> = data.iter().map(|d| d as &dyn Examples).collect();
    let tasks = tasks(&arch, 3, keep_ratio);
    same_alone_and_together(&arch, &tasks, &examples, &recipe(4, 2, keep_ratio < 1.0));
}

#[test]
fn mlp_cohort_is_bit_exact() {
    classifiers(Architecture::digits_mlp(), 1.0, 64);
    let deeper = Architecture::Mlp {
        inputs: 64,
        hidden: vec![32, 32],
        classes: 10,
    };
    classifiers(deeper, 0.5, 64);
}

#[test]
fn digits_cnn_cohort_is_bit_exact() {
    classifiers(Architecture::DigitsCnn { classes: 10 }, 1.0, 64);
    classifiers(Architecture::DigitsCnn { classes: 10 }, 0.4, 64);
}

#[test]
fn mnist_cnn_cohort_is_bit_exact() {
    classifiers(Architecture::MnistCnn { classes: 10 }, 0.5, 28 * 28);
}

#[test]
fn char_transformer_cohort_is_bit_exact() {
    let arch = Architecture::CharTransformer(CharShape::default());
    let texts: Vec<CharWindows> = [86, 83, 88]
        .iter()
        .enumerate()
        .map(|(c, &len)| {
            let mut rng = stream(c as u64, 0, 0, Purpose::Data);
            let text = (0..len).map(|_| (uniform(&mut rng) * 60.0) as u8).collect();
            CharWindows::all(text, 80)
        })
        .collect();
    let examples: Vec<&dyn Examples> = texts.iter().map(|t| t as &dyn Examples).collect();
    let tasks = tasks(&arch, 3, 0.5);
    same_alone_and_together(&arch, &tasks, &examples, &recipe(3, 1, true));
}

/// The CIFAR models, dense (planning their shards takes the SVD of 11 M weights): two steps of
/// batch 2 for clients of 3 and 2 samples.
fn cifar(arch: Architecture) {
    let data: Vec<Random> = [3, 2]
        .iter()
        .enumerate()
        .map(|(c, &len)| Random::new(len, 3 * 32 * 32, 10, c as u64))
        .collect();
    let examples: Vec<&dyn Examples> = data.iter().map(|d| d as &dyn Examples).collect();
    let tasks = tasks(&arch, 2, 1.0);
    same_alone_and_together(&arch, &tasks, &examples, &recipe(2, 1, false));
}

#[test]
fn resnet18_cohort_is_bit_exact() {
    cifar(Architecture::Resnet18 { classes: 10 });
}

#[test]
fn cct_cohort_is_bit_exact() {
    cifar(Architecture::Cct { classes: 10 });
}

#[test]
fn tasks_of_different_shapes_train_one_by_one() {
    let arch = Architecture::DigitsCnn { classes: 10 };
    let (state, shardable) = arch.initial_state(7).expect("builds");
    let dense = (state.clone(), vec![]);
    let sharded = single_client_task(&state, &shardable, 0.4, 11).expect("plans");
    let tasks = [dense, sharded];
    let (a, b) = (Random::new(6, 64, 10, 1), Random::new(5, 64, 10, 2));
    let examples: [&dyn Examples; 2] = [&a, &b];
    let err = arch
        .load_cohort::<B>(
            &[
                (&tasks[0].0, &tasks[0].1, None),
                (&tasks[1].0, &tasks[1].1, None),
            ],
            &Default::default(),
        )
        .expect_err("one shape per cohort");
    assert!(matches!(err, NetError::Cohort { .. }), "{err}");
    same_alone_and_together(&arch, &tasks, &examples, &recipe(4, 1, true));
}

/// A round's tasks from one plan (`fedshard bench round --keep-ratio`): one sub-model shape,
/// so one cohort, each client with its own terms, and client 0's task the single client's.
#[test]
fn a_rounds_sharded_tasks_share_a_shape_and_sample_their_own_terms() {
    let arch = Architecture::DigitsCnn { classes: 10 };
    let (state, shardable) = arch.initial_state(7).expect("builds");
    let (dense, shards) = round_tasks(&state, &shardable, 0.4, 3, 11).expect("plans");
    assert_eq!(
        (dense.clone(), shards[0].clone()),
        single_client_task(&state, &shardable, 0.4, 11).expect("plans")
    );
    let shape = |shards: &[LayerShard]| -> Vec<(usize, usize)> {
        shards
            .iter()
            .map(|s| (s.left.len(), s.right.len()))
            .collect()
    };
    assert!(!shards[0].is_empty());
    assert!(shards.iter().all(|s| shape(s) == shape(&shards[0])));
    assert_ne!(shards[1], shards[2], "each client samples its own terms");
    let tasks: Vec<Task<'_>> = shards
        .iter()
        .map(|s| (&dense, s.as_slice(), None))
        .collect();
    arch.load_cohort::<B>(&tasks, &Default::default())
        .expect("one cohort");
}

#[test]
fn a_client_without_samples_fails_alone() {
    let arch = Architecture::digits_mlp();
    let tasks = tasks(&arch, 2, 1.0);
    let (empty, some) = (Random::new(0, 64, 10, 1), Random::new(5, 64, 10, 2));
    let members = [
        Member {
            dense: &tasks[0].0,
            shards: &tasks[0].1,
            width: None,
            examples: &empty,
            seed: 1,
            round: 1,
            client: 0,
            variates: None,
        },
        Member {
            dense: &tasks[1].0,
            shards: &tasks[1].1,
            width: None,
            examples: &some,
            seed: 1,
            round: 1,
            client: 1,
            variates: None,
        },
    ];
    let results = train::<B, _>(&arch, &recipe(4, 1, false), &members, &Default::default());
    assert!(matches!(results[0], Err(TrainError::NoSamples)));
    assert!(results[1].is_ok());
}

/// A client that diverges fails with `Diverged` in its cohort as it does alone, and the
/// clients beside it train: three sharded MLPs at batch 1, the third with 11 samples. Its
/// Unbiased shards' rare terms carry ω = 1/π, which scales their effective learning rate even
/// under ClipLR (dense, the same client trains to a loss of 1.43); found by the property test
/// below.
#[test]
fn a_diverging_client_fails_alone_in_its_cohort() {
    let arch = Architecture::Mlp {
        inputs: 16,
        hidden: vec![12, 8],
        classes: 4,
    };
    let data: Vec<Random> = [1, 1, 11]
        .iter()
        .enumerate()
        .map(|(c, &len)| Random::new(len, 16, 4, c as u64))
        .collect();
    let examples: Vec<&dyn Examples> = data.iter().map(|d| d as &dyn Examples).collect();
    let tasks = tasks(&arch, 3, 0.5);
    let recipe = recipe(1, 2, true);
    let results = train::<B, _>(
        &arch,
        &recipe,
        &members(&tasks, &examples),
        &Default::default(),
    );
    assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
    assert!(
        matches!(results[2], Err(TrainError::Diverged { mean_loss }) if mean_loss.is_nan()),
        "{:?}",
        results[2]
    );
    let diverged = same_alone_and_together_or_same_divergence(&arch, &tasks, &examples, &recipe);
    assert_eq!(diverged, 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Any sample counts, batch size and epochs: a cohort trains each client as it trains alone.
    #[test]
    fn any_cohort_of_mlps_is_bit_exact(
        sizes in proptest::collection::vec(1usize..12, 1..5),
        batch in 1usize..6,
        epochs in 1usize..3,
    ) {
        let arch = Architecture::Mlp { inputs: 16, hidden: vec![12, 8], classes: 4 };
        let data: Vec<Random> = sizes
            .iter()
            .enumerate()
            .map(|(c, &len)| Random::new(len, 16, 4, c as u64))
            .collect();
        let examples: Vec<&dyn Examples> = data.iter().map(|d| d as &dyn Examples).collect();
        let tasks = tasks(&arch, sizes.len(), 0.5);
        // A sharded toy at batch 1 may diverge (see the test above); it must do so both ways.
        same_alone_and_together_or_same_divergence(&arch, &tasks, &examples, &recipe(batch, epochs, true));
    }
}

/// On CUDA a cohort's clients train as they do alone, measured against the CPU's f32 training
/// of the client alone: a client of the cohort may be no farther from it than three times the
/// client trained alone on CUDA. Why this reference: CUDA's products round their operands to
/// TF32, the cohort's batched products and the alone client's implicit-GEMM convolutions round
/// differently, and ResNet-18 amplifies rounding (on the CPU in f32, the batched kernels and the
/// one-client ones, each exact to 2e-5 an operation, leave ResNet-18's updates 2e-5–4e-4 apart
/// after one step and up to 3e-3 after two, the digits CNN and CCT 1e-6): a distance between
/// the cohort and the client alone on CUDA says nothing by itself, 3.5e-2 measured on an H200
/// against 2e-3 between two trainings alone. A lost or misplaced gradient moves a client by
/// order one. Equal sample counts and unequal ones (padded to equal rows).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda -p fedshard-training cuda_cohorts -- --ignored"]
fn cuda_cohorts_stay_as_near_the_cpus_training_as_a_client_alone() {
    use burn::backend::{Autodiff, Cuda, NdArray};
    type G = Autodiff<Cuda>;
    type Cpu = Autodiff<NdArray>;
    let device = Default::default();
    // ‖a − b‖ / ‖b − start‖ over every dense tensor.
    let distance = |a: &Trained, b: &Trained, start: &ModelState| {
        let (mut diff, mut norm) = (0.0f64, 0.0f64);
        for ((a, b), s) in a
            .dense
            .tensors
            .iter()
            .zip(&b.dense.tensors)
            .zip(&start.tensors)
        {
            for ((x, y), s) in a.data.iter().zip(&b.data).zip(&s.data) {
                diff += f64::from(x - y).powi(2);
                norm += f64::from(y - s).powi(2);
            }
        }
        (diff / norm).sqrt()
    };
    for (arch, width) in [
        (Architecture::DigitsCnn { classes: 10 }, 64),
        (Architecture::Resnet18 { classes: 10 }, 3 * 32 * 32),
        (Architecture::Cct { classes: 10 }, 3 * 32 * 32),
    ] {
        for sizes in [[8usize, 8, 8], [8, 5, 7]] {
            let data: Vec<Random> = sizes
                .iter()
                .enumerate()
                .map(|(c, &len)| Random::new(len, width, 10, c as u64))
                .collect();
            let tasks = tasks(&arch, 3, 1.0);
            let members: Vec<Member<'_>> = tasks
                .iter()
                .zip(&data)
                .enumerate()
                .map(|(c, ((dense, shards), examples))| Member {
                    dense,
                    shards,
                    width: None,
                    examples,
                    seed: 3,
                    round: 2,
                    client: c as u64,
                    variates: None,
                })
                .collect();
            let recipe = recipe(4, 1, false);
            let together = train::<G, _>(&arch, &recipe, &members, &device);
            for (c, (member, cohort)) in members.iter().zip(together).enumerate() {
                let member = std::slice::from_ref(member);
                let only = |mut results: Vec<Result<Trained, TrainError>>| {
                    results.pop().expect("one result").expect("trains alone")
                };
                let cpu = only(train::<Cpu, _>(&arch, &recipe, member, &Default::default()));
                let alone = only(train::<G, _>(&arch, &recipe, member, &device));
                let cohort = cohort.expect("trains in the cohort");
                let start = member[0].dense;
                let (apart, alone) = (
                    distance(&cohort, &cpu, start),
                    distance(&alone, &cpu, start),
                );
                eprintln!(
                    "{arch:?} sizes {sizes:?} client {c}: from the CPU's, cohort {apart:.2e}, alone {alone:.2e}"
                );
                assert!(
                    apart <= 3.0 * alone.max(1e-3),
                    "{arch:?} client {c}: the cohort {apart} from the CPU's, alone {alone}"
                );
            }
        }
    }
}
