//! The loader against PyTorch: the committed fixtures (scripts/onnx_fixtures.py) hold, for a
//! fixed batch, PyTorch's logits, the gradients of the mean cross-entropy for every
//! initializer, and the logits after one plain SGD step (lr 0.1).

use super::*;
use crate::models::builder::Builder;
use crate::models::kernels::Cohort;
use crate::models::layers::Weight;
use crate::models::onnx::graph::Graph;
use crate::train::neural::cross_entropy;
use burn::backend::{Autodiff, NdArray};
use burn::module::Param;
use burn::tensor::{Int, Tensor, TensorData};
use fedshard_protocol::model::NamedTensor;
use serde_json::Value;
use std::path::PathBuf;

type B = NdArray;
type AD = Autodiff<NdArray>;

pub(super) fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/onnx")
        .join(name)
}

pub(super) fn oracle(model: &str) -> Value {
    let text = std::fs::read_to_string(fixture(&format!("{model}.json"))).expect("fixture");
    serde_json::from_str(&text).expect("json")
}

pub(super) fn floats(v: &Value) -> Vec<f32> {
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

pub(super) fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub(super) fn input<Bk: burn::tensor::backend::Backend>(oracle: &Value) -> Tensor<Bk, 2> {
    let data = floats(&oracle["input"]);
    let n = oracle["input"]["shape"][0].as_u64().expect("batch") as usize;
    let width = data.len() / n;
    Tensor::from_data(TensorData::new(data, [n, width]), &Default::default())
}

/// The network of `file` with initial values `state`, on backend `Bk`.
pub(super) fn build<Bk: crate::models::kernels::Kernels>(
    model: &OnnxModel,
    state: &ModelState,
) -> OnnxNet<Bk> {
    let mut builder = Builder::<Bk>::given(state, &Default::default());
    OnnxNet::new(&mut builder, model.plan.clone()).expect("builds")
}

pub(super) fn logits<Bk: crate::models::kernels::Kernels>(
    net: &OnnxNet<Bk>,
    oracle: &Value,
) -> Vec<f32> {
    let x = input::<Bk>(oracle);
    let n = x.dims()[0];
    let y = net.forward(x, &Cohort::single(n));
    y.into_data().to_vec::<f32>().expect("f32")
}

/// Forward: PyTorch's logits of the fixed batch within 1e-5 (both exporters' files).
#[test]
fn onnx_forward_matches_pytorch_for_mlp_and_lenet() {
    for (model, file) in [
        ("mlp", "mlp.onnx"),
        ("mlp", "mlp.dynamo.onnx"),
        ("lenet", "lenet.onnx"),
        ("lenet", "lenet.dynamo.onnx"),
    ] {
        let o = oracle(model);
        let m = OnnxModel::read(&fixture(file)).expect("loads");
        let net = build::<B>(&m, m.initial_state());
        let diff = max_diff(&logits(&net, &o), &floats(&o["output"]));
        assert!(diff <= 1e-5, "{file}: logits differ by {diff}");
    }
}

/// The gradient of the mean cross-entropy for every initializer within 1e-4 of PyTorch's,
/// then one SGD step (lr 0.1) whose logits match PyTorch's after the same step within 1e-5.
///
/// Returns the largest gradient difference and the largest logit difference after the step.
pub(super) fn gradients_and_step(model: &str, file: &str) -> (f32, f32) {
    let o = oracle(model);
    let m = OnnxModel::read(&fixture(file)).expect("loads");
    let net = build::<AD>(&m, m.initial_state());
    let x = input::<AD>(&o);
    let n = x.dims()[0];
    let labels: Vec<i64> = o["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| l.as_i64().expect("label"))
        .collect();
    let targets =
        Tensor::<AD, 1, Int>::from_data(TensorData::new(labels, [n]), &Default::default());
    let loss = cross_entropy(net.forward(x, &Cohort::single(n)), targets);
    let value: f32 = loss.clone().into_scalar();
    let expected = o["loss"].as_f64().expect("loss") as f32;
    assert!(
        (value - expected).abs() <= 1e-5,
        "{file}: loss {value}, PyTorch {expected}"
    );
    let grads = loss.backward();
    let grad_of = |p: &Param<Tensor<AD, 3>>| -> Vec<f32> {
        p.grad(&grads)
            .expect("a gradient")
            .into_data()
            .to_vec()
            .expect("f32")
    };
    let grad_of_vec = |p: &Param<Tensor<AD, 2>>| -> Vec<f32> {
        p.grad(&grads)
            .expect("a gradient")
            .into_data()
            .to_vec()
            .expect("f32")
    };
    let mut by_name: Vec<(String, Vec<f32>)> = Vec::new();
    let mut affines = net.affines.iter().map(|a| (&a.weight, &a.bias));
    let mut convs = net.convs.iter().map(|c| (&c.weight, &c.bias));
    for layer in &m.plan.layers {
        let (w_name, b_name, built) = match layer {
            plan::Layer::Affine { weight, bias, .. } => (weight, bias, affines.next()),
            plan::Layer::Conv { weight, bias, .. } => (weight, bias, convs.next()),
        };
        let (weight, bias) = built.expect("built");
        let Weight::Dense(w) = weight else {
            panic!("dense")
        };
        by_name.push((w_name.clone(), grad_of(w)));
        if let (Some(b), Some(name)) = (bias, b_name) {
            by_name.push((name.clone(), grad_of_vec(b)));
        }
    }
    for ((name, _), p) in m.plan.tensors.iter().zip(&net.tensors) {
        by_name.push((name.clone(), grad_of_vec(p)));
    }
    let mut stepped = Vec::new();
    let mut worst = 0.0f32;
    // An initializer the exporter shared between parameters (GroupNorm's γ and β of equal
    // values) trains as one tensor: its gradient is the sum over the parameters it stands
    // for, PyTorch's `tied_grad`, and PyTorch's untied step is not one it can take.
    let shared = &o["files"][file]["shared_initializers"];
    let tied = shared.as_object().is_some_and(|s| !s.is_empty());
    for (name, grad) in &by_name {
        let expected = match shared.get(name.as_str()) {
            Some(s) => floats(&s["tied_grad"]),
            None => floats(&o["grads"][name.as_str()]),
        };
        let diff = max_diff(grad, &expected);
        assert!(
            diff <= 1e-4,
            "{file}: gradient of `{name}` differs by {diff}"
        );
        worst = worst.max(diff);
        let t = m.initial_state().get(name).expect("initial");
        stepped.push(NamedTensor {
            name: name.clone(),
            shape: t.shape.clone(),
            data: t.data.iter().zip(grad).map(|(v, g)| v - 0.1 * g).collect(),
        });
    }
    assert_eq!(by_name.len(), m.initial_state().tensors.len());
    if tied {
        return (worst, 0.0);
    }
    let state = ModelState::new(stepped).expect("state");
    let after = logits(&build::<B>(&m, &state), &o);
    let diff = max_diff(&after, &floats(&o["after_step_output"]));
    assert!(
        diff <= 1e-5,
        "{file}: logits after one step differ by {diff}"
    );
    (worst, diff)
}

#[test]
fn onnx_gradients_and_one_sgd_step_match_pytorch_for_mlp() {
    gradients_and_step("mlp", "mlp.onnx");
    gradients_and_step("mlp", "mlp.dynamo.onnx");
}

#[test]
fn onnx_gradients_and_one_sgd_step_match_pytorch_for_lenet() {
    gradients_and_step("lenet", "lenet.onnx");
    gradients_and_step("lenet", "lenet.dynamo.onnx");
}

/// Every Gemm and Conv weight is shardable; the initial state is the file's initializers.
#[test]
fn onnx_layers_are_named_by_initializers_and_shardable() {
    let m = OnnxModel::read(&fixture("lenet.onnx")).expect("loads");
    let mut builder = Builder::<B>::given(m.initial_state(), &Default::default());
    OnnxNet::new(&mut builder, m.plan.clone()).expect("builds");
    let (_, init) = builder.finish().expect("finishes");
    let (state, shardable) = init.expect("init mode");
    assert_eq!(&state, m.initial_state());
    assert_eq!(
        shardable,
        ["conv1", "conv2", "fc1", "fc2", "fc3"].map(|l| format!("{l}.weight"))
    );
    assert_eq!(m.input_width(), 28 * 28);
    assert!(m.check_input(64).is_err());
}

/// An unsupported operator is refused before any run, naming the node, the operator and
/// what is supported.
#[test]
fn onnx_refuses_an_unsupported_operator_naming_the_node() {
    let bytes = std::fs::read(fixture("mlp.onnx")).expect("fixture");
    let mut graph = Graph::decode("mlp.onnx", &bytes).expect("decodes");
    graph.nodes[1].op = "Hardmax".into();
    let node = graph.nodes[1].name.clone();
    let err = Plan::new(&graph).expect_err("refused");
    let text = OnnxError::new("mlp.onnx", err).to_string();
    assert!(text.contains(&node) && text.contains("Hardmax"), "{text}");
    assert!(text.contains("supported: Add"), "{text}");
}

/// A convolution attribute the kernels lack (asymmetric padding) is refused naming it and
/// what is supported.
#[test]
fn onnx_refuses_an_unsupported_attribute() {
    let bytes = std::fs::read(fixture("lenet.onnx")).expect("fixture");
    let mut graph = Graph::decode("lenet.onnx", &bytes).expect("decodes");
    let conv = graph
        .nodes
        .iter_mut()
        .find(|n| n.op == "Conv")
        .expect("a conv");
    conv.attributes
        .insert("pads".into(), graph::Attribute::Ints(vec![2, 2, 1, 1]));
    let text = Plan::new(&graph).expect_err("refused").to_string();
    assert!(
        text.contains("pads") && text.contains("Conv") && text.contains("symmetric"),
        "{text}"
    );
}

/// Gradients through GroupNorm's decomposition, GELU and the residual block; its γ and β
/// shared by the exporter get the tied (summed) gradient.
#[test]
fn onnx_gradients_match_pytorch_for_resnet_gn() {
    gradients_and_step("resnet_gn", "resnet_gn.onnx");
    gradients_and_step("resnet_gn", "resnet_gn.dynamo.onnx");
}

/// GroupNorm's decomposition (Reshape → InstanceNormalization → Reshape → Mul → Add, its
/// reshapes computed with Shape/Gather/Unsqueeze/Concat), GELU through Erf, a residual Add and
/// GlobalAveragePool: PyTorch's logits within 1e-5.
#[test]
fn onnx_forward_matches_pytorch_for_resnet_gn() {
    let o = oracle("resnet_gn");
    for file in ["resnet_gn.onnx", "resnet_gn.dynamo.onnx"] {
        let m = OnnxModel::read(&fixture(file)).expect("loads");
        let net = build::<B>(&m, m.initial_state());
        let diff = max_diff(&logits(&net, &o), &floats(&o["output"]));
        assert!(diff <= 1e-5, "{file}: logits differ by {diff}");
    }
}
