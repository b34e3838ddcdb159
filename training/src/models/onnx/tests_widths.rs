//! The widths traced through ONNX graphs (`widths.rs`): what the trace finds in PyTorch's
//! exports (checked by hand against the models in scripts/onnx_fixtures.py), that it finds
//! the shipped digits CNN's hand-written description in that model's export, and that a
//! narrowed graph computes what the narrowed model means.

use super::tests::{fixture, floats, input, max_diff, oracle};
use super::*;
use crate::models::kernels::Cohort;
use crate::models::net::{Architecture, Net};
use burn::backend::NdArray;
use fedshard_protocol::width::{LocalWidth, WidthGroup, WidthSlice, slice_state};
use std::collections::BTreeMap;

type B = NdArray;

/// Each width as (name, units, norm groups, its axes as sorted `tensor:axis/block`).
fn described(groups: &[WidthGroup]) -> Vec<(String, usize, usize, Vec<String>)> {
    groups
        .iter()
        .map(|g| {
            let mut axes: Vec<String> = g
                .axes
                .iter()
                .map(|a| format!("{}:{}/{}", a.tensor, a.axis, a.block))
                .collect();
            axes.sort();
            (g.name.clone(), g.units, g.norm_groups, axes)
        })
        .collect()
}

fn traced(file: &str) -> Vec<(String, usize, usize, Vec<String>)> {
    described(
        &OnnxModel::read(&fixture(file))
            .expect("loads")
            .widths
            .groups,
    )
}

fn width(
    name: &str,
    units: usize,
    groups: usize,
    axes: &[&str],
) -> (String, usize, usize, Vec<String>) {
    let mut axes: Vec<String> = axes.iter().map(|s| s.to_string()).collect();
    axes.sort();
    (name.into(), units, groups, axes)
}

/// PyTorch's exports, both exporters: every hidden layer of the MLP and LeNet is a width (a
/// conv2 channel is 5·5 = 25 inputs of fc1 after the flatten); the output layer never is.
/// The mixer's fc1 is a width normalised over its kept units by a LayerNorm (its γ and β cut
/// with it), like fc2.
/// BnCnn has none: its first convolution feeds a depthwise one (pinned) and its dilated
/// convolution is no shardable layer. ResNetGn's stem, both block convolutions and the
/// residual sum are one width (the residual adds the stem's channels to conv2's, and the
/// exporters share one γ and one β, equal at initialisation, between the three GroupNorms,
/// which ties conv1's channels to them), in 2 norm groups, traced through GroupNormalization
/// (opset 21) and through the Reshape–InstanceNormalization–Reshape decomposition alike.
#[test]
fn the_widths_of_pytorchs_exports_are_traced_through_their_graphs() {
    let mlp = vec![width(
        "fc1",
        32,
        1,
        &["fc1.weight:0/1", "fc1.bias:0/1", "fc2.weight:1/1"],
    )];
    let lenet = vec![
        width(
            "conv1",
            6,
            1,
            &["conv1.weight:0/1", "conv1.bias:0/1", "conv2.weight:1/1"],
        ),
        width(
            "conv2",
            16,
            1,
            &["conv2.weight:0/1", "conv2.bias:0/1", "fc1.weight:1/25"],
        ),
        width(
            "fc1",
            120,
            1,
            &["fc1.weight:0/1", "fc1.bias:0/1", "fc2.weight:1/1"],
        ),
        width(
            "fc2",
            84,
            1,
            &["fc2.weight:0/1", "fc2.bias:0/1", "fc3.weight:1/1"],
        ),
    ];
    let mixer = vec![
        width(
            "fc1",
            32,
            1,
            &[
                "fc1.weight:0/1",
                "fc1.bias:0/1",
                "ln2.weight:0/1",
                "ln2.bias:0/1",
                "fc2.weight:1/1",
            ],
        ),
        width(
            "fc2",
            32,
            1,
            &["fc2.weight:0/1", "fc2.bias:0/1", "fc3.weight:1/1"],
        ),
    ];
    for exporter in ["", ".dynamo"] {
        assert_eq!(traced(&format!("mlp{exporter}.onnx")), mlp);
        assert_eq!(traced(&format!("lenet{exporter}.onnx")), lenet);
        assert_eq!(traced(&format!("mixer{exporter}.onnx")), mixer);
        assert_eq!(traced(&format!("bn_cnn{exporter}.onnx")), vec![]);
    }
    let convs = [
        "stem.weight:0/1",
        "block_conv1.weight:0/1",
        "block_conv1.weight:1/1",
        "block_conv2.weight:0/1",
        "block_conv2.weight:1/1",
        "down.weight:1/1",
    ];
    let down = width(
        "down",
        16,
        1,
        &["down.weight:0/1", "down.bias:0/1", "fc.weight:1/1"],
    );
    for (file, gamma, beta) in [
        ("resnet_gn.onnx", "stem_gn.weight", "stem_gn.bias"),
        ("resnet_gn.opset21.onnx", "stem_gn.weight", "stem_gn.bias"),
        ("resnet_gn.dynamo.onnx", "val_28", "val_30"),
    ] {
        let mut axes = convs.to_vec();
        let (g, b) = (format!("{gamma}:0/1"), format!("{beta}:0/1"));
        axes.extend([g.as_str(), b.as_str()]);
        assert_eq!(
            traced(file),
            vec![width("stem", 8, 2, &axes), down.clone()],
            "{file}"
        );
    }
}

/// The export of the shipped digits CNN traces to the shipped model's hand-written widths
/// (models/widths.rs): the same names, units, GroupNorm groups and axes, a flattened conv2
/// channel 2·2 = 4 inputs of fc0, and fc0's units with its feature norm.
#[test]
fn the_exported_digits_cnn_traces_to_the_shipped_description() {
    let shipped = described(&Architecture::DigitsCnn { classes: 10 }.width_groups());
    assert_eq!(traced("digits_cnn.onnx"), shipped);
}

/// Logits of `file`'s model narrowed to `slice` (a width it does not name kept whole; no
/// scaler: keep ratio 1), on the fixture batch of `model`.
fn narrowed_logits(
    file: &str,
    model: &str,
    slice: &WidthSlice,
    state: Option<&ModelState>,
) -> Vec<f32> {
    let path = OnnxFile::read(&fixture(file)).expect("loads");
    let arch = Architecture::Onnx { path: path.clone() };
    let global = state.unwrap_or(path.model.initial_state());
    let mut slice = slice.clone();
    for g in arch.width_groups() {
        slice
            .kept
            .entry(g.name)
            .or_insert_with(|| (0..g.units).collect());
    }
    let cut = slice_state(global, &arch.width_groups(), &slice).expect("slices");
    let tasks = [(&cut, &[][..], Some(&slice))];
    let (net, _) = arch
        .load_cohort::<B>(&tasks, &Default::default())
        .expect("builds");
    let Net::Onnx(net) = net else {
        unreachable!("an ONNX model")
    };
    let x = input::<B>(&oracle(model));
    let n = x.dims()[0];
    net.forward(x, &Cohort::single(n))
        .into_data()
        .to_vec::<f32>()
        .expect("f32")
}

fn slice(kept: &[(&str, Vec<usize>)]) -> WidthSlice {
    WidthSlice {
        kept: kept
            .iter()
            .map(|(n, u)| (n.to_string(), u.clone()))
            .collect::<BTreeMap<_, _>>(),
        keep_ratio: 1.0,
        local: LocalWidth::Scaled,
    }
}

/// LeNet narrowed to some units of every width (not a prefix, as FedRolex keeps) computes the
/// whole LeNet's logits after the dropped units' incoming weights and biases are zeroed: a
/// dropped unit then outputs ReLU(0) = 0 through every pool, so nothing reads it.
#[test]
fn a_narrowed_lenet_computes_the_whole_lenet_with_the_dropped_units_silenced() {
    let kept = slice(&[
        ("conv1", vec![0, 2, 3, 5]),
        ("conv2", (3..11).collect()),
        ("fc1", (0..120).filter(|u| u % 3 != 1).collect()),
        ("fc2", (40..84).collect()),
    ]);
    let m = OnnxModel::read(&fixture("lenet.onnx")).expect("loads");
    let mut silenced = m.initial_state().clone();
    for g in &m.widths.groups {
        let keep = &kept.kept[&g.name];
        for a in g.axes.iter().filter(|a| a.axis == 0) {
            let t = silenced
                .tensors
                .iter_mut()
                .find(|t| t.name == a.tensor)
                .expect("tensor");
            let per_unit = t.data.len() / t.shape[0];
            for u in (0..g.units).filter(|u| !keep.contains(u)) {
                t.data[u * per_unit..(u + 1) * per_unit].fill(0.0);
            }
        }
    }
    let whole = narrowed_logits("lenet.onnx", "lenet", &slice(&[]), Some(&silenced));
    let narrow = narrowed_logits("lenet.onnx", "lenet", &kept, None);
    let diff = max_diff(&whole, &narrow);
    assert!(diff <= 1e-5, "logits differ by {diff}");
    assert!(
        max_diff(&whole, &floats(&oracle("lenet")["output"])) > 1e-3,
        "the silencing shows"
    );
}

/// ResNetGn narrowed to 4 of its 8 stream channels (2 of each norm group, not the leading
/// ones) and 10 of `down`'s 16: the Reshape–InstanceNormalization–Reshape decomposition of
/// GroupNorm (TorchScript, opset 17; dynamo, opset 18) computes the logits the
/// GroupNormalization export (opset 21, the shipped fused kernel) computes.
#[test]
fn a_narrowed_groupnorm_decomposition_computes_the_narrowed_groupnorm() {
    let kept = slice(&[
        ("stem", vec![1, 3, 4, 6]),
        ("down", (0..16).filter(|u| u % 3 != 0).collect()),
    ]);
    let reference = narrowed_logits("resnet_gn.opset21.onnx", "resnet_gn", &kept, None);
    let whole = narrowed_logits("resnet_gn.opset21.onnx", "resnet_gn", &slice(&[]), None);
    assert!(max_diff(&reference, &whole) > 1e-3, "the narrowing shows");
    for file in ["resnet_gn.onnx", "resnet_gn.dynamo.onnx"] {
        let diff = max_diff(&narrowed_logits(file, "resnet_gn", &kept, None), &reference);
        assert!(diff <= 1e-5, "{file}: logits differ by {diff}");
    }
}

fn node(name: &str, op: &str, inputs: &[&str], output: &str) -> graph::Node {
    graph::Node {
        name: name.into(),
        op: op.into(),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: vec![output.into()],
        attributes: BTreeMap::new(),
    }
}

/// A trainable tensor a width reaches is cut with it (a bias `shift` added after mlp.onnx's
/// fc1), unless another step reads it whole (the same tensor added to the input seen as
/// `[2, 32]`, an axis no width follows): then the width is pinned, or the narrowed tensor would
/// not fit that step.
#[test]
fn a_tensor_read_whole_elsewhere_pins_the_width_that_reaches_it() {
    use graph::{Constant, Graph, Values};
    let bytes = std::fs::read(fixture("mlp.onnx")).expect("fixture");
    let mut g = Graph::decode("mlp.onnx", &bytes).expect("decodes");
    let hidden = g.nodes[0].outputs[0].clone();
    assert_eq!(g.nodes[1].inputs[0], hidden, "fc1 feeds the ReLU");
    g.initializers.insert(
        "shift".into(),
        Constant {
            shape: vec![32],
            values: Values::F32(vec![0.1; 32]),
        },
    );
    g.nodes
        .insert(1, node("shift_add", "Add", &[&hidden, "shift"], "shifted"));
    g.nodes[2].inputs[0] = "shifted".into();
    let widths = |g: &Graph| {
        described(
            &OnnxModel::from_plan("test", plan::Plan::new(g).expect("plans"))
                .widths
                .groups,
        )
    };
    let axes = [
        "fc1.weight:0/1",
        "fc1.bias:0/1",
        "shift:0/1",
        "fc2.weight:1/1",
    ];
    assert_eq!(widths(&g), vec![width("fc1", 32, 1, &axes)]);
    g.initializers.insert(
        "spec".into(),
        Constant {
            shape: vec![3],
            values: Values::I64(vec![-1, 2, 32]),
        },
    );
    let x = g.input.0.clone();
    g.nodes
        .insert(0, node("view", "Reshape", &[&x, "spec"], "x2"));
    g.nodes
        .insert(1, node("read_whole", "Add", &["x2", "shift"], "unused"));
    assert_eq!(widths(&g), vec![]);
}
