//! The burn module of an ONNX model: its layers built through the
//! [`crate::models::builder::Builder`] under the file's initializer names, and a
//! forward pass that runs the [`Plan`]'s steps on the same kernels as the shipped models.

use crate::models::NetError;
use crate::models::builder::{Builder, Init};
use crate::models::kernels::{
    Cohort, ConvGeometry, Kernels, Pool, cohort_group_norm, cohort_layer_norm, pool,
};
use crate::models::layers::{Affine, Conv, Weight, gather_rows};
use crate::models::onnx::graph::Constant;
use crate::models::onnx::ops::Binary;
use crate::models::onnx::plan::{Kernel, Layer, Operand, Plan, Step};
use burn::module::{Module, Param};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use std::sync::Arc;

/// An ONNX graph as a network: its affine and convolutional layers (each shardable) and its
/// other float initializers as dense trainable tensors (`C × len`).
#[derive(Module, Debug)]
pub struct OnnxNet<B: Backend> {
    pub affines: Vec<Affine<B>>,
    pub convs: Vec<Conv<B>>,
    pub tensors: Vec<Param<Tensor<B, 2>>>,
    #[module(skip)]
    pub plan: Arc<Plan>,
}

/// An activation of rank 1 to 4 (the batch first).
#[derive(Debug, Clone)]
enum Act<B: Backend> {
    R1(Tensor<B, 1>),
    R2(Tensor<B, 2>),
    R3(Tensor<B, 3>),
    R4(Tensor<B, 4>),
}

macro_rules! each {
    ($act:expr, $t:ident => $e:expr) => {
        match $act {
            Act::R1($t) => Act::R1($e),
            Act::R2($t) => Act::R2($e),
            Act::R3($t) => Act::R3($e),
            Act::R4($t) => Act::R4($e),
        }
    };
}

mod norm;
mod unary;
mod window;

impl<B: Backend> Act<B> {
    fn dims(&self) -> Vec<usize> {
        match self {
            Act::R1(t) => t.dims().to_vec(),
            Act::R2(t) => t.dims().to_vec(),
            Act::R3(t) => t.dims().to_vec(),
            Act::R4(t) => t.dims().to_vec(),
        }
    }

    fn reshape(self, dims: &[usize]) -> Self {
        let d = |i: usize| dims[i] as i32;
        macro_rules! to {
            ($t:expr) => {
                match dims.len() {
                    1 => Act::R1($t.reshape([d(0)])),
                    2 => Act::R2($t.reshape([d(0), d(1)])),
                    3 => Act::R3($t.reshape([d(0), d(1), d(2)])),
                    4 => Act::R4($t.reshape([d(0), d(1), d(2), d(3)])),
                    r => panic!("rank {r} activations are refused by the plan"),
                }
            };
        }
        match self {
            Act::R1(t) => to!(t),
            Act::R2(t) => to!(t),
            Act::R3(t) => to!(t),
            Act::R4(t) => to!(t),
        }
    }

    fn rank(&self) -> usize {
        self.dims().len()
    }

    /// `self` padded with leading ones to `rank`.
    fn padded_to(self, rank: usize) -> Self {
        let mut dims = self.dims();
        while dims.len() < rank {
            dims.insert(0, 1);
        }
        self.reshape(&dims)
    }

    fn binary(self, other: Self, op: Binary) -> Self {
        let rank = self.rank().max(other.rank());
        let (a, b) = (self.padded_to(rank), other.padded_to(rank));
        macro_rules! apply {
            ($x:expr, $y:expr, $v:ident) => {
                Act::$v(match op {
                    Binary::Add => $x + $y,
                    Binary::Sub => $x - $y,
                    Binary::Mul => $x * $y,
                    Binary::Div => $x / $y,
                })
            };
        }
        match (a, b) {
            (Act::R1(x), Act::R1(y)) => apply!(x, y, R1),
            (Act::R2(x), Act::R2(y)) => apply!(x, y, R2),
            (Act::R3(x), Act::R3(y)) => apply!(x, y, R3),
            (Act::R4(x), Act::R4(y)) => apply!(x, y, R4),
            _ => unreachable!("both operands were brought to one rank"),
        }
    }
}

impl<B: Kernels> OnnxNet<B> {
    /// Builds the plan's layers through `b`: every Gemm/MatMul and Conv weight shardable, the
    /// other float initializers dense.
    pub fn new(b: &mut Builder<B>, plan: Arc<Plan>) -> Result<Self, NetError> {
        norm::check_backend::<B>(&plan)?;
        let (mut affines, mut convs) = (Vec::new(), Vec::new());
        for layer in &plan.layers {
            match layer {
                Layer::Affine {
                    weight,
                    bias,
                    c_in,
                    c_out,
                    ..
                } => {
                    b.at_positions(1);
                    affines.push(b.affine_named(weight, bias.as_deref(), *c_in, *c_out, true)?);
                }
                Layer::Conv {
                    weight,
                    bias,
                    c_in,
                    c_out,
                    window,
                    positions,
                } => {
                    b.at_positions(*positions);
                    let geometry = ConvGeometry {
                        kernel: window.kernel,
                        stride: window.stride,
                        padding: window.padding,
                    };
                    convs.push(b.conv_named(
                        weight,
                        bias.as_deref(),
                        *c_in,
                        *c_out,
                        geometry,
                        true,
                    )?);
                }
            }
        }
        b.at_positions(1);
        let tensors = plan
            .tensors
            .iter()
            .map(|(name, shape)| b.tensor(name, shape, Init::Zeros))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            affines,
            convs,
            tensors,
            plan,
        })
    }

    /// Logits, one row per sample, of `x` (`N × features`, the input flattened).
    pub fn forward(&self, x: Tensor<B, 2>, cohort: &Cohort) -> Tensor<B, 2> {
        let n = x.dims()[0];
        let mut slots: Vec<Option<Act<B>>> = vec![None; self.plan.slots];
        let input: Vec<usize> = std::iter::once(n)
            .chain(self.plan.input_tail.iter().copied())
            .collect();
        slots[0] = Some(Act::R2(x).reshape(&input));
        for step in &self.plan.steps {
            let out = self.step(step, &slots, n, cohort);
            slots[step.output] = Some(out);
        }
        match slots[self.plan.output].take() {
            Some(Act::R2(t)) => t,
            Some(other) => match other.reshape(&[n, self.plan.classes]) {
                Act::R2(t) => t,
                _ => unreachable!("reshaped to rank 2"),
            },
            None => unreachable!("the plan computes its output"),
        }
    }

    fn slot(slots: &[Option<Act<B>>], i: usize) -> Act<B> {
        slots[i]
            .clone()
            .expect("the plan computes each slot before it is read")
    }

    /// Operand `o` as a tensor that broadcasts against the batch's activations (rank at most
    /// `rank`): a dense tensor per client is gathered to one row per sample of a cohort.
    fn operand(
        &self,
        o: &Operand,
        slots: &[Option<Act<B>>],
        [n, rank]: [usize; 2],
        cohort: &Cohort,
    ) -> Act<B> {
        match o {
            Operand::Act(i) => Self::slot(slots, *i),
            Operand::Tensor { index, shape } => {
                let p = self.tensors[*index].val();
                if p.dims()[0] == 1 {
                    let flat = p.dims()[1];
                    return Act::R2(p).reshape(&[flat]).reshape(shape);
                }
                // One row per sample, then the shape after the batch (a leading 1 of `shape`
                // stands for the batch).
                let rows = gather_rows(p, cohort);
                let skip = usize::from(shape.len() >= rank);
                let mut dims = vec![n];
                dims.resize(rank - (shape.len() - skip), 1);
                dims.extend_from_slice(&shape[skip..]);
                Act::R2(rows).reshape(&dims)
            }
            Operand::Const(c) => constant(c, &self.device()),
        }
    }

    fn layer_index(&self, layer: usize) -> usize {
        // Affine and convolutional layers are pushed in plan order into their own vectors.
        let kind = |l: &Layer| matches!(l, Layer::Affine { .. });
        let is_affine = kind(&self.plan.layers[layer]);
        self.plan.layers[..layer]
            .iter()
            .filter(|l| kind(l) == is_affine)
            .count()
    }

    fn step(&self, step: &Step, slots: &[Option<Act<B>>], n: usize, c: &Cohort) -> Act<B> {
        let rank = step.tail.len() + 1;
        let input = |i: usize| self.operand(&step.inputs[i], slots, [n, rank], c);
        match &step.kernel {
            Kernel::Affine(l) => {
                let layer = &self.affines[self.layer_index(*l)];
                each!(input(0), t => layer.forward(t, c))
            }
            Kernel::Conv(l) => match input(0) {
                Act::R4(t) => Act::R4(self.convs[self.layer_index(*l)].forward(t, c)),
                _ => unreachable!("the plan checks a convolution's input is NCHW"),
            },
            Kernel::Binary(op) => input(0).binary(input(1), *op),
            Kernel::Relu => each!(input(0), t => relu(t)),
            Kernel::Erf => each!(input(0), t => t.erf()),
            Kernel::Reshape(tail) => {
                let dims: Vec<usize> = std::iter::once(n).chain(tail.iter().copied()).collect();
                input(0).reshape(&dims)
            }
            Kernel::MaxPool(k) | Kernel::AveragePool(k) => {
                let kind = if matches!(step.kernel, Kernel::MaxPool(_)) {
                    Pool::Max
                } else {
                    Pool::Average
                };
                match input(0) {
                    Act::R4(t) => Act::R4(pool(t, kind, *k)),
                    _ => unreachable!("the plan checks a pooling's input is NCHW"),
                }
            }
            Kernel::GlobalAveragePool => match input(0) {
                Act::R4(t) => Act::R4(t.mean_dim(3).mean_dim(2)),
                _ => unreachable!("the plan checks a pooling's input is NCHW"),
            },
            Kernel::Mean(axes) => {
                let mut x = input(0);
                for &axis in axes {
                    x = each!(x, t => t.mean_dim(axis));
                }
                x
            }
            Kernel::GroupNorm { groups, relu } => match input(0) {
                Act::R4(t) => {
                    let [gamma, beta] = self.scale_and_bias(step);
                    Act::R4(cohort_group_norm(t, gamma, beta, *groups, *relu, c))
                }
                _ => unreachable!("the plan checks a GroupNorm's input is NCHW"),
            },
            Kernel::LayerNorm => {
                let [gamma, beta] = self.scale_and_bias(step);
                each!(input(0), t => cohort_layer_norm(t, gamma.clone(), beta.clone(), c))
            }
            Kernel::InstanceNormalization { epsilon } => {
                let x = input(0);
                let dims = x.dims();
                let channels = dims[1];
                let spatial: usize = dims[2..].iter().product();
                let Act::R3(t) = x.reshape(&[n, channels, spatial]) else {
                    unreachable!("reshaped to rank 3")
                };
                let (var, mean) = t.clone().var_mean_bias(2);
                let normed = (t - mean) / (var + *epsilon as f64).sqrt();
                // The plan views scale and bias as `C × 1` (per sample: `N × C × 1`).
                let scaled = Act::R3(normed)
                    .binary(self.operand(&step.inputs[1], slots, [n, 3], c), Binary::Mul)
                    .binary(self.operand(&step.inputs[2], slots, [n, 3], c), Binary::Add);
                scaled.reshape(&dims)
            }
            Kernel::Unary(u) => unary::apply(u, input(0)),
            Kernel::Norm(norm) => self.norm(norm, step, slots, n, c),
            Kernel::Pool {
                max,
                window,
                count_include_pad,
            } => window::pool(input(0), *max, window, *count_include_pad),
            Kernel::GroupedConv { window, groups } => {
                self.grouped_conv(input(0), step, window, *groups, c)
            }
        }
    }

    /// A GroupNorm's or LayerNorm's γ and β (`C × len`), as the shipped models' blocks pass
    /// them to the kernels.
    fn scale_and_bias(&self, step: &Step) -> [Tensor<B, 2>; 2] {
        [1, 2].map(|i| match &step.inputs[i] {
            Operand::Tensor { index, .. } => self.tensors[*index].val(),
            _ => unreachable!("the plan makes a norm's scale and bias dense tensors"),
        })
    }

    fn device(&self) -> B::Device {
        match (self.affines.first(), self.convs.first()) {
            (Some(a), _) => match &a.weight {
                Weight::Dense(w) => w.val().device(),
                Weight::Factorized(f) => f.u.val().device(),
            },
            (None, Some(conv)) => match &conv.weight {
                Weight::Dense(w) => w.val().device(),
                Weight::Factorized(f) => f.u.val().device(),
            },
            (None, None) => Default::default(),
        }
    }

    /// Every affine and convolutional weight.
    pub fn weights(&self) -> Vec<&Weight<B>> {
        self.affines
            .iter()
            .map(|a| &a.weight)
            .chain(self.convs.iter().map(|c| &c.weight))
            .collect()
    }
}

/// A float constant as an activation-shaped tensor (a scalar as `[1]`).
fn constant<B: Backend>(c: &Constant, device: &B::Device) -> Act<B> {
    let data = c
        .floats()
        .expect("the plan keeps float constants only")
        .to_vec();
    let len = data.len();
    let t = Tensor::<B, 1>::from_data(TensorData::new(data, [len]), device);
    let shape = if c.shape.is_empty() {
        vec![1]
    } else {
        c.shape.clone()
    };
    Act::R1(t).reshape(&shape)
}
