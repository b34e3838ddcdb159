//! The operators beyond the first fixtures' against PyTorch (scripts/onnx_fixtures.py):
//! `bn_cnn` (BatchNorm on the batch's statistics, LeakyRelu, a dilated depthwise and a dilated
//! convolution, overlapping padded pools, LogSoftmax) and `mixer` (LayerNormalization,
//! Transpose, Softmax, GELU, Tanh, Sigmoid, Unsqueeze/Squeeze); Dropout, a final Softmax,
//! the refusals, per-client batch statistics, and a sharded layer against the dense one.

use super::graph::{Attribute, Constant, Graph, Node, Values};
use super::plan::{Kernel, Unary};
use super::tests::{build, fixture, floats, gradients_and_step, logits, max_diff, oracle};
use super::*;
use crate::models::builder::Builder;
use crate::models::kernels::Cohort;
use crate::models::net::Architecture;
use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use fedshard_protocol::task::LayerShard;
use std::collections::BTreeMap;

type B = NdArray;

/// Forward: PyTorch's logits within 1e-5 for both exporters' files (bn_cnn: PyTorch in train
/// mode, BatchNorm on the batch's statistics, fedshard's rule in training and evaluation).
#[test]
fn onnx_forward_matches_pytorch_for_bn_cnn_and_mixer() {
    for (model, file) in [
        ("bn_cnn", "bn_cnn.onnx"),
        ("bn_cnn", "bn_cnn.dynamo.onnx"),
        ("mixer", "mixer.onnx"),
        ("mixer", "mixer.dynamo.onnx"),
    ] {
        let o = oracle(model);
        let m = OnnxModel::read(&fixture(file)).expect("loads");
        let net = build::<B>(&m, m.initial_state());
        let diff = max_diff(&logits(&net, &o), &floats(&o["output"]));
        println!("{file}: max |logit - PyTorch| = {diff:e}");
        assert!(diff <= 1e-5, "{file}: logits differ by {diff}");
    }
}

/// Gradients of every trainable tensor (BatchNorm's γ and β, the dense grouped and dilated
/// convolution weights) within 1e-4, and the logits after one SGD step within 1e-5.
#[test]
fn onnx_gradients_and_one_sgd_step_match_pytorch_for_bn_cnn() {
    for file in ["bn_cnn.onnx", "bn_cnn.dynamo.onnx"] {
        let (grads, after) = gradients_and_step("bn_cnn", file);
        println!("{file}: max |grad diff| = {grads:e}, after one step {after:e}");
    }
}

/// The same for LayerNormalization (rank 3 and rank 2), Softmax after a Transpose, GELU (the
/// Erf decomposition at opset 17, opset 20's `Gelu`), Tanh and Sigmoid.
#[test]
fn onnx_gradients_and_one_sgd_step_match_pytorch_for_mixer() {
    for file in ["mixer.onnx", "mixer.dynamo.onnx"] {
        let (grads, after) = gradients_and_step("mixer", file);
        println!("{file}: max |grad diff| = {grads:e}, after one step {after:e}");
    }
}

/// GroupNormalization (opset 21, the dynamo exporter; its three GroupNorms' equal γ and β
/// merged into one initializer each, trained tied): PyTorch's logits within 1e-5 and the tied
/// gradients within 1e-4.
#[test]
fn onnx_group_normalization_matches_pytorch() {
    let o = oracle("resnet_gn");
    let file = "resnet_gn.opset21.onnx";
    let m = OnnxModel::read(&fixture(file)).expect("loads");
    let net = build::<B>(&m, m.initial_state());
    let diff = max_diff(&logits(&net, &o), &floats(&o["output"]));
    println!("{file}: max |logit - PyTorch| = {diff:e}");
    assert!(diff <= 1e-5, "{file}: logits differ by {diff}");
    let (grads, _) = gradients_and_step("resnet_gn", file);
    println!("{file}: max |grad diff| = {grads:e}");
}

fn decode(file: &str) -> Graph {
    let bytes = std::fs::read(fixture(file)).expect("fixture");
    Graph::decode(file, &bytes).expect("decodes")
}

fn node(name: &str, op: &str, inputs: &[&str], output: &str) -> Node {
    Node {
        name: name.into(),
        op: op.into(),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: vec![output.into()],
        attributes: BTreeMap::new(),
    }
}

fn forward_of(graph: &Graph, o: &serde_json::Value) -> Vec<f32> {
    let plan = Plan::new(graph).expect("plans");
    let m = OnnxModel::from_plan("test", plan);
    logits(&build::<B>(&m, m.initial_state()), o)
}

/// `mlp.onnx` with a Dropout between its ReLU and its last Gemm: an identity, so PyTorch's
/// (eval mode) logits within 1e-5; a `training_mode` that is not a constant false is refused.
#[test]
fn onnx_dropout_is_an_identity() {
    let o = oracle("mlp");
    let mut graph = decode("mlp.onnx");
    let at = graph
        .nodes
        .iter()
        .position(|n| n.op == "Relu")
        .expect("relu");
    let relu = graph.nodes[at].outputs[0].clone();
    for n in &mut graph.nodes[at + 1..] {
        n.inputs
            .iter_mut()
            .filter(|i| **i == relu)
            .for_each(|i| *i = "dropped".into());
    }
    graph
        .nodes
        .insert(at + 1, node("drop", "Dropout", &[&relu], "dropped"));
    let diff = max_diff(&forward_of(&graph, &o), &floats(&o["output"]));
    assert!(diff <= 1e-5, "logits differ by {diff}");

    graph.initializers.insert(
        "mode".into(),
        Constant {
            shape: vec![],
            values: Values::I64(vec![1]),
        },
    );
    graph.nodes[at + 1].inputs = vec![relu, String::new(), "mode".into()];
    let text = Plan::new(&graph).expect_err("refused").to_string();
    assert!(
        text.contains("drop") && text.contains("training_mode"),
        "{text}"
    );
}

/// A Softmax over the classes producing the output runs as LogSoftmax (the loss's own
/// log-softmax is then an identity on it, no softmax twice): the output is PyTorch's
/// log-probabilities, log_softmax(logits), within 1e-5.
#[test]
fn onnx_a_final_softmax_runs_as_log_softmax() {
    let o = oracle("mlp");
    let mut graph = decode("mlp.onnx");
    let logits_name = graph.output.clone();
    let mut softmax = node("probs", "Softmax", &[&logits_name], "probs");
    softmax.attributes.insert("axis".into(), Attribute::Int(1));
    graph.nodes.push(softmax);
    graph.output = "probs".into();
    let plan = Plan::new(&graph).expect("plans");
    let last = plan.steps.last().expect("a step");
    assert_eq!(
        last.kernel,
        Kernel::Unary(Unary::Softmax { axis: 1, log: true })
    );
    let z = floats(&o["output"]);
    let expected: Vec<f32> = z
        .chunks(10)
        .flat_map(|row| {
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
            row.iter().map(move |v| v - lse).collect::<Vec<_>>()
        })
        .collect();
    let diff = max_diff(&forward_of(&graph, &o), &expected);
    assert!(diff <= 1e-5, "log-probabilities differ by {diff}");
}

/// `Gelu` with `approximate = "tanh"` (opset 20) on mlp's logits: PyTorch's formula
/// `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))` (checked equal to `F.gelu(x,
/// approximate="tanh")`), evaluated in f64, within 1e-5.
#[test]
fn onnx_gelu_tanh_is_pytorchs_approximation() {
    let o = oracle("mlp");
    let mut graph = decode("mlp.onnx");
    graph.opset = 20;
    let logits_name = graph.output.clone();
    let mut gelu = node("gelu", "Gelu", &[&logits_name], "gelu");
    gelu.attributes
        .insert("approximate".into(), Attribute::String("tanh".into()));
    graph.nodes.push(gelu);
    graph.output = "gelu".into();
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let expected: Vec<f32> = floats(&o["output"])
        .iter()
        .map(|&x| {
            let x = x as f64;
            (0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh())) as f32
        })
        .collect();
    let diff = max_diff(&forward_of(&graph, &o), &expected);
    assert!(diff <= 1e-5, "tanh GELU differs by {diff}");
}

/// Each new operator's unsupported attributes are refused before a run, naming the node, its
/// operator and what is supported.
#[test]
fn onnx_refuses_unsupported_attributes_of_the_new_operators() {
    let cases: [(&str, &str, &str, Attribute, &str); 4] = [
        (
            "mixer.onnx",
            "Transpose",
            "perm",
            Attribute::Ints(vec![1, 0, 2]),
            "batch",
        ),
        (
            "mixer.onnx",
            "LayerNormalization",
            "axis",
            Attribute::Int(0),
            "after the batch",
        ),
        (
            "mixer.onnx",
            "Softmax",
            "axis",
            Attribute::Int(0),
            "after the batch",
        ),
        (
            "bn_cnn.onnx",
            "AveragePool",
            "dilations",
            Attribute::Ints(vec![2, 2]),
            "[1, 1]",
        ),
    ];
    for (file, op, attribute, value, supported) in cases {
        let mut graph = decode(file);
        let n = graph.nodes.iter_mut().find(|n| n.op == op).expect("the op");
        n.attributes.insert(attribute.into(), value);
        let name = n.name.clone();
        let text = Plan::new(&graph).expect_err("refused").to_string();
        assert!(
            text.contains(&name) && text.contains(op) && text.contains(supported),
            "{text}"
        );
    }
    let mut graph = decode("bn_cnn.onnx");
    let bn = graph
        .nodes
        .iter_mut()
        .find(|n| n.op == "BatchNormalization")
        .expect("bn");
    bn.outputs.push("running_mean".into());
    let text = Plan::new(&graph).expect_err("refused").to_string();
    assert!(
        text.contains("BatchNormalization") && text.contains("running"),
        "{text}"
    );
}

/// In a cohort each client's rows are normalised by their own statistics: two clients of two
/// rows give the logits each gets alone (bit for bit).
#[test]
fn onnx_batch_norm_takes_each_clients_statistics() {
    let o = oracle("bn_cnn");
    let m = OnnxModel::read(&fixture("bn_cnn.onnx")).expect("loads");
    let net = build::<B>(&m, m.initial_state());
    // The same model for two clients, its tensors stacked along the client axis.
    let tasks = [
        (m.initial_state(), &[][..], None),
        (m.initial_state(), &[][..], None),
    ];
    let mut builder = Builder::<B>::load(&tasks, &Default::default());
    let pair = OnnxNet::new(&mut builder, m.plan.clone()).expect("builds");
    let data = floats(&o["input"]);
    let x = |rows: std::ops::Range<usize>| {
        let part = data[rows.start * 64..rows.end * 64].to_vec();
        Tensor::<B, 2>::from_data(TensorData::new(part, [rows.len(), 64]), &Default::default())
    };
    let out = |t: Tensor<B, 2>| t.into_data().to_vec::<f32>().expect("f32");
    let together = out(pair.forward(x(0..4), &Cohort::new(vec![2, 2])));
    let alone = [
        out(net.forward(x(0..2), &Cohort::single(2))),
        out(net.forward(x(2..4), &Cohort::single(2))),
    ]
    .concat();
    assert_eq!(together, alone);
    let whole = out(net.forward(x(0..4), &Cohort::single(4)));
    assert_ne!(
        together, whole,
        "the statistics are the clients', not the batch's"
    );
}

/// `sharded_layers = ["all"]` keeps the layer reading the input and the layer producing the
/// logits dense (like the shipped models); every Gemm/Conv weight may still be named.
#[test]
fn onnx_all_keeps_the_first_and_last_layer_dense() {
    let lenet = Architecture::Onnx {
        path: OnnxFile::read(&fixture("lenet.onnx")).expect("loads"),
    };
    let names = |l: &[&str]| l.iter().map(|n| format!("{n}.weight")).collect::<Vec<_>>();
    assert_eq!(
        lenet.shardable_layers(),
        names(&["conv1", "conv2", "fc1", "fc2", "fc3"])
    );
    assert_eq!(lenet.sharded_by_all(), names(&["conv2", "fc1", "fc2"]));
}

/// A sharded ONNX layer at full rank (every term, exact factors `I · diag(1) · W`) computes
/// what the dense layer does: mixer's middle Gemm `fc2` within 1e-5.
#[test]
fn onnx_sharded_layer_at_full_rank_equals_the_dense_one() {
    let o = oracle("mixer");
    let m = OnnxModel::read(&fixture("mixer.onnx")).expect("loads");
    let dense = logits(&build::<B>(&m, m.initial_state()), &o);
    let w = m.initial_state().get("fc2.weight").expect("fc2").clone();
    let [rows, cols] = w.shape[..] else {
        panic!("a matrix")
    };
    let mut left = vec![0.0; rows * rows];
    (0..rows).for_each(|j| left[j * rows + j] = 1.0);
    let shard = LayerShard {
        name: w.name.clone(),
        shape: w.shape.clone(),
        indices: (0..rows).collect(),
        left,
        right: w.data.clone(),
        multipliers: vec![1.0; rows],
    };
    assert_eq!(w.data.len(), rows * cols);
    let rest = ModelState::new(
        m.initial_state()
            .tensors
            .iter()
            .filter(|t| t.name != w.name)
            .cloned()
            .collect(),
    )
    .expect("state");
    let shards = [shard];
    let tasks = [(&rest, &shards[..], None)];
    let mut builder = Builder::<B>::load(&tasks, &Default::default());
    let net = OnnxNet::new(&mut builder, m.plan.clone()).expect("builds");
    builder.finish().expect("every tensor used");
    assert!(matches!(
        net.affines[1].weight,
        crate::models::layers::Weight::Factorized(_)
    ));
    let diff = max_diff(&logits(&net, &o), &dense);
    assert!(diff <= 1e-5, "sharded logits differ by {diff}");
}
