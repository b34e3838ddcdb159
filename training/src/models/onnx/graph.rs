//! An ONNX file decoded into plain data: nodes in file order, initializers, the graph's input
//! and output. Only onnx-ir's generated protobuf types are used (not its pipeline, which
//! simplifies away a Mul by an all-ones and an Add of an all-zeros initializer: a fresh
//! GroupNorm's trainable γ and β).

use crate::models::onnx::{OnnxError, Problem};
use onnx_ir::ModelProto;
use protobuf::Message;
use std::collections::BTreeMap;

/// ONNX's `TensorProto.DataType` codes the loader reads.
pub(crate) const FLOAT: i32 = 1;
const INT64: i32 = 7;
/// `AttributeProto.AttributeType` codes.
pub(crate) const ATTR_FLOAT: i32 = 1;
pub(crate) const ATTR_INT: i32 = 2;
const ATTR_STRING: i32 = 3;
const ATTR_TENSOR: i32 = 4;
const ATTR_FLOATS: i32 = 6;
pub(crate) const ATTR_INTS: i32 = 7;

/// A constant tensor: an initializer or a `Constant` node's value.
#[derive(Debug, Clone, PartialEq)]
pub struct Constant {
    pub shape: Vec<usize>,
    pub values: Values,
}

/// The element type and values of a [`Constant`], row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Constant {
    /// The values as integers (shapes, axes, indices), or `None` for floats.
    pub fn ints(&self) -> Option<&[i64]> {
        match &self.values {
            Values::I64(v) => Some(v),
            Values::F32(_) => None,
        }
    }

    pub fn floats(&self) -> Option<&[f32]> {
        match &self.values {
            Values::F32(v) => Some(v),
            Values::I64(_) => None,
        }
    }
}

/// One attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    Float(f32),
    Int(i64),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    String(String),
    Tensor(Constant),
    /// A kind the loader never reads (graphs, sparse tensors, types): its ONNX type code.
    Other(i32),
}

/// One node of the graph, as the file has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The node's name, or `#i` (its position) when the file gives none.
    pub name: String,
    pub op: String,
    /// Input value names; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: BTreeMap<String, Attribute>,
}

/// A dimension of the graph's input: a number, or a name (the batch's `N`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    Named(String),
}

/// The decoded graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// The one graph input that is no initializer, and its dimensions.
    pub input: (String, Vec<Dim>),
    /// The one graph output.
    pub output: String,
    pub nodes: Vec<Node>,
    /// Initializers by name, in file order of their names.
    pub initializers: BTreeMap<String, Constant>,
    /// The default domain's opset version.
    pub opset: i64,
}

impl Graph {
    /// Decodes an ONNX `ModelProto`; `file` names it in errors.
    pub fn decode(file: &str, bytes: &[u8]) -> Result<Self, OnnxError> {
        let err = |problem| OnnxError::new(file, problem);
        let model =
            ModelProto::parse_from_bytes(bytes).map_err(|e| err(Problem::Decode(e.to_string())))?;
        let opset = model
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
            .ok_or_else(|| err(Problem::Graph("no opset of the default domain".into())))?;
        let graph = model
            .graph
            .as_ref()
            .ok_or_else(|| err(Problem::Graph("the file holds no graph".into())))?;
        let mut initializers = BTreeMap::new();
        for t in &graph.initializer {
            let constant = tensor(&t.name, t.data_type, &t.dims, || {
                (
                    t.float_data.clone(),
                    t.int64_data.clone(),
                    t.raw_data.to_vec(),
                )
            })
            .map_err(err)?;
            if t.data_location.value() != 0 {
                return Err(err(Problem::Graph(format!(
                    "initializer `{}` is stored outside the file (external data)",
                    t.name
                ))));
            }
            initializers.insert(t.name.clone(), constant);
        }
        let mut nodes = Vec::with_capacity(graph.node.len());
        for (i, n) in graph.node.iter().enumerate() {
            let name = if n.name.is_empty() {
                format!("#{i}")
            } else {
                n.name.clone()
            };
            if !(n.domain.is_empty() || n.domain == "ai.onnx") {
                return Err(err(Problem::Unsupported {
                    node: name,
                    op: format!("{}::{}", n.domain, n.op_type),
                }));
            }
            let mut attributes = BTreeMap::new();
            for a in &n.attribute {
                let value = match a.type_.value() {
                    ATTR_FLOAT => Attribute::Float(a.f),
                    ATTR_INT => Attribute::Int(a.i),
                    ATTR_FLOATS => Attribute::Floats(a.floats.clone()),
                    ATTR_INTS => Attribute::Ints(a.ints.clone()),
                    ATTR_STRING => Attribute::String(String::from_utf8_lossy(&a.s).into_owned()),
                    ATTR_TENSOR => {
                        let t = a.t.as_ref().ok_or_else(|| {
                            err(Problem::Graph(format!(
                                "node `{name}`: empty tensor attribute"
                            )))
                        })?;
                        let what = format!("{name}.{}", a.name);
                        Attribute::Tensor(
                            tensor(&what, t.data_type, &t.dims, || {
                                (
                                    t.float_data.clone(),
                                    t.int64_data.clone(),
                                    t.raw_data.to_vec(),
                                )
                            })
                            .map_err(err)?,
                        )
                    }
                    other => Attribute::Other(other),
                };
                attributes.insert(a.name.clone(), value);
            }
            nodes.push(Node {
                name,
                op: n.op_type.clone(),
                inputs: n.input.clone(),
                outputs: n.output.clone(),
                attributes,
            });
        }
        let inputs: Vec<_> = graph
            .input
            .iter()
            .filter(|v| !initializers.contains_key(&v.name))
            .collect();
        let [input] = inputs.as_slice() else {
            return Err(err(Problem::Graph(format!(
                "{} graph inputs besides the initializers, expected one",
                inputs.len()
            ))));
        };
        let dims = input
            .type_
            .tensor_type()
            .shape
            .dim
            .iter()
            .map(|d| {
                if d.has_dim_value() && d.dim_value() > 0 {
                    Dim::Fixed(d.dim_value() as usize)
                } else {
                    Dim::Named(d.dim_param().to_string())
                }
            })
            .collect();
        let [output] = graph.output.as_slice() else {
            return Err(err(Problem::Graph(format!(
                "{} graph outputs, expected one (the logits)",
                graph.output.len()
            ))));
        };
        Ok(Self {
            input: (input.name.clone(), dims),
            output: output.name.clone(),
            nodes,
            initializers,
            opset,
        })
    }
}

/// A `TensorProto`'s values (float32 or int64, inline or raw little-endian bytes).
fn tensor(
    name: &str,
    data_type: i32,
    dims: &[i64],
    fields: impl FnOnce() -> (Vec<f32>, Vec<i64>, Vec<u8>),
) -> Result<Constant, Problem> {
    let shape: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
    let len: usize = shape.iter().product();
    let (floats, ints, raw) = fields();
    let values = match data_type {
        FLOAT if raw.is_empty() => Values::F32(floats),
        FLOAT => Values::F32(
            raw.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        INT64 if raw.is_empty() => Values::I64(ints),
        INT64 => Values::I64(
            raw.chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
        ),
        other => {
            return Err(Problem::DataType {
                name: name.to_string(),
                code: other,
            });
        }
    };
    let found = match &values {
        Values::F32(v) => v.len(),
        Values::I64(v) => v.len(),
    };
    if found != len {
        return Err(Problem::Graph(format!(
            "tensor `{name}` of shape {shape:?} holds {found} values"
        )));
    }
    Ok(Constant { shape, values })
}
