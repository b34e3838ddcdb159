//! ONNX written with the same generated protobuf types [`graph`](super::graph) decodes
//! (onnx-ir's `ModelProto` and the types reached through it), so the writer and the reader
//! share one description of the format: a [`GraphWriter`] for the graphs fedshard writes,
//! and [`substitute`] for a user's graph whose initializers are replaced by trained values.

use crate::models::onnx::export::ExportError;
use crate::models::onnx::graph::{ATTR_FLOAT, ATTR_INT, ATTR_INTS, FLOAT};
use crate::models::onnx::plan::initial::transpose;
use crate::models::onnx::plan::{Layer, Plan};
use fedshard_protocol::model::{ModelState, NamedTensor};
use onnx_ir::{GraphProto, ModelProto, TensorProto, TypeProto, ValueInfoProto};
use protobuf::{EnumOrUnknown, Message, MessageField};
use std::collections::BTreeSet;

/// The opset fedshard writes: the first whose `GroupNormalization` scales per channel, as the
/// shipped GroupNorm does.
pub const OPSET: i64 = 21;
/// The IR version that goes with [`OPSET`] (ONNX 1.16).
const IR_VERSION: i64 = 10;
/// The batch dimension's name in the graphs fedshard writes.
pub const BATCH: &str = "N";

/// An attribute value of a node fedshard writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
}

/// Builds a `ModelProto` of one graph: nodes in order, float32 initializers, one input and one
/// output whose first dimension is the batch.
pub struct GraphWriter {
    model: ModelProto,
}

impl GraphWriter {
    pub fn new(name: &str) -> Self {
        let mut model = ModelProto::new();
        model.ir_version = IR_VERSION;
        model.producer_name = "fedshard".into();
        model.producer_version = env!("CARGO_PKG_VERSION").into();
        model.opset_import.push(Default::default());
        let opset = model.opset_import.last_mut().expect("just pushed");
        opset.domain = String::new();
        opset.version = OPSET;
        let mut graph = GraphProto::new();
        graph.name = name.into();
        model.graph = MessageField::some(graph);
        Self { model }
    }

    fn graph(&mut self) -> &mut GraphProto {
        self.model.graph.mut_or_insert_default()
    }

    /// The graph's input `[N, tail…]`.
    pub fn input(&mut self, name: &str, tail: &[usize]) {
        let value = value_info(name, tail);
        self.graph().input.push(value);
    }

    /// The graph's output `[N, width]` (the logits).
    pub fn output(&mut self, name: &str, width: usize) {
        let value = value_info(name, &[width]);
        self.graph().output.push(value);
    }

    /// A float32 initializer holding `tensor`'s values in its shape.
    pub fn initializer(&mut self, tensor: &NamedTensor) {
        let mut t = TensorProto::new();
        t.name = tensor.name.clone();
        t.dims = tensor.shape.iter().map(|&d| d as i64).collect();
        set_floats(&mut t, &tensor.data);
        self.graph().initializer.push(t);
    }

    /// A node of the default domain: `output ← op(inputs)`.
    pub fn node<S: AsRef<str>>(
        &mut self,
        op: &str,
        name: &str,
        inputs: &[S],
        output: &str,
        attributes: &[(&str, Attr)],
    ) {
        let graph = self.graph();
        graph.node.push(Default::default());
        let node = graph.node.last_mut().expect("just pushed");
        node.op_type = op.into();
        node.name = name.into();
        node.input = inputs.iter().map(|s| s.as_ref().to_string()).collect();
        node.output = vec![output.to_string()];
        for (key, value) in attributes {
            node.attribute.push(Default::default());
            let a = node.attribute.last_mut().expect("just pushed");
            a.name = key.to_string();
            let code = match value {
                Attr::Int(i) => {
                    a.i = *i;
                    ATTR_INT
                }
                Attr::Ints(v) => {
                    a.ints = v.clone();
                    ATTR_INTS
                }
                Attr::Float(f) => {
                    a.f = *f;
                    ATTR_FLOAT
                }
            };
            a.type_ = EnumOrUnknown::from_i32(code);
        }
    }

    /// The encoded model.
    pub fn bytes(self) -> Result<Vec<u8>, ExportError> {
        encode(&self.model)
    }
}

fn encode(model: &ModelProto) -> Result<Vec<u8>, ExportError> {
    model
        .write_to_bytes()
        .map_err(|e| ExportError::Encode(e.to_string()))
}

/// A float32 tensor value `[N, tail…]`.
fn value_info(name: &str, tail: &[usize]) -> ValueInfoProto {
    let mut ty = TypeProto::new();
    let tensor = ty.mut_tensor_type();
    tensor.elem_type = FLOAT;
    let shape = tensor.shape.mut_or_insert_default();
    shape.dim.push(Default::default());
    shape.dim[0].set_dim_param(BATCH.into());
    for &d in tail {
        shape.dim.push(Default::default());
        shape
            .dim
            .last_mut()
            .expect("just pushed")
            .set_dim_value(d as i64);
    }
    let mut value = ValueInfoProto::new();
    value.name = name.into();
    value.type_ = MessageField::some(ty);
    value
}

/// Stores `data` as little-endian float32 raw data (what PyTorch's exporters write).
fn set_floats(t: &mut TensorProto, data: &[f32]) {
    t.data_type = FLOAT;
    t.float_data.clear();
    t.raw_data = data
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<u8>>()
        .into();
}

/// The ONNX file `bytes` (whose checked [`Plan`] is `plan`) with every tensor of `state`
/// written into the initializer of its name: the same graph, the trained values. A weight the
/// plan holds transposed (`MatMul`, `Gemm` with `transB = 0`) goes back in the file's layout.
/// Every tensor of `state` must have an initializer of its size; `file` names the file.
pub fn substitute(
    file: &str,
    bytes: &[u8],
    plan: &Plan,
    state: &ModelState,
) -> Result<Vec<u8>, ExportError> {
    let bad = |name: &str, what: String| ExportError::Initializer {
        file: file.to_string(),
        name: name.to_string(),
        what,
    };
    let mut model =
        ModelProto::parse_from_bytes(bytes).map_err(|e| bad("(the file)", e.to_string()))?;
    let graph = model.graph.mut_or_insert_default();
    let mut written = BTreeSet::new();
    for init in graph.initializer.iter_mut() {
        let Some(tensor) = state.get(&init.name) else {
            continue;
        };
        let len: i64 = init.dims.iter().product();
        if init.data_type != FLOAT || len != tensor.data.len() as i64 {
            return Err(bad(
                &init.name,
                format!(
                    "the file has {:?} of data type {}, the model {:?} of float32",
                    init.dims, init.data_type, tensor.shape
                ),
            ));
        }
        let held_transposed = plan.layers.iter().find_map(|l| match l {
            Layer::Affine {
                weight,
                c_in,
                c_out,
                transposed: true,
                ..
            } if *weight == init.name => Some((*c_out, *c_in)),
            _ => None,
        });
        match held_transposed {
            Some((rows, cols)) => set_floats(init, &transpose(&tensor.data, rows, cols)),
            None => set_floats(init, &tensor.data),
        }
        written.insert(init.name.clone());
    }
    let missing: Vec<&str> = state
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !written.contains(*n))
        .collect();
    if let Some(name) = missing.first() {
        return Err(bad(
            name,
            format!(
                "the model's tensors {missing:?} have no initializer in the file (the run's \
                 model is of another graph)"
            ),
        ));
    }
    encode(&model)
}
