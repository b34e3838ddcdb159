//! A graph resolved against its input shape into [`Step`]s a network can run: every value is
//! known to be an activation (the batch first, then a fixed tail), a trainable initializer (a
//! [`Layer`]'s weight or bias, or a dense tensor viewed in some shape), a constant, or a shape
//! computed from the batch (`Shape`, `Gather`, `Unsqueeze`, `Concat` fold at load time).
//! Everything the interpreter cannot run is refused here, naming the node.

use crate::models::onnx::Problem;
use crate::models::onnx::graph::{Constant, Dim, Graph, Node, Values};
use crate::models::onnx::ops::{Binary, Op, Window};
use fedshard_protocol::model::ModelState;
use std::collections::{BTreeMap, HashMap};

mod binary;
mod fold;
pub(crate) mod initial;
mod norm;
mod unary;
mod window;

use binary::operand;
pub use norm::Norm;
pub use unary::Unary;

/// A layer the [`Builder`](crate::models::builder::Builder) makes, named by the file's
/// initializers.
#[derive(Debug, Clone, PartialEq)]
pub enum Layer {
    /// `y = W x + b` on the last dimension; the weight `c_out × c_in` (a `MatMul` or
    /// `transB = 0` weight, `transposed`, is held transposed: the file has it `c_in × c_out`).
    Affine {
        weight: String,
        bias: Option<String>,
        c_in: usize,
        c_out: usize,
        transposed: bool,
    },
    /// A convolution `c_in → c_out` at `positions` output positions.
    Conv {
        weight: String,
        bias: Option<String>,
        c_in: usize,
        c_out: usize,
        window: Window,
        positions: usize,
    },
}

impl Layer {
    /// The weight's name (the file's initializer).
    pub fn weight(&self) -> &str {
        match self {
            Layer::Affine { weight, .. } | Layer::Conv { weight, .. } => weight,
        }
    }
}

/// An input of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    /// An activation slot.
    Act(usize),
    /// Dense tensor `index` (of [`Plan::tensors`]) viewed with `shape` (no batch dimension).
    Tensor { index: usize, shape: Vec<usize> },
    /// A float constant.
    Const(Constant),
}

/// What a step computes.
#[derive(Debug, Clone, PartialEq)]
pub enum Kernel {
    /// Layer `index` of [`Plan::layers`] (an affine layer).
    Affine(usize),
    /// Layer `index` of [`Plan::layers`] (a convolution).
    Conv(usize),
    Binary(Binary),
    Relu,
    Erf,
    /// To the batch then `tail`.
    Reshape(Vec<usize>),
    MaxPool(usize),
    AveragePool(usize),
    GlobalAveragePool,
    /// A mean over these axes of the activation (never 0, the batch), keeping them as 1.
    Mean(Vec<usize>),
    InstanceNormalization {
        epsilon: f32,
    },
    /// The shipped GroupNorm (activation, γ, β), fused with the ReLU reading it when `relu`.
    GroupNorm {
        groups: usize,
        relu: bool,
    },
    /// The shipped models' LayerNorm over the last axis (the activation, γ, β).
    LayerNorm,
    /// An activation function, softmax or transposition (plan/unary.rs).
    Unary(Unary),
    /// A batch or layer normalisation; its scale and bias are inputs 1 and 2 (plan/norm.rs).
    Norm(Norm),
    /// Pooling of overlapping or padded windows (plan/window.rs).
    Pool {
        max: bool,
        window: Window,
        count_include_pad: bool,
    },
    /// A grouped or dilated convolution of dense tensors: the weight is input 1, the bias
    /// (if any) input 2 (plan/window.rs).
    GroupedConv {
        window: Window,
        groups: usize,
    },
}

/// One step: `output` slot ← kernel(inputs).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub kernel: Kernel,
    pub inputs: Vec<Operand>,
    pub output: usize,
    /// The output's dimensions after the batch.
    pub tail: Vec<usize>,
}

/// The resolved graph.
#[derive(Debug, Clone)]
pub struct Plan {
    pub input_name: String,
    /// The input's dimensions after the batch.
    pub input_tail: Vec<usize>,
    pub layers: Vec<Layer>,
    /// Dense trainable tensors: name and shape in the file.
    pub tensors: Vec<(String, Vec<usize>)>,
    pub steps: Vec<Step>,
    /// Activation slots (slot 0 is the input).
    pub slots: usize,
    pub output: usize,
    /// Classes: the output's width.
    pub classes: usize,
    /// The initial values of every trainable tensor, in the builder's layout.
    pub initial: ModelState,
}

/// What a value of the graph is, at load time.
#[derive(Debug, Clone)]
enum Value {
    Act {
        slot: usize,
        tail: Vec<usize>,
    },
    Tensor {
        index: usize,
        shape: Vec<usize>,
    },
    Const(Constant),
    /// Integers where `None` is the batch size; `scalar` for rank 0.
    Sym {
        values: Vec<Option<i64>>,
        scalar: bool,
    },
}

struct Resolver<'g> {
    graph: &'g Graph,
    values: HashMap<String, Value>,
    /// Initializers taken by a layer (never also a dense tensor).
    taken: HashMap<String, String>,
    tensor_index: BTreeMap<String, usize>,
    plan: Plan,
}

fn node_error(node: &Node, what: impl Into<String>) -> Problem {
    Problem::Node {
        node: node.name.clone(),
        op: node.op.clone(),
        what: what.into(),
    }
}

impl Plan {
    pub fn new(graph: &Graph) -> Result<Plan, Problem> {
        let (input_name, dims) = &graph.input;
        let mut tail = Vec::new();
        for (i, d) in dims.iter().enumerate() {
            match (i, d) {
                (0, _) => {}
                (_, Dim::Fixed(n)) => tail.push(*n),
                (_, Dim::Named(name)) => {
                    return Err(Problem::InputShape {
                        name: input_name.clone(),
                        found: format!("{dims:?}"),
                        expected: format!("fixed dimensions after the batch, not `{name}`"),
                    });
                }
            }
        }
        if tail.is_empty() {
            return Err(Problem::InputShape {
                name: input_name.clone(),
                found: format!("{dims:?}"),
                expected: "a batch dimension and features".into(),
            });
        }
        let mut r = Resolver {
            graph,
            values: HashMap::new(),
            taken: HashMap::new(),
            tensor_index: BTreeMap::new(),
            plan: Plan {
                input_name: input_name.clone(),
                input_tail: tail.clone(),
                layers: Vec::new(),
                tensors: Vec::new(),
                steps: Vec::new(),
                slots: 1,
                output: 0,
                classes: 0,
                initial: ModelState::new(Vec::new()).expect("an empty state"),
            },
        };
        r.values
            .insert(input_name.clone(), Value::Act { slot: 0, tail });
        for node in &graph.nodes {
            r.node(node)?;
        }
        r.final_softmax_as_log();
        match r.values.get(&graph.output) {
            Some(Value::Act { slot, tail }) if tail.len() == 1 => {
                r.plan.output = *slot;
                r.plan.classes = tail[0];
            }
            other => {
                return Err(Problem::Graph(format!(
                    "the output `{}` is {}, expected logits [N, classes]",
                    graph.output,
                    describe(other)
                )));
            }
        }
        r.plan.initial = r.initial()?;
        Ok(r.plan)
    }
}

fn describe(v: Option<&Value>) -> String {
    match v {
        None => "never computed".into(),
        Some(Value::Act { tail, .. }) => format!("an activation [N, {tail:?}]"),
        Some(Value::Tensor { shape, .. }) => format!("a parameter of shape {shape:?}"),
        Some(Value::Const(c)) => format!("a constant of shape {:?}", c.shape),
        Some(Value::Sym { .. }) => "a shape".into(),
    }
}

impl Resolver<'_> {
    /// The value `name` names: computed, or an initializer (a dense tensor when float).
    fn value(&mut self, node: &Node, name: &str) -> Result<Value, Problem> {
        if let Some(v) = self.values.get(name) {
            return Ok(v.clone());
        }
        let Some(c) = self.graph.initializers.get(name) else {
            return Err(node_error(
                node,
                format!("input `{name}` is never computed"),
            ));
        };
        let v = match c.values {
            // Integers (shapes, axes) and scalars (GELU's √2, ½, 1) are constants.
            Values::I64(_) => Value::Const(c.clone()),
            Values::F32(_) if c.shape.is_empty() => Value::Const(c.clone()),
            Values::F32(_) => {
                if let Some(layer) = self.taken.get(name) {
                    return Err(node_error(
                        node,
                        format!("initializer `{name}` is already the weight of `{layer}`"),
                    ));
                }
                let index = *self
                    .tensor_index
                    .entry(name.to_string())
                    .or_insert_with(|| {
                        self.plan.tensors.push((name.to_string(), c.shape.clone()));
                        self.plan.tensors.len() - 1
                    });
                Value::Tensor {
                    index,
                    shape: c.shape.clone(),
                }
            }
        };
        Ok(v)
    }

    /// A float initializer that becomes a layer's weight or bias.
    fn take(&mut self, node: &Node, name: &str) -> Result<&Constant, Problem> {
        let c = self.graph.initializers.get(name).ok_or_else(|| {
            node_error(
                node,
                format!("`{name}` is no initializer: only constant weights"),
            )
        })?;
        if c.floats().is_none() {
            return Err(node_error(node, format!("`{name}` is not float32")));
        }
        if self.tensor_index.contains_key(name) || self.taken.contains_key(name) {
            return Err(node_error(
                node,
                format!("initializer `{name}` is used by more than one node (tied weights)"),
            ));
        }
        self.taken.insert(name.to_string(), node.name.clone());
        Ok(c)
    }

    fn act(&mut self, node: &Node, i: usize) -> Result<(usize, Vec<usize>), Problem> {
        let name = node
            .inputs
            .get(i)
            .ok_or_else(|| node_error(node, format!("missing input {i}")))?;
        match self.value(node, name)? {
            Value::Act { slot, tail } => Ok((slot, tail)),
            other => Err(node_error(
                node,
                format!(
                    "input `{name}` is {}, expected an activation",
                    describe(Some(&other))
                ),
            )),
        }
    }

    fn emit(&mut self, node: &Node, kernel: Kernel, inputs: Vec<Operand>, tail: Vec<usize>) {
        let output = self.plan.slots;
        self.plan.slots += 1;
        self.plan.steps.push(Step {
            kernel,
            inputs,
            output,
            tail: tail.clone(),
        });
        self.set(node, Value::Act { slot: output, tail });
    }

    fn set(&mut self, node: &Node, v: Value) {
        if let Some(out) = node.outputs.first() {
            self.values.insert(out.clone(), v);
        }
    }

    fn node(&mut self, node: &Node) -> Result<(), Problem> {
        let kernel = match node.op.as_str() {
            "Conv" => node
                .inputs
                .get(1)
                .and_then(|w| self.graph.initializers.get(w))
                .filter(|w| w.shape.len() == 4)
                .map(|w| [w.shape[2], w.shape[3]]),
            _ => None,
        };
        match Op::parse(node, kernel)? {
            Op::Gemm { trans_b } => self.affine(node, trans_b, node.inputs.get(2)),
            Op::MatMul => self.affine(node, false, None),
            Op::Conv { window, groups } if groups == 1 && window.dilation == [1, 1] => {
                self.conv(node, window)
            }
            Op::Conv { window, groups } => self.grouped_conv(node, window, groups),
            Op::LeakyRelu { alpha } => self.unary(node, Kernel::Unary(Unary::LeakyRelu(alpha))),
            Op::Gelu { tanh } => self.unary(node, Kernel::Unary(Unary::Gelu { tanh })),
            Op::Sigmoid => self.unary(node, Kernel::Unary(Unary::Sigmoid)),
            Op::Tanh => self.unary(node, Kernel::Unary(Unary::Tanh)),
            Op::Softmax { axis, log } => self.softmax(node, axis, log),
            Op::Transpose { perm } => self.transpose(node, perm),
            Op::Squeeze { axes } => self.squeeze(node, axes),
            Op::Dropout => self.dropout(node),
            Op::BatchNormalization { epsilon } => self.batch_norm(node, epsilon),
            Op::LayerNormalization { axis, epsilon } => self.layer_norm(node, axis, epsilon),
            Op::GroupNormalization { groups, epsilon } => self.group_norm(node, groups, epsilon),
            Op::Relu => self.relu(node),
            Op::Erf => self.unary(node, Kernel::Erf),
            Op::Identity => {
                let v = self.value(node, &node.inputs[0])?;
                self.set(node, v);
                Ok(())
            }
            Op::Flatten => {
                let (slot, tail) = self.act(node, 0)?;
                let flat = vec![tail.iter().product()];
                self.emit(
                    node,
                    Kernel::Reshape(flat.clone()),
                    vec![Operand::Act(slot)],
                    flat,
                );
                Ok(())
            }
            Op::MaxPool(w) | Op::AveragePool { window: w, .. } if w.disjoint() => {
                let (slot, tail) = self.act(node, 0)?;
                let k = w.kernel[0];
                let [c, h, wd] = tail[..] else {
                    return Err(node_error(node, format!("input [N, {tail:?}] is not NCHW")));
                };
                if h % k != 0 || wd % k != 0 {
                    return Err(node_error(
                        node,
                        format!("{h}×{wd} is not a multiple of {k}"),
                    ));
                }
                let kernel = if node.op == "MaxPool" {
                    Kernel::MaxPool(k)
                } else {
                    Kernel::AveragePool(k)
                };
                self.emit(
                    node,
                    kernel,
                    vec![Operand::Act(slot)],
                    vec![c, h / k, wd / k],
                );
                Ok(())
            }
            Op::GlobalAveragePool => {
                let (slot, tail) = self.act(node, 0)?;
                if tail.len() != 3 {
                    return Err(node_error(node, format!("input [N, {tail:?}] is not NCHW")));
                }
                let out = vec![tail[0], 1, 1];
                self.emit(
                    node,
                    Kernel::GlobalAveragePool,
                    vec![Operand::Act(slot)],
                    out,
                );
                Ok(())
            }
            Op::MaxPool(w) => self.pool(node, w, true, false),
            Op::AveragePool {
                window,
                count_include_pad,
            } => self.pool(node, window, false, count_include_pad),
            Op::ReduceMean { axes, keep_dims } => self.reduce_mean(node, axes, keep_dims),
            Op::Binary(op) => self.binary(node, op),
            Op::Reshape { allow_zero } => {
                if allow_zero && self.sym(node, 1)?.contains(&Some(0)) {
                    return Err(node_error(node, "a zero dimension (allowzero = 1)"));
                }
                self.reshape(node)
            }
            Op::InstanceNormalization { epsilon } => {
                let (slot, tail) = self.act(node, 0)?;
                let mut inputs = vec![Operand::Act(slot)];
                for i in [1, 2] {
                    // An initializer here is a constant: PyTorch's GroupNorm export feeds
                    // fixed ones and zeros, its γ and β follow in a Mul and an Add.
                    let v = match self.graph.initializers.get(&node.inputs[i]) {
                        Some(c) if c.floats().is_some() => Value::Const(c.clone()),
                        _ => self.value(node, &node.inputs[i])?,
                    };
                    match operand(v) {
                        // Viewed as `C × 1` against the normalised `N × C × (spatial)`.
                        Some(Operand::Tensor { index, shape }) if shape == [tail[0]] => inputs
                            .push(Operand::Tensor {
                                index,
                                shape: vec![tail[0], 1],
                            }),
                        Some(Operand::Const(c)) if c.shape == [tail[0]] => {
                            inputs.push(Operand::Const(Constant {
                                shape: vec![tail[0], 1],
                                ..c
                            }))
                        }
                        _ => {
                            return Err(node_error(
                                node,
                                format!("input {i} is not [{}]", tail[0]),
                            ));
                        }
                    }
                }
                self.emit(
                    node,
                    Kernel::InstanceNormalization { epsilon },
                    inputs,
                    tail,
                );
                Ok(())
            }
            Op::Constant(c) => {
                self.set(node, Value::Const(c));
                Ok(())
            }
            Op::Shape { start, end } => self.shape(node, start, end),
            Op::Gather { axis } => self.gather(node, axis),
            Op::Unsqueeze { axes } => self.unsqueeze(node, axes),
            Op::Concat { axis } => self.concat(node, axis),
        }
    }

    fn reduce_mean(
        &mut self,
        node: &Node,
        axes: Option<Vec<i64>>,
        keep_dims: bool,
    ) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let axes = match axes {
            Some(a) => a,
            None if node.inputs.len() > 1 => self
                .sym(node, 1)?
                .into_iter()
                .map(|a| a.ok_or_else(|| node_error(node, "axes depend on the batch")))
                .collect::<Result<_, _>>()?,
            None => return Err(node_error(node, "a mean over every axis mixes the batch")),
        };
        let rank = tail.len() as i64 + 1;
        let mut axes: Vec<usize> = axes
            .iter()
            .map(|&a| if a < 0 { a + rank } else { a })
            .map(|a| match a {
                1.. if a < rank => Ok(a as usize),
                _ => Err(node_error(
                    node,
                    format!("axis {a}: only axes after the batch"),
                )),
            })
            .collect::<Result<_, _>>()?;
        axes.sort();
        axes.dedup();
        let kept: Vec<usize> = (1..=tail.len())
            .map(|i| if axes.contains(&i) { 1 } else { tail[i - 1] })
            .collect();
        if tail.len() - axes.len() + 1 > 4 && !keep_dims {
            return Err(node_error(node, "rank above 4"));
        }
        self.emit(
            node,
            Kernel::Mean(axes.clone()),
            vec![Operand::Act(slot)],
            kept,
        );
        if !keep_dims {
            let out: Vec<usize> = (1..=tail.len())
                .filter(|i| !axes.contains(i))
                .map(|i| tail[i - 1])
                .collect();
            let mean = Operand::Act(self.plan.slots - 1);
            self.emit(node, Kernel::Reshape(out.clone()), vec![mean], out);
        }
        Ok(())
    }

    fn affine(&mut self, node: &Node, trans_b: bool, bias: Option<&String>) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        if node.op == "Gemm" && tail.len() != 1 {
            return Err(node_error(
                node,
                format!("input [N, {tail:?}] is not a matrix"),
            ));
        }
        let weight = node.inputs[1].clone();
        let w = self.take(node, &weight)?;
        let [rows, cols] = w.shape[..] else {
            return Err(node_error(
                node,
                format!("weight `{weight}` is not a matrix"),
            ));
        };
        let (c_out, c_in) = if trans_b { (rows, cols) } else { (cols, rows) };
        let width = *tail.last().expect("an activation has a tail");
        if c_in != width {
            return Err(node_error(
                node,
                format!("weight `{weight}` takes {c_in} features, the input has {width}"),
            ));
        }
        let bias = match bias.filter(|b| !b.is_empty()) {
            None => None,
            Some(b) => {
                let c = self.take(node, b)?;
                if c.shape.iter().product::<usize>() != c_out || c.shape.last() != Some(&c_out) {
                    return Err(node_error(node, format!("bias `{b}` is not [{c_out}]")));
                }
                Some(b.clone())
            }
        };
        let index = self.plan.layers.len();
        self.plan.layers.push(Layer::Affine {
            weight,
            bias,
            c_in,
            c_out,
            transposed: !trans_b,
        });
        let mut out = tail;
        *out.last_mut().expect("a tail") = c_out;
        self.emit(node, Kernel::Affine(index), vec![Operand::Act(slot)], out);
        Ok(())
    }

    fn conv(&mut self, node: &Node, window: Window) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let [c, h, w] = tail[..] else {
            return Err(node_error(node, format!("input [N, {tail:?}] is not NCHW")));
        };
        let weight = node.inputs[1].clone();
        let wt = self.take(node, &weight)?;
        let [c_out, c_in, kh, kw] = wt.shape[..] else {
            return Err(node_error(node, format!("weight `{weight}` is not 4-D")));
        };
        if c_in != c || [kh, kw] != window.kernel {
            return Err(node_error(
                node,
                format!(
                    "weight `{weight}` {:?} does not fit input channels {c}",
                    wt.shape
                ),
            ));
        }
        let bias = match node.inputs.get(2).filter(|b| !b.is_empty()) {
            None => None,
            Some(b) => {
                let b = b.clone();
                if self.take(node, &b)?.shape != [c_out] {
                    return Err(node_error(node, format!("bias `{b}` is not [{c_out}]")));
                }
                Some(b)
            }
        };
        let side = |len: usize, i: usize| {
            (len + 2 * window.padding[i])
                .checked_sub(window.kernel[i])
                .map(|d| d / window.stride[i] + 1)
        };
        let (Some(oh), Some(ow)) = (side(h, 0), side(w, 1)) else {
            return Err(node_error(
                node,
                format!("the kernel exceeds the {h}×{w} input"),
            ));
        };
        let index = self.plan.layers.len();
        self.plan.layers.push(Layer::Conv {
            weight,
            bias,
            c_in,
            c_out,
            window,
            positions: oh * ow,
        });
        self.emit(
            node,
            Kernel::Conv(index),
            vec![Operand::Act(slot)],
            vec![c_out, oh, ow],
        );
        Ok(())
    }
}
