//! The burn side of spectral sharding: factorized layers against their dense products, the
//! gradients of the local recipe against their closed forms, the shard ↔ module conversions,
//! the paper's large models on a tiny batch, and a short digits-CNN federation per strategy.

use burn::module::Param;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::LayerShard;
use fedshard_strategies::rng::{Purpose, stream, uniform};
use fedshard_strategies::svd::factorize;
use fedshard_training::models::kernels::{Cohort, ConvGeometry, conv2d};
use fedshard_training::models::layers::{Affine, Conv, Factors, Weight, param};
use fedshard_training::models::net::Architecture;
use fedshard_training::train::cohort::{self, Member};
use fedshard_training::train::neural::{
    CpuTraining, add_frobenius_decay, clip_lr, single_client_task,
};

type B = CpuTraining;

fn device() -> burn::tensor::Device<B> {
    Default::default()
}

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = stream(seed, 0, 0, Purpose::Data);
    (0..len)
        .map(|_| (2.0 * uniform(&mut rng) - 1.0) as f32)
        .collect()
}

fn values<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().into_vec::<f32>().expect("f32 tensor")
}

fn tensor<const D: usize>(data: &[f32], shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), &device())
}

/// A factorized layer with `n` terms: u `n × rows`, v `n × cols`, ω as given.
fn factors(rows: usize, cols: usize, omega: &[f32], seed: u64) -> Factors<B> {
    let n = omega.len();
    Factors::from_rows(
        random(n * rows, seed),
        random(n * cols, seed + 1),
        omega.to_vec(),
        [1, rows, cols],
        &device(),
    )
    .expect("consistent shapes")
}

/// Ŵ = Σ_j ω_j u_j v_jᵀ in f64, row-major rows × cols.
fn dense_product(u: &[f32], v: &[f32], omega: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let mut w = vec![0.0; rows * cols];
    for (j, &o) in omega.iter().enumerate() {
        for r in 0..rows {
            for c in 0..cols {
                w[r * cols + c] +=
                    f64::from(o) * f64::from(u[j * rows + r]) * f64::from(v[j * cols + c]);
            }
        }
    }
    w
}

fn assert_close(actual: &[f32], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let err = (f64::from(*a) - e).abs();
        assert!(
            err <= tol * (1.0 + e.abs()),
            "{what}[{i}]: {a} vs {e} (error {err:e})"
        );
    }
}

#[test]
fn factorized_linear_forward_is_the_dense_product() {
    let (rows, cols, batch) = (7, 11, 5);
    let omega = [0.5, 2.0, 30.0];
    let f = factors(rows, cols, &omega, 1);
    let (u, v) = (values(f.u.val()), values(f.v.val()));
    let bias = random(rows, 9);
    let layer = Affine {
        weight: Weight::Factorized(f),
        bias: Some(param(bias.clone(), [1, rows], &device())),
        scaler: None,
    };
    let x = random(batch * cols, 3);
    let y = values(layer.forward(tensor(&x, [batch, cols]), &Cohort::single(batch)));
    let w = dense_product(&u, &v, &omega, rows, cols);
    let expected: Vec<f64> = (0..batch)
        .flat_map(|b| {
            let (w, x, bias) = (&w, &x, &bias);
            (0..rows).map(move |r| {
                f64::from(bias[r])
                    + (0..cols)
                        .map(|c| w[r * cols + c] * f64::from(x[b * cols + c]))
                        .sum::<f64>()
            })
        })
        .collect();
    assert_close(&y, &expected, 1e-5, "y");
}

#[test]
fn only_the_factors_and_the_bias_get_gradients() {
    let (rows, cols) = (4, 6);
    let f = factors(rows, cols, &[1.0, 3.0], 2);
    let (u_id, v_id) = (f.u.id, f.v.id);
    let bias: Param<Tensor<B, 2>> = param(vec![0.1; 4], [1, rows], &device());
    let bias_id = bias.id;
    let layer = Affine {
        weight: Weight::Factorized(f),
        bias: Some(bias),
        scaler: None,
    };
    let Weight::Factorized(f) = &layer.weight else {
        unreachable!()
    };
    assert!(!f.omega.is_require_grad(), "ω must be a constant");
    let loss = layer
        .forward(tensor(&random(3 * cols, 4), [3, cols]), &Cohort::single(3))
        .sum();
    let grads = GradientsParams::from_grads(loss.backward(), &layer);
    assert_eq!(grads.len(), 3, "exactly U, V and the bias");
    for id in [u_id, v_id] {
        assert!(
            grads
                .get::<<B as AutodiffBackend>::InnerBackend, 3>(id)
                .is_some()
        );
    }
    assert!(
        grads
            .get::<<B as AutodiffBackend>::InnerBackend, 2>(bias_id)
            .is_some()
    );
}

#[test]
fn clip_lr_scales_each_term_by_min_one_tau_over_omega() {
    let (rows, cols, tau) = (3, 5, 10.0);
    let omega = [2.0, 10.0, 40.0, 250.0];
    let arch = Architecture::Mlp {
        inputs: cols,
        hidden: vec![rows, rows],
        classes: 2,
    };
    // Build an MLP whose middle layer is a shard, then compare clipped and raw gradients.
    let (state, shardable) = arch.initial_state(5).expect("builds");
    assert_eq!(shardable, vec!["fc1.weight".to_string()]);
    let shard = LayerShard {
        name: "fc1.weight".into(),
        shape: vec![rows, rows],
        indices: vec![0, 1, 2, 3],
        left: random(4 * rows, 6),
        right: random(4 * rows, 7),
        multipliers: omega.to_vec(),
    };
    let dense = without(&state, "fc1.weight");
    let (net, _) = arch
        .load::<B>(&dense, std::slice::from_ref(&shard), &device())
        .expect("loads");
    let four = Cohort::single(4);
    let loss = net
        .forward(tensor(&random(4 * cols, 8), [4, cols]), &four)
        .sum();
    let raw = GradientsParams::from_grads(loss.backward(), &net);
    let mut clipped = GradientsParams::from_grads(
        net.forward(tensor(&random(4 * cols, 8), [4, cols]), &four)
            .sum()
            .backward(),
        &net,
    );
    clip_lr(&net, &mut clipped, tau);
    let Weight::Factorized(f) = net.weights()[1] else {
        panic!("fc1 is the shard")
    };
    for (id, width) in [(f.u.id, rows), (f.v.id, rows)] {
        type I = <B as AutodiffBackend>::InnerBackend;
        let r: Vec<f32> = raw
            .get::<I, 3>(id)
            .expect("grad")
            .into_data()
            .to_vec()
            .expect("f32");
        let c: Vec<f32> = clipped
            .get::<I, 3>(id)
            .expect("grad")
            .into_data()
            .to_vec()
            .expect("f32");
        for (j, &o) in omega.iter().enumerate() {
            let scale = (tau / f64::from(o)).min(1.0);
            for k in 0..width {
                let expected = f64::from(r[j * width + k]) * scale;
                assert!(
                    (f64::from(c[j * width + k]) - expected).abs() <= 1e-6 * (1.0 + expected.abs()),
                    "term {j}: {} vs {expected}",
                    c[j * width + k]
                );
            }
        }
    }
}

fn without(state: &ModelState, name: &str) -> ModelState {
    ModelState::new(
        state
            .tensors
            .iter()
            .filter(|t| t.name != name)
            .cloned()
            .collect(),
    )
    .expect("distinct names")
}

#[test]
fn frobenius_decay_gradient_is_the_analytic_one() {
    // dFD/dU = μ Ŵ V Ω and dFD/dV = μ Ŵᵀ U Ω (docs/algorithms.md §1.7), with U = uᵀ, V = vᵀ here.
    let (rows, cols, mu) = (5, 8, 1e-2);
    let omega = [0.7, 1.5, 4.0];
    let n = omega.len();
    let arch = Architecture::Mlp {
        inputs: cols,
        hidden: vec![cols, rows],
        classes: 2,
    };
    let (state, _) = arch.initial_state(1).expect("builds");
    let shard = LayerShard {
        name: "fc1.weight".into(),
        shape: vec![rows, cols],
        indices: vec![0, 1, 2],
        left: random(n * rows, 11),
        right: random(n * cols, 12),
        multipliers: omega.to_vec(),
    };
    let (net, _) = arch
        .load::<B>(
            &without(&state, "fc1.weight"),
            std::slice::from_ref(&shard),
            &device(),
        )
        .expect("loads");
    let mut grads = GradientsParams::new();
    let dense = add_frobenius_decay(&net, &mut grads, mu);
    let Weight::Factorized(f) = net.weights()[1] else {
        panic!("fc1 is the shard")
    };
    // The dense weights' μ W is left to the optimizer's step; the shard's terms are here.
    let Weight::Dense(fc0) = net.weights()[0] else {
        panic!("fc0 is dense")
    };
    assert_eq!((dense.of(&fc0.id), dense.of(&f.u.id)), (mu, 0.0));
    assert!(
        grads
            .get::<<B as AutodiffBackend>::InnerBackend, 2>(fc0.id)
            .is_none()
    );
    type I = <B as AutodiffBackend>::InnerBackend;
    let gu: Vec<f32> = grads
        .get::<I, 2>(f.u.id)
        .expect("grad")
        .into_data()
        .to_vec()
        .expect("f32");
    let gv: Vec<f32> = grads
        .get::<I, 2>(f.v.id)
        .expect("grad")
        .into_data()
        .to_vec()
        .expect("f32");
    let (u, v) = (&shard.left, &shard.right);
    let w = dense_product(u, v, &omega, rows, cols);
    // Row j of grad u: μ ω_j Ŵ v_j (length rows); row j of grad v: μ ω_j Ŵᵀ u_j (length cols).
    let mut eu = vec![0.0; n * rows];
    let mut ev = vec![0.0; n * cols];
    for j in 0..n {
        let o = f64::from(omega[j]);
        for r in 0..rows {
            for c in 0..cols {
                eu[j * rows + r] += mu * o * w[r * cols + c] * f64::from(v[j * cols + c]);
                ev[j * cols + c] += mu * o * w[r * cols + c] * f64::from(u[j * rows + r]);
            }
        }
    }
    assert_close(&gu, &eu, 1e-5, "dFD/dU");
    assert_close(&gv, &ev, 1e-5, "dFD/dV");
}

#[test]
fn a_conv_decomposed_with_all_terms_reproduces_the_conv() {
    for stride in [1, 2] {
        conv_reproduced(stride);
    }
}

/// Few terms run as two convolutions (n filters, then 1×1), many as one convolution with the
/// composed weight: both orders give the dense convolution of Uᵀ·Diag(ω)·V.
#[test]
fn a_factorized_conv_is_the_conv_of_its_composed_weight_in_either_order() {
    let (c_in, c_out, k, side, batch) = (4, 8, 3, 5, 2);
    let cols = c_in * k * k;
    for omega in [vec![1.5, 0.5], vec![0.8; 8]] {
        let n = omega.len();
        let f = factors(c_out, cols, &omega, 41);
        let (u, v) = (values(f.u.val()), values(f.v.val()));
        let composed: Vec<f32> = dense_product(&u, &v, &omega, c_out, cols)
            .into_iter()
            .map(|w| w as f32)
            .collect();
        let conv = |weight| Conv::<B> {
            weight,
            bias: None,
            scaler: None,
            in_channels: c_in,
            kernel: [k, k],
            stride: [1, 1],
            padding: [1, 1],
        };
        let x = tensor(
            &random(batch * c_in * side * side, 42),
            [batch, c_in, side, side],
        );
        let expected: Vec<f64> = values(
            conv(Weight::Dense(param(composed, [1, c_out, cols], &device())))
                .forward(x.clone(), &Cohort::single(batch)),
        )
        .into_iter()
        .map(f64::from)
        .collect();
        let actual = values(conv(Weight::Factorized(f)).forward(x, &Cohort::single(batch)));
        assert_close(&actual, &expected, 1e-5, &format!("conv with {n} terms"));
    }
}

#[test]
fn the_fused_conv_is_burns_conv_at_every_stride_and_padding() {
    let (c_in, c_out, k, side, batch) = (3, 5, 3, 7, 2);
    let w = random(c_out * c_in * k * k, 31);
    let x = tensor(
        &random(batch * c_in * side * side, 32),
        [batch, c_in, side, side],
    );
    for (stride, padding) in [(1, 1), (2, 1), (1, 0), (2, 2)] {
        let geometry = ConvGeometry {
            kernel: [k, k],
            stride: [stride, stride],
            padding: [padding, padding],
        };
        let expected: Vec<f64> = values(burn::tensor::module::conv2d(
            x.clone(),
            tensor(&w, [c_out, c_in, k, k]),
            None,
            geometry.options(),
        ))
        .into_iter()
        .map(f64::from)
        .collect();
        let actual = values(conv2d(
            x.clone(),
            tensor(&w, [c_out, c_in * k * k]),
            None,
            geometry,
        ));
        assert_close(
            &actual,
            &expected,
            1e-5,
            &format!("conv, stride {stride}, padding {padding}"),
        );
    }
}

fn conv_reproduced(stride: usize) {
    let (c_in, c_out, k, side, batch) = (3, 6, 3, 7, 2);
    let cols = c_in * k * k;
    let w = random(c_out * cols, 21);
    let bias = random(c_out, 22);
    let dense = Conv::<B> {
        weight: Weight::Dense(param(w.clone(), [1, c_out, cols], &device())),
        bias: Some(param(bias.clone(), [1, c_out], &device())),
        scaler: None,
        in_channels: c_in,
        kernel: [k, k],
        stride: [stride, stride],
        padding: [1, 1],
    };
    let svd = factorize(&w, c_out, cols).expect("finite weights");
    let n = svd.terms();
    assert_eq!(n, c_out.min(cols));
    let shard = Conv::<B> {
        weight: Weight::Factorized(
            Factors::from_rows(
                svd.left.clone(),
                svd.right.clone(),
                vec![1.0; n],
                [1, c_out, cols],
                &device(),
            )
            .expect("shapes"),
        ),
        bias: Some(param(bias.clone(), [1, c_out], &device())),
        scaler: None,
        in_channels: c_in,
        kernel: [k, k],
        stride: [stride, stride],
        padding: [1, 1],
    };
    let x = tensor(
        &random(batch * c_in * side * side, 23),
        [batch, c_in, side, side],
    );
    let all = Cohort::single(batch);
    let expected: Vec<f64> = values(dense.forward(x.clone(), &all))
        .into_iter()
        .map(f64::from)
        .collect();
    let actual = values(shard.forward(x, &all));
    assert_close(&actual, &expected, 1e-5, "conv output");
}

fn digits_cnn() -> Architecture {
    Architecture::DigitsCnn { classes: 10 }
}

#[test]
fn shard_train_zero_steps_unshard_is_bit_exact() {
    let arch = digits_cnn();
    let (state, shardable) = arch.initial_state(3).expect("builds");
    assert_eq!(shardable, ["conv1.weight", "conv2.weight", "fc0.weight"]);
    let (dense, shards) = single_client_task(&state, &shardable, 0.4, 7).expect("plans");
    assert_eq!(shards.len(), 3);
    let recipe = fedshard_protocol::task::Recipe {
        learning_rate: 0.1,
        epochs: 0,
        batch_size: 8,
        momentum: 0.9,
        weight_decay: 1e-4,
        clip_lr: Some(10.0),
        proximal_mu: 0.0,
    };
    let examples = fedshard_training::data::digits::load().expect("digits");
    let member = Member {
        dense: &dense,
        shards: &shards,
        width: None,
        examples: &examples,
        seed: 1,
        round: 1,
        client: 0,
        variates: None,
    };
    let trained = cohort::train::<B, _>(&arch, &recipe, &[member], &device())
        .pop()
        .expect("one result")
        .expect("zero epochs");
    let (dense_out, shards_out) = (trained.dense, trained.shards);
    assert_eq!(dense_out, dense);
    assert_eq!(shards_out.len(), shards.len());
    for (a, b) in shards_out.iter().zip(&shards) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.left), bits(&b.left), "{} left", a.name);
        assert_eq!(bits(&a.right), bits(&b.right), "{} right", a.name);
        assert_eq!(a.indices, b.indices);
        assert_eq!(a.multipliers, b.multipliers);
    }
}

#[test]
fn a_task_naming_a_layer_the_model_lacks_is_an_error() {
    let arch = digits_cnn();
    let (mut state, _) = arch.initial_state(3).expect("builds");
    state
        .tensors
        .push(fedshard_protocol::model::NamedTensor::zeros(
            "extra",
            vec![2],
        ));
    let state = ModelState::new(state.tensors).expect("distinct names");
    let err = arch
        .load::<B>(&state, &[], &device())
        .expect_err("unknown tensor")
        .to_string();
    assert!(err.contains("extra"), "{err}");
    let shard_of_first = LayerShard {
        name: "conv0.weight".into(),
        shape: vec![16, 1, 3, 3],
        indices: vec![0],
        left: vec![0.0; 16],
        right: vec![0.0; 9],
        multipliers: vec![1.0],
    };
    let (state, _) = arch.initial_state(3).expect("builds");
    let err = arch
        .load::<B>(
            &without(&state, "conv0.weight"),
            &[shard_of_first],
            &device(),
        )
        .expect_err("first layer")
        .to_string();
    assert!(err.contains("never sharded"), "{err}");
}

/// Random shards of every shardable layer at keep ratio `r` (shapes are what matters here).
fn random_shards(state: &ModelState, layers: &[String], r: f64) -> Vec<LayerShard> {
    layers
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let t = state.get(name).expect("layer");
            let rows = t.shape[0];
            let cols: usize = t.shape[1..].iter().product();
            let n = ((rows.min(cols) as f64) * r).ceil() as usize;
            LayerShard {
                name: name.clone(),
                shape: t.shape.clone(),
                indices: (0..n).collect(),
                left: random(n * rows, 100 + i as u64)
                    .iter()
                    .map(|x| x * 0.1)
                    .collect(),
                right: random(n * cols, 200 + i as u64)
                    .iter()
                    .map(|x| x * 0.1)
                    .collect(),
                multipliers: vec![1.0; n],
            }
        })
        .collect()
}

/// Builds the model dense and sharded, runs forward and backward on a tiny batch.
fn forward_backward(arch: &Architecture, batch: usize, x: Vec<f32>, expected_logits: [usize; 2]) {
    let (state, shardable) = arch.initial_state(1).expect("builds");
    assert!(!shardable.is_empty());
    let width = arch.input_width();
    for sharded in [false, true] {
        let (dense, shards) = if sharded {
            let shards = random_shards(&state, &shardable, 0.2);
            let dense = shardable.iter().fold(state.clone(), |s, n| without(&s, n));
            (dense, shards)
        } else {
            (state.clone(), vec![])
        };
        let (net, layout) = arch.load::<B>(&dense, &shards, &device()).expect("loads");
        let logits = net.forward(tensor(&x, [batch, width]), &Cohort::single(batch));
        assert_eq!(logits.dims(), expected_logits);
        let grads = GradientsParams::from_grads(logits.sum().backward(), &net);
        assert!(!grads.is_empty());
        let (d, s) = net
            .export(&layout, &[(&dense, &shards, None)])
            .expect("exports")
            .pop()
            .expect("one client");
        assert_eq!(d.num_parameters(), dense.num_parameters());
        assert_eq!(s.len(), shards.len());
    }
}

#[test]
fn resnet18_builds_runs_and_shards() {
    let arch = Architecture::Resnet18 { classes: 10 };
    forward_backward(&arch, 2, random(2 * 3072, 5), [2, 10]);
}

#[test]
fn cct_builds_runs_and_shards() {
    let arch = Architecture::Cct { classes: 100 };
    forward_backward(&arch, 2, random(2 * 3072, 6), [2, 100]);
}

#[test]
fn char_transformer_builds_runs_and_shards() {
    let arch = Architecture::CharTransformer(Default::default());
    let shape = fedshard_training::models::char_transformer::CharShape::default();
    let tokens: Vec<f32> = (0..2 * shape.context)
        .map(|i| (i % shape.vocab) as f32)
        .collect();
    forward_backward(&arch, 2, tokens, [2 * shape.context, shape.vocab]);
}

/// The short digits-CNN federation (keep ratio 0.5, iid clients, 10 rounds).
const DIGITS_CNN: &str = include_str!("fixtures/digits-cnn-r05.toml");

fn run_federation(
    config: &fedshard::config::Config,
) -> (ModelState, fedshard_actors::record::Summary) {
    fedshard::federation::run_to_end(config).expect("run completes")
}

#[test]
fn a_digits_cnn_federation_learns_under_every_strategy() {
    let base = fedshard::config::Config::parse(DIGITS_CNN, std::path::Path::new("test.toml"))
        .expect("valid config");
    let strategies = fedshard::compare::parse_strategies(fedshard::compare::DEFAULT_STRATEGIES)
        .expect("the default strategies parse");
    assert_eq!(strategies.len(), 8);
    for strategy in strategies {
        let mut config = base.clone();
        config.federation.strategy = strategy;
        let (_, summary) = run_federation(&config);
        // Chance is 0.1 on ten balanced classes; in release these runs end at 0.33–0.56.
        assert!(
            summary.final_accuracy > 0.25,
            "{strategy}: final accuracy {}",
            summary.final_accuracy
        );
        assert!(
            summary.per_round.iter().all(|r| r.model_updated),
            "{strategy}"
        );
        eprintln!("{strategy}: {:.3}", summary.final_accuracy);
    }
}

#[test]
fn local_training_then_evaluation_learns_the_digits() {
    use fedshard_protocol::task::{Evaluator, LocalTrainer, Recipe, TrainTask};
    use fedshard_training::train::neural::{Cpu, LocalMethod, NeuralClient, NeuralEvaluator};
    let arch = digits_cnn();
    let (state, _) = arch.initial_state(2).expect("builds");
    let digits = fedshard_training::data::digits::load().expect("digits");
    let client = NeuralClient::<B> {
        architecture: arch.clone(),
        examples: Box::new(digits.clone()),
        device: device(),
        method: LocalMethod::Sgd,
    };
    let evaluator = NeuralEvaluator::<Cpu> {
        architecture: arch,
        examples: Box::new(digits),
        device: Default::default(),
        batch_size: 256,
    };
    let before = evaluator.evaluate(&state).expect("evaluates");
    let task = TrainTask {
        round: 1,
        client: 0,
        seed: 1,
        dense: state,
        width: None,
        shards: vec![],
        recipe: Recipe {
            learning_rate: 0.05,
            epochs: 2,
            batch_size: 32,
            momentum: 0.9,
            weight_decay: 1e-4,
            clip_lr: None,
            proximal_mu: 0.0,
        },
        uplink: Default::default(),
        variates: None,
    };
    let out = client.train(&task).expect("trains");
    let after = evaluator.evaluate(&out.dense).expect("evaluates");
    eprintln!(
        "before {before:?}, after {after:?}, train loss {}",
        out.loss
    );
    assert!(after.accuracy > 0.8, "{after:?}");
}

/// burn-ndarray's `simd` feature computes `recip` (used by the backward of log, division and
/// the norms) with `_mm256_rcp_ps` on the aligned middle of a buffer and exactly on its ends,
/// so gradients depended on where the allocator put a tensor; the feature is off (Cargo.toml).
#[test]
fn local_training_is_bit_for_bit_deterministic() {
    let cases = [
        (Architecture::digits_mlp(), 1.0, None),
        (digits_cnn(), 1.0, None),
        (digits_cnn(), 0.4, Some(10.0)),
    ];
    for (arch, keep_ratio, clip_lr) in cases {
        let (first, second) = train_twice(&arch, keep_ratio, clip_lr);
        let equal = first.iter().zip(&second).filter(|(a, b)| a == b).count();
        assert_eq!(
            equal,
            first.len(),
            "{arch:?} at keep ratio {keep_ratio}: only {equal} of {} values equal",
            first.len()
        );
    }
}

/// The bits of every trained value, twice from the same task.
fn train_twice(arch: &Architecture, keep_ratio: f64, clip_lr: Option<f64>) -> (Vec<u32>, Vec<u32>) {
    use fedshard_protocol::task::{LocalTrainer, Recipe, TrainOutput, TrainTask};
    use fedshard_training::train::neural::{LocalMethod, NeuralClient};
    let (state, shardable) = arch.initial_state(5).expect("builds");
    let (dense, shards) = single_client_task(&state, &shardable, keep_ratio, 7).expect("plans");
    let client = NeuralClient::<B> {
        architecture: arch.clone(),
        examples: Box::new(fedshard_training::data::digits::load().expect("digits")),
        device: device(),
        method: LocalMethod::Sgd,
    };
    let task = TrainTask {
        round: 1,
        client: 0,
        seed: 1,
        dense,
        width: None,
        shards,
        recipe: Recipe {
            learning_rate: 0.05,
            epochs: 1,
            batch_size: 32,
            momentum: 0.9,
            weight_decay: 1e-4,
            clip_lr,
            proximal_mu: 0.0,
        },
        uplink: Default::default(),
        variates: None,
    };
    let bits = |out: TrainOutput| {
        let dense = out.dense.tensors.into_iter().flat_map(|t| t.data);
        let shards = out
            .shards
            .into_iter()
            .flat_map(|s| s.left.into_iter().chain(s.right));
        dense.chain(shards).map(f32::to_bits).collect()
    };
    (
        bits(client.train(&task).expect("trains")),
        bits(client.train(&task).expect("trains")),
    )
}

#[test]
fn a_digits_cnn_federation_is_reproducible() {
    let mut config = fedshard::config::Config::parse(DIGITS_CNN, std::path::Path::new("test.toml"))
        .expect("valid config");
    config.run.rounds = 2;
    let run = |config: &fedshard::config::Config| run_federation(config).0.to_bytes();
    let first = run(&config);
    assert!(first == run(&config), "same seed, different model bytes");
    config.run.seed += 1;
    assert!(first != run(&config), "another seed gave the same model");
}
