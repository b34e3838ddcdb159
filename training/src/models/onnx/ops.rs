//! The operators the loader interprets, each parsed from a [`Node`] with its attributes
//! checked: anything else is refused before a run, naming the node, its operator and what is
//! supported.

use crate::models::onnx::Problem;
use crate::models::onnx::graph::{Attribute, Constant, Node, Values};

/// The supported operators, as the refusal lists them.
pub const SUPPORTED: &[&str] = &[
    "Add",
    "AveragePool",
    "BatchNormalization",
    "Concat",
    "Constant",
    "Conv",
    "Div",
    "Dropout",
    "Erf",
    "Flatten",
    "Gather",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GroupNormalization",
    "Identity",
    "InstanceNormalization",
    "LayerNormalization",
    "LeakyRelu",
    "LogSoftmax",
    "MatMul",
    "MaxPool",
    "Mul",
    "Relu",
    "ReduceMean",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Softmax",
    "Squeeze",
    "Sub",
    "Tanh",
    "Transpose",
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

/// A 2-D window: kernel, stride, symmetric zero padding per side and dilation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Window {
    /// Whether the window pools disjoint blocks (the fused pooling kernels' case).
    pub fn disjoint(&self) -> bool {
        self.kernel[0] == self.kernel[1]
            && self.stride == self.kernel
            && self.padding == [0, 0]
            && self.dilation == [1, 1]
    }

    /// Output positions along side `i` of length `len`, if the window fits.
    pub fn side(&self, len: usize, i: usize) -> Option<usize> {
        let span = self.dilation[i] * (self.kernel[i] - 1) + 1;
        (len + 2 * self.padding[i])
            .checked_sub(span)
            .map(|d| d / self.stride[i] + 1)
    }
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
    /// `max(x, 0) + alpha · min(x, 0)`.
    LeakyRelu {
        alpha: f32,
    },
    /// Opset 20's `Gelu`: exact (erf) or `approximate = "tanh"`.
    Gelu {
        tanh: bool,
    },
    Sigmoid,
    Tanh,
    /// `Softmax` or (`log`) `LogSoftmax` along one axis (opset 13's semantics).
    Softmax {
        axis: i64,
        log: bool,
    },
    /// `perm` absent reverses the axes.
    Transpose {
        perm: Option<Vec<i64>>,
    },
    /// Axes from the attribute (before opset 13) or the second input.
    Squeeze {
        axes: Option<Vec<i64>>,
    },
    /// An identity: fedshard runs no dropout (docs/onnx.md).
    Dropout,
    Erf,
    Identity,
    /// Flattens to rank 2 at `axis` 1.
    Flatten,
    /// `allow_zero`: a 0 in the shape is a zero dimension, not a copy of the input's (the
    /// plan refuses a 0 then; without one the two readings agree).
    Reshape {
        allow_zero: bool,
    },
    /// A convolution of `groups` groups (1: a shardable layer).
    Conv {
        window: Window,
        groups: usize,
    },
    MaxPool(Window),
    /// `count_include_pad`: the padding's zeros count in each window's mean.
    AveragePool {
        window: Window,
        count_include_pad: bool,
    },
    GlobalAveragePool,
    InstanceNormalization {
        epsilon: f32,
    },
    /// Normalised by the batch's statistics, in training and evaluation (docs/onnx.md).
    BatchNormalization {
        epsilon: f32,
    },
    /// Normalised per sample over each of `groups` groups of channels (opset 21: scale and
    /// bias per channel).
    GroupNormalization {
        groups: usize,
        epsilon: f32,
    },
    /// Normalised over the axes from `axis` to the last.
    LayerNormalization {
        axis: i64,
        epsilon: f32,
    },
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

    /// The node's optional outputs after the first must be unused (`without` says which).
    fn one_output(&self, without: &str) -> Result<(), Problem> {
        if self.node.outputs.iter().skip(1).any(|o| !o.is_empty()) {
            return Err(self.bad(
                "outputs",
                format!("{} outputs", self.node.outputs.len()),
                &format!("one output ({without})"),
            ));
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
        let dilation = pair("dilations", self.ints("dilations")?, [1, 1])?;
        match self.node.attributes.get("auto_pad") {
            None => {}
            Some(Attribute::String(s)) if s == "NOTSET" => {}
            Some(other) => return Err(self.bad("auto_pad", format!("{other:?}"), "NOTSET")),
        }
        Ok(Window {
            kernel,
            stride,
            padding,
            dilation,
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
            "LeakyRelu" => Op::LeakyRelu {
                alpha: a.float("alpha", 0.01)?,
            },
            "Gelu" => {
                a.only(&["approximate"])?;
                let tanh = match node.attributes.get("approximate") {
                    None => false,
                    Some(Attribute::String(s)) if s == "none" => false,
                    Some(Attribute::String(s)) if s == "tanh" => true,
                    Some(other) => {
                        return Err(a.bad("approximate", format!("{other:?}"), "none, tanh"));
                    }
                };
                Op::Gelu { tanh }
            }
            "Sigmoid" => Op::Sigmoid,
            "Tanh" => Op::Tanh,
            "Softmax" | "LogSoftmax" => {
                a.only(&["axis"])?;
                Op::Softmax {
                    axis: a.int("axis", -1)?,
                    log: node.op == "LogSoftmax",
                }
            }
            "Transpose" => {
                a.only(&["perm"])?;
                Op::Transpose {
                    perm: a.ints("perm")?,
                }
            }
            "Squeeze" => {
                a.only(&["axes"])?;
                Op::Squeeze {
                    axes: a.ints("axes")?,
                }
            }
            "Dropout" => {
                a.only(&["seed", "ratio", "is_test"])?;
                // The mask output would have to be a real mask; dropout in training mode a
                // random one (fedshard runs Dropout as an identity, docs/onnx.md).
                if node.outputs.get(1).is_some_and(|m| !m.is_empty()) {
                    return Err(a.bad("outputs", "a mask".into(), "one output"));
                }
                Op::Dropout
            }
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
                let groups = a.int("group", 1)?;
                if groups < 1 {
                    return Err(a.bad("group", groups.to_string(), "a positive integer"));
                }
                Op::Conv {
                    window: a.window(kernel)?,
                    groups: groups as usize,
                }
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
                // Disjoint blocks run on the fused kernels, other windows on burn's pooling,
                // which dilates max pooling only.
                if node.op == "MaxPool" {
                    if node.outputs.len() > 1 {
                        return Err(a.bad("outputs", "Indices".into(), "one output"));
                    }
                    Op::MaxPool(w)
                } else {
                    if w.dilation != [1, 1] {
                        return Err(a.bad("dilations", format!("{:?}", w.dilation), "[1, 1]"));
                    }
                    Op::AveragePool {
                        window: w,
                        count_include_pad: a.int("count_include_pad", 0)? != 0,
                    }
                }
            }
            "GlobalAveragePool" => Op::GlobalAveragePool,
            "InstanceNormalization" => Op::InstanceNormalization {
                epsilon: a.float("epsilon", 1e-5)?,
            },
            "BatchNormalization" => {
                a.only(&["epsilon", "momentum", "training_mode", "spatial"])?;
                a.exactly("spatial", 1, 1)?;
                // Running statistics are not tracked (docs/onnx.md): no output carries them.
                a.one_output("no running mean and variance")?;
                Op::BatchNormalization {
                    epsilon: a.float("epsilon", 1e-5)?,
                }
            }
            "GroupNormalization" => {
                a.only(&["num_groups", "epsilon", "stash_type"])?;
                a.exactly("stash_type", 1, 1)?;
                let groups = a.int("num_groups", 0)?;
                if groups < 1 {
                    return Err(a.bad("num_groups", groups.to_string(), "a positive integer"));
                }
                Op::GroupNormalization {
                    groups: groups as usize,
                    epsilon: a.float("epsilon", 1e-5)?,
                }
            }
            "LayerNormalization" => {
                a.only(&["axis", "epsilon", "stash_type"])?;
                a.exactly("stash_type", 1, 1)?;
                a.one_output("no mean and inverse deviation")?;
                Op::LayerNormalization {
                    axis: a.int("axis", -1)?,
                    epsilon: a.float("epsilon", 1e-5)?,
                }
            }
            // `value`, or (opset 12) a scalar or list the dynamo exporter writes unoptimised.
            "Constant" => {
                a.only(&[
                    "value",
                    "value_int",
                    "value_ints",
                    "value_float",
                    "value_floats",
                ])?;
                let constant = |shape: Vec<usize>, values| Op::Constant(Constant { shape, values });
                match node.attributes.iter().next() {
                    Some((_, Attribute::Tensor(t))) => Op::Constant(t.clone()),
                    Some((_, Attribute::Int(i))) => constant(vec![], Values::I64(vec![*i])),
                    Some((_, Attribute::Ints(v))) => {
                        constant(vec![v.len()], Values::I64(v.clone()))
                    }
                    Some((_, Attribute::Float(f))) => constant(vec![], Values::F32(vec![*f])),
                    Some((_, Attribute::Floats(v))) => {
                        constant(vec![v.len()], Values::F32(v.clone()))
                    }
                    other => {
                        return Err(a.bad(
                            "value",
                            format!("{other:?}"),
                            "a tensor, int, ints, float or floats",
                        ));
                    }
                }
            }
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
