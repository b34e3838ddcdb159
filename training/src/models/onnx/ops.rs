//! The operators the loader interprets, each parsed from a [`Node`] with its attributes
//! checked: anything else is refused before a run, naming the node, its operator and what is
//! supported.

use crate::models::kernels::NORM_EPS;
use crate::models::onnx::Problem;
use crate::models::onnx::graph::{Attribute, Constant, Node};

/// The supported operators, as the refusal lists them.
pub const SUPPORTED: &[&str] = &[
    "Add",
    "AveragePool",
    "Concat",
    "Constant",
    "Conv",
    "Div",
    "Erf",
    "Flatten",
    "Gather",
    "Gemm",
    "GlobalAveragePool",
    "GroupNormalization",
    "Identity",
    "InstanceNormalization",
    "LayerNormalization",
    "MatMul",
    "MaxPool",
    "Mul",
    "Relu",
    "ReduceMean",
    "Reshape",
    "Shape",
    "Sub",
    "Unsqueeze",
];

/// An elementwise operator of two inputs (numpy broadcasting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

/// A 2-D window: kernel, stride and symmetric zero padding per side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

/// One supported operator with its attributes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `A · Bᵀ + C` (`transB = 1`) or `A · B + C`, α = β = 1, A not transposed.
    Gemm {
        trans_b: bool,
    },
    MatMul,
    Binary(Binary),
    Relu,
    Erf,
    Identity,
    /// Flattens to rank 2 at `axis` 1.
    Flatten,
    /// `allow_zero`: a 0 in the shape is a zero dimension, not a copy of the input's (the
    /// plan refuses a 0 then; without one the two readings agree).
    Reshape {
        allow_zero: bool,
    },
    Conv(Window),
    MaxPool(Window),
    AveragePool(Window),
    GlobalAveragePool,
    InstanceNormalization {
        epsilon: f32,
    },
    /// `groups` groups of channels, ε = [`NORM_EPS`] (the shipped models' GroupNorm).
    GroupNormalization {
        groups: usize,
    },
    /// Over the last axis, ε = [`NORM_EPS`] (the shipped models' LayerNorm).
    LayerNormalization,
    Constant(Constant),
    Shape {
        start: i64,
        end: Option<i64>,
    },
    /// A mean over `axes` (an attribute before opset 18, an input from it), never the batch.
    ReduceMean {
        axes: Option<Vec<i64>>,
        keep_dims: bool,
    },
    Gather {
        axis: i64,
    },
    Unsqueeze {
        axes: Option<Vec<i64>>,
    },
    Concat {
        axis: i64,
    },
}

/// Attribute access for one node, every failure naming the node and operator.
struct Attrs<'n> {
    node: &'n Node,
}

impl Attrs<'_> {
    fn bad(&self, attribute: &str, found: String, expected: &str) -> Problem {
        Problem::Attribute {
            node: self.node.name.clone(),
            op: self.node.op.clone(),
            attribute: attribute.to_string(),
            found,
            expected: expected.to_string(),
        }
    }

    fn int(&self, name: &str, default: i64) -> Result<i64, Problem> {
        match self.node.attributes.get(name) {
            None => Ok(default),
            Some(Attribute::Int(i)) => Ok(*i),
            Some(other) => Err(self.bad(name, format!("{other:?}"), "an integer")),
        }
    }

    fn float(&self, name: &str, default: f32) -> Result<f32, Problem> {
        match self.node.attributes.get(name) {
            None => Ok(default),
            Some(Attribute::Float(f)) => Ok(*f),
            Some(other) => Err(self.bad(name, format!("{other:?}"), "a float")),
        }
    }

    fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, Problem> {
        match self.node.attributes.get(name) {
            None => Ok(None),
            Some(Attribute::Ints(v)) => Ok(Some(v.clone())),
            Some(other) => Err(self.bad(name, format!("{other:?}"), "a list of integers")),
        }
    }

    /// An integer attribute that must equal `want` (its default when absent).
    fn exactly(&self, name: &str, default: i64, want: i64) -> Result<(), Problem> {
        let found = self.int(name, default)?;
        if found != want {
            return Err(self.bad(name, found.to_string(), &format!("{want}")));
        }
        Ok(())
    }

    /// Every attribute must be one of `known`.
    fn only(&self, known: &[&str]) -> Result<(), Problem> {
        match self
            .node
            .attributes
            .keys()
            .find(|k| !known.contains(&k.as_str()))
        {
            Some(k) => Err(self.bad(
                k,
                format!("{:?}", self.node.attributes[k]),
                &format!("no such attribute (supported: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// A convolution's or pooling's 2-D window; `kernel` from the weight when the attribute is
    /// absent (`Conv`).
    fn window(&self, kernel: Option<[usize; 2]>) -> Result<Window, Problem> {
        let pair = |name: &str, v: Option<Vec<i64>>, default: [usize; 2]| match v {
            None => Ok(default),
            Some(v) if v.len() == 2 && v.iter().all(|&x| x > 0) => {
                Ok([v[0] as usize, v[1] as usize])
            }
            Some(v) => Err(self.bad(name, format!("{v:?}"), "two positive integers (2-D)")),
        };
        let kernel = match (self.ints("kernel_shape")?, kernel) {
            (Some(v), _) => pair("kernel_shape", Some(v), [0, 0])?,
            (None, Some(k)) => k,
            (None, None) => return Err(self.bad("kernel_shape", "absent".into(), "2-D kernel")),
        };
        let stride = pair("strides", self.ints("strides")?, [1, 1])?;
        let padding = match self.ints("pads")? {
            None => [0, 0],
            Some(p)
                if p.len() == 4 && p[0] == p[2] && p[1] == p[3] && p.iter().all(|&x| x >= 0) =>
            {
                [p[0] as usize, p[1] as usize]
            }
            Some(p) => {
                return Err(self.bad("pads", format!("{p:?}"), "symmetric [t, l, t, l]"));
            }
        };
        if let Some(d) = self.ints("dilations")?
            && d.iter().any(|&x| x != 1)
        {
            return Err(self.bad("dilations", format!("{d:?}"), "[1, 1]"));
        }
        match self.node.attributes.get("auto_pad") {
            None => {}
            Some(Attribute::String(s)) if s == "NOTSET" => {}
            Some(other) => return Err(self.bad("auto_pad", format!("{other:?}"), "NOTSET")),
        }
        Ok(Window {
            kernel,
            stride,
            padding,
        })
    }
}

impl Op {
    /// Parses `node`; `kernel` is the convolution weight's spatial shape when it is known.
    pub fn parse(node: &Node, kernel: Option<[usize; 2]>) -> Result<Op, Problem> {
        let a = Attrs { node };
        let op = match node.op.as_str() {
            "Gemm" => {
                a.only(&["alpha", "beta", "transA", "transB"])?;
                if a.float("alpha", 1.0)? != 1.0 {
                    return Err(a.bad("alpha", a.float("alpha", 1.0)?.to_string(), "1"));
                }
                if a.float("beta", 1.0)? != 1.0 {
                    return Err(a.bad("beta", a.float("beta", 1.0)?.to_string(), "1"));
                }
                a.exactly("transA", 0, 0)?;
                Op::Gemm {
                    trans_b: a.int("transB", 0)? != 0,
                }
            }
            "MatMul" => Op::MatMul,
            "Add" => Op::Binary(Binary::Add),
            "Sub" => Op::Binary(Binary::Sub),
            "Mul" => Op::Binary(Binary::Mul),
            "Div" => Op::Binary(Binary::Div),
            "Relu" => Op::Relu,
            "Erf" => Op::Erf,
            "Identity" => Op::Identity,
            "Flatten" => {
                a.exactly("axis", 1, 1)?;
                Op::Flatten
            }
            "Reshape" => Op::Reshape {
                allow_zero: a.int("allowzero", 0)? != 0,
            },
            "Conv" => {
                a.only(&[
                    "auto_pad",
                    "dilations",
                    "group",
                    "kernel_shape",
                    "pads",
                    "strides",
                ])?;
                a.exactly("group", 1, 1)?;
                Op::Conv(a.window(kernel)?)
            }
            "MaxPool" | "AveragePool" => {
                a.only(&[
                    "auto_pad",
                    "ceil_mode",
                    "count_include_pad",
                    "dilations",
                    "kernel_shape",
                    "pads",
                    "strides",
                    "storage_order",
                ])?;
                a.exactly("ceil_mode", 0, 0)?;
                a.exactly("storage_order", 0, 0)?;
                let w = a.window(None)?;
                // The kernels pool disjoint square blocks.
                if w.kernel[0] != w.kernel[1] || w.stride != w.kernel || w.padding != [0, 0] {
                    return Err(a.bad(
                        "kernel_shape",
                        format!("{w:?}"),
                        "a square kernel, strides equal to it and no padding",
                    ));
                }
                if node.op == "MaxPool" {
                    if node.outputs.len() > 1 {
                        return Err(a.bad("outputs", "Indices".into(), "one output"));
                    }
                    Op::MaxPool(w)
                } else {
                    Op::AveragePool(w)
                }
            }
            "GlobalAveragePool" => Op::GlobalAveragePool,
            "InstanceNormalization" => Op::InstanceNormalization {
                epsilon: a.float("epsilon", 1e-5)?,
            },
            "GroupNormalization" | "LayerNormalization" => norm(&a)?,
            "Constant" => match node.attributes.get("value") {
                Some(Attribute::Tensor(t)) => Op::Constant(t.clone()),
                other => {
                    return Err(a.bad("value", format!("{other:?}"), "a tensor `value`"));
                }
            },
            "Shape" => {
                a.only(&["start", "end"])?;
                Op::Shape {
                    start: a.int("start", 0)?,
                    end: match node.attributes.get("end") {
                        None => None,
                        Some(_) => Some(a.int("end", 0)?),
                    },
                }
            }
            "ReduceMean" => {
                a.only(&["axes", "keepdims", "noop_with_empty_axes"])?;
                a.exactly("noop_with_empty_axes", 0, 0)?;
                Op::ReduceMean {
                    axes: a.ints("axes")?,
                    keep_dims: a.int("keepdims", 1)? != 0,
                }
            }
            "Gather" => Op::Gather {
                axis: a.int("axis", 0)?,
            },
            "Unsqueeze" => Op::Unsqueeze {
                axes: a.ints("axes")?,
            },
            "Concat" => Op::Concat {
                axis: a.int("axis", 0)?,
            },
            _ => {
                return Err(Problem::Unsupported {
                    node: node.name.clone(),
                    op: node.op.clone(),
                });
            }
        };
        Ok(op)
    }
}

/// `GroupNormalization` or `LayerNormalization`: they run on the shipped models' GroupNorm and
/// LayerNorm kernels, whose ε is fixed at [`NORM_EPS`] (PyTorch's default), in float32.
fn norm(a: &Attrs) -> Result<Op, Problem> {
    let group = a.node.op == "GroupNormalization";
    if group {
        a.only(&["epsilon", "num_groups", "stash_type"])?;
    } else {
        a.only(&["axis", "epsilon", "stash_type"])?;
        a.exactly("axis", -1, -1)?;
    }
    let epsilon = a.float("epsilon", 1e-5)?;
    if epsilon != NORM_EPS {
        return Err(a.bad("epsilon", epsilon.to_string(), &NORM_EPS.to_string()));
    }
    a.exactly("stash_type", 1, 1)?;
    if a.node.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(a.bad("outputs", "Mean, InvStdDev".into(), "one output"));
    }
    if !group {
        return Ok(Op::LayerNormalization);
    }
    match a.int("num_groups", 0)? {
        g if g > 0 => Ok(Op::GroupNormalization { groups: g as usize }),
        g => Err(a.bad("num_groups", g.to_string(), "a positive integer")),
    }
}
