//! Fused kernels for the hot spots of transformer training: GPT-2's GELU, layer normalisation,
//! the linear layer and multi-head (causal) attention, each with a hand-written backward pass.
//!
//! Why: written with burn's tensor operations, each of these is a chain of 5–10 element-wise
//! passes forward and as many again backward, every pass allocating a fresh tensor. On the CPU
//! backend that chain, not the matrix products, dominated a char-transformer step, and
//! burn-ndarray's matmul copied every transposed operand first. Here each element-wise kernel is
//! one pass forward and one backward over contiguous rows, and the products read transposes and
//! per-head column bands in place.
//!
//! [`Kernels`] is a backend extension: the CPU backend ([`NdArray`]) runs the fused loops, and
//! [`Autodiff`] records one graph node per kernel whose backward pass calls the inner
//! backend's backward kernel. Any other backend (CUDA) gets the [`composite`] versions, which are
//! the same functions written with burn's tensor operations; the tests check that both agree,
//! values and gradients.

use burn::backend::NdArray;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, Tensor, TensorData, TensorMetadata, TensorPrimitive};
use burn_ndarray::NdArrayTensor;
use std::borrow::Cow;

/// √(2/π), GPT-2's GELU constant.
const GELU_C: f32 = 0.797_884_6;
/// The cubic coefficient of GPT-2's GELU.
const GELU_A: f32 = 0.044_715;
/// Variance floor of the layer norm.
pub const NORM_EPS: f32 = 1e-5;

/// A backend with the fused kernels. Every function works on the last dimension of a
/// contiguous tensor of any rank (its "rows").
pub trait Kernels: Backend {
    /// GPT-2's GELU, `x · ½(1 + tanh(√(2/π)(x + 0.044715 x³)))`.
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        composite::gelu::<Self>(x)
    }

    /// The gradient of [`Kernels::fused_gelu`] at `x`, times `grad`.
    fn fused_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        composite::gelu_backward::<Self>(x, grad)
    }

    /// Layer normalisation of each row, scaled by `gamma` and shifted by `beta` (both of the
    /// row's length).
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composite::layer_norm::<Self>(x, gamma, beta)
    }

    /// The gradients of [`Kernels::fused_layer_norm`] with respect to `x`, `gamma` and `beta`.
    fn fused_layer_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        composite::layer_norm_backward::<Self>(x, gamma, grad)
    }

    /// `x · wᵀ` over the last dimension of `x` (`… × in`), with `w` an `out × in` matrix
    /// (any strides: a transposed factor is not copied).
    fn fused_linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        composite::linear::<Self>(x, w)
    }

    /// The gradients of [`Kernels::fused_linear`] with respect to `x` and `w`.
    fn fused_linear_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        composite::linear_backward::<Self>(x, w, grad)
    }

    /// Multi-head scaled dot-product attention of `N × T × d` queries, keys and values split
    /// into `heads` heads of width `d / heads`, with the heads merged back into `N × T × d`.
    /// Returns the output and the attention probabilities (`N × heads × T × T`, kept for the
    /// backward pass).
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        causal: bool,
    ) -> [FloatTensor<Self>; 2] {
        composite::attention::<Self>(q, k, v, heads, causal)
    }

    /// The gradients of [`Kernels::fused_attention`] with respect to `q`, `k` and `v`.
    fn fused_attention_backward(
        [q, k, v]: [FloatTensor<Self>; 3],
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        composite::attention_backward::<Self>([q, k, v], probs, grad)
    }
}

/// A training backend: autodiff over a backend that has the kernels too (for evaluation on
/// the inner backend).
pub trait TrainingBackend: AutodiffBackend<InnerBackend: Kernels> + Kernels {}

impl<B> TrainingBackend for B where B: AutodiffBackend<InnerBackend: Kernels> + Kernels {}

#[cfg(feature = "cuda")]
impl Kernels for burn::backend::Cuda {}

/// The kernels written with burn's tensor operations: the reference for the fused loops, and
/// the implementation on backends without them.
pub mod composite {
    use super::{GELU_A, GELU_C, NORM_EPS, float, with_row_len};
    use burn::tensor::activation;
    use burn::tensor::backend::Backend;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Shape, Tensor, TensorData, TensorMetadata};

    /// The tensor as `rows × last dimension`, and its shape to restore.
    fn rows<B: Backend>(x: FloatTensor<B>) -> (Tensor<B, 2>, Shape) {
        let shape = x.shape();
        let cols = shape[shape.num_dims() - 1];
        let flat = B::float_reshape(x, Shape::new([shape.num_elements() / cols, cols]));
        (float(flat), shape)
    }

    fn restore<B: Backend>(t: Tensor<B, 2>, shape: Shape) -> FloatTensor<B> {
        B::float_reshape(t.into_primitive().tensor(), shape)
    }

    fn row_vector<B: Backend>(v: FloatTensor<B>) -> Tensor<B, 2> {
        let n = v.shape().num_elements();
        float(B::float_reshape(v, Shape::new([1, n])))
    }

    /// `σ(2u)` with `u = √(2/π)(x + a x³)`; the exponent is clamped at 80 so that `e^{−2u}`
    /// stays finite.
    fn half_one_plus_tanh<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
        let u = x.clone() * (x.clone() * x).mul_scalar(GELU_A).add_scalar(1.0);
        u.mul_scalar(-2.0 * GELU_C)
            .clamp_max(80.0)
            .exp()
            .add_scalar(1.0)
            .recip()
    }

    pub fn gelu<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
        let (x, shape) = rows::<B>(x);
        restore(x.clone() * half_one_plus_tanh(x), shape)
    }

    pub fn gelu_backward<B: Backend>(x: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
        let (x, shape) = rows::<B>(x);
        let (grad, _) = rows::<B>(grad);
        let s = half_one_plus_tanh(x.clone());
        let du = (x.clone() * x.clone())
            .mul_scalar(3.0 * GELU_A)
            .add_scalar(1.0)
            .mul_scalar(2.0 * GELU_C);
        let slope = s.clone() + x * s.clone() * s.neg().add_scalar(1.0) * du;
        restore(grad * slope, shape)
    }

    pub fn softmax<B: Backend>(x: FloatTensor<B>, causal: bool) -> FloatTensor<B> {
        let (x, shape) = rows::<B>(x);
        let x = if causal {
            let [n, t] = x.dims();
            let mask: Vec<f32> = (0..t * t)
                .map(|i| {
                    if i % t > i / t {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let mask = Tensor::<B, 3>::from_data(TensorData::new(mask, [1, t, t]), &x.device());
            (x.reshape([n / t, t, t]) + mask).reshape([n, t])
        } else {
            x
        };
        restore(activation::softmax(x, 1), shape)
    }

    pub fn softmax_backward<B: Backend>(y: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
        let (y, shape) = rows::<B>(y);
        let (grad, _) = rows::<B>(grad);
        let dot = (grad.clone() * y.clone()).sum_dim(1);
        restore(y * (grad - dot), shape)
    }

    /// `(x − mean) / √(var + ε)` per row, and `1/√(var + ε)` as a column.
    fn normalise<B: Backend>(x: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let centred = x.clone() - x.mean_dim(1);
        let var = (centred.clone() * centred.clone()).mean_dim(1);
        let inv_std = var.add_scalar(f64::from(NORM_EPS)).sqrt().recip();
        (centred * inv_std.clone(), inv_std)
    }

    pub fn layer_norm<B: Backend>(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        beta: FloatTensor<B>,
    ) -> FloatTensor<B> {
        let (x, shape) = rows::<B>(x);
        let (normed, _) = normalise(x);
        restore(normed * row_vector(gamma) + row_vector(beta), shape)
    }

    pub fn layer_norm_backward<B: Backend>(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> [FloatTensor<B>; 3] {
        let (x, shape) = rows::<B>(x);
        let (grad, _) = rows::<B>(grad);
        let cols = x.dims()[1];
        let (normed, inv_std) = normalise(x);
        let d_gamma = (grad.clone() * normed.clone()).sum_dim(0).reshape([cols]);
        let d_beta = grad.clone().sum_dim(0).reshape([cols]);
        let d_normed = grad * row_vector(gamma);
        let d_x = (d_normed.clone()
            - d_normed.clone().mean_dim(1)
            - normed.clone() * (d_normed * normed).mean_dim(1))
            * inv_std;
        [
            restore(d_x, shape),
            d_gamma.into_primitive().tensor(),
            d_beta.into_primitive().tensor(),
        ]
    }

    pub fn linear<B: Backend>(x: FloatTensor<B>, w: FloatTensor<B>) -> FloatTensor<B> {
        let (x, shape) = rows::<B>(x);
        let w: Tensor<B, 2> = float(w);
        let out = with_row_len(&shape, w.dims()[0]);
        B::float_reshape(x.matmul(w.transpose()).into_primitive().tensor(), out)
    }

    pub fn linear_backward<B: Backend>(
        x: FloatTensor<B>,
        w: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> [FloatTensor<B>; 2] {
        let (x, shape) = rows::<B>(x);
        let (grad, _) = rows::<B>(grad);
        let w: Tensor<B, 2> = float(w);
        let d_x = restore(grad.clone().matmul(w), shape);
        let d_w = grad.transpose().matmul(x);
        [d_x, d_w.into_primitive().tensor()]
    }

    /// `N × T × d` → `N × heads × T × d/heads`.
    fn split<B: Backend>(x: FloatTensor<B>, heads: usize) -> Tensor<B, 4> {
        let x: Tensor<B, 3> = float(x);
        let [n, t, d] = x.dims();
        x.reshape([n, t, heads, d / heads]).swap_dims(1, 2)
    }

    /// `N × heads × T × d/heads` → `N × T × d`.
    fn merge<B: Backend>(x: Tensor<B, 4>) -> FloatTensor<B> {
        let [n, h, t, w] = x.dims();
        x.swap_dims(1, 2)
            .reshape([n, t, h * w])
            .into_primitive()
            .tensor()
    }

    fn scale(width: usize) -> f64 {
        1.0 / (width as f64).sqrt()
    }

    pub fn attention<B: Backend>(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        heads: usize,
        causal: bool,
    ) -> [FloatTensor<B>; 2] {
        let (q, k, v) = (
            split::<B>(q, heads),
            split::<B>(k, heads),
            split::<B>(v, heads),
        );
        let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale(v.dims()[3]));
        let probs: Tensor<B, 4> = float(softmax::<B>(scores.into_primitive().tensor(), causal));
        [
            merge(probs.clone().matmul(v)),
            probs.into_primitive().tensor(),
        ]
    }

    pub fn attention_backward<B: Backend>(
        [q, k, v]: [FloatTensor<B>; 3],
        probs: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> [FloatTensor<B>; 3] {
        let heads = probs.shape()[1];
        let (q, k, v) = (
            split::<B>(q, heads),
            split::<B>(k, heads),
            split::<B>(v, heads),
        );
        let grad = split::<B>(grad, heads);
        let probs: Tensor<B, 4> = float(probs);
        let d_v = probs.clone().swap_dims(2, 3).matmul(grad.clone());
        let d_probs = grad.matmul(v.clone().swap_dims(2, 3));
        let d_scores: Tensor<B, 4> = float::<B, 4>(softmax_backward::<B>(
            probs.into_primitive().tensor(),
            d_probs.into_primitive().tensor(),
        ))
        .mul_scalar(scale(v.dims()[3]));
        let d_q = d_scores.clone().matmul(k);
        let d_k = d_scores.swap_dims(2, 3).matmul(q);
        [merge(d_q), merge(d_k), merge(d_v)]
    }
}

/// fedshard trains in f32 only; any other CPU tensor reaching a kernel is a bug.
fn not_f32(t: &NdArrayTensor) -> ! {
    panic!(
        "fedshard's CPU kernels take f32 tensors, got {:?}",
        t.dtype()
    )
}

/// The values of an f32 CPU tensor in row-major order: borrowed when contiguous.
fn values(t: &NdArrayTensor) -> Cow<'_, [f32]> {
    let NdArrayTensor::F32(storage) = t else {
        not_f32(t)
    };
    let view = storage.view();
    match view.to_slice() {
        Some(slice) => Cow::Borrowed(slice),
        None => Cow::Owned(view.iter().copied().collect()),
    }
}

fn tensor(values: Vec<f32>, shape: Shape) -> NdArrayTensor {
    NdArrayTensor::from_data(TensorData::new(values, shape))
}

/// The length of the last dimension.
fn row_len(shape: &Shape) -> usize {
    shape[shape.num_dims() - 1]
}

/// `shape` with its last dimension set to `len`.
fn with_row_len(shape: &Shape, len: usize) -> Shape {
    let mut dims: Vec<usize> = (0..shape.num_dims()).map(|i| shape[i]).collect();
    dims[shape.num_dims() - 1] = len;
    Shape::from(dims)
}

/// `σ(2u)` of GPT-2's GELU at `x` (see [`composite`]).
#[inline]
fn half_one_plus_tanh(x: f32) -> f32 {
    let u = GELU_C * x * (1.0 + GELU_A * x * x);
    1.0 / (1.0 + (-2.0 * u).min(80.0).exp())
}

impl Kernels for NdArray<f32> {
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.shape();
        let y = values(&x)
            .iter()
            .map(|&x| x * half_one_plus_tanh(x))
            .collect();
        tensor(y, shape)
    }

    fn fused_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.shape();
        let dx = values(&x)
            .iter()
            .zip(values(&grad).iter())
            .map(|(&x, &g)| {
                let s = half_one_plus_tanh(x);
                let du = 2.0 * GELU_C * (1.0 + 3.0 * GELU_A * x * x);
                g * (s + x * s * (1.0 - s) * du)
            })
            .collect();
        tensor(dx, shape)
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let shape = x.shape();
        let cols = row_len(&shape);
        let (gamma, beta) = (values(&gamma), values(&beta));
        let mut y = values(&x).into_owned();
        for row in y.chunks_exact_mut(cols) {
            let (mean, inv_std) = moments(row);
            for ((v, g), b) in row.iter_mut().zip(gamma.iter()).zip(beta.iter()) {
                *v = (*v - mean) * inv_std * g + b;
            }
        }
        tensor(y, shape)
    }

    fn fused_layer_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let shape = x.shape();
        let cols = row_len(&shape);
        let gamma = values(&gamma);
        let grad = values(&grad);
        let mut dx = values(&x).into_owned();
        let mut d_gamma = vec![0.0f32; cols];
        let mut d_beta = vec![0.0f32; cols];
        let scale = 1.0 / cols as f32;
        for (row, g) in dx.chunks_exact_mut(cols).zip(grad.chunks_exact(cols)) {
            let (mean, inv_std) = moments(row);
            // row ← x̂; accumulate the parameter gradients and the two row means of dx̂.
            let (mut mean_d, mut mean_dx) = (0.0f32, 0.0f32);
            for j in 0..cols {
                let normed = (row[j] - mean) * inv_std;
                row[j] = normed;
                d_gamma[j] += g[j] * normed;
                d_beta[j] += g[j];
                let d = g[j] * gamma[j];
                mean_d += d;
                mean_dx += d * normed;
            }
            mean_d *= scale;
            mean_dx *= scale;
            for j in 0..cols {
                let normed = row[j];
                row[j] = (g[j] * gamma[j] - mean_d - normed * mean_dx) * inv_std;
            }
        }
        [
            tensor(dx, shape),
            tensor(d_gamma, Shape::new([cols])),
            tensor(d_beta, Shape::new([cols])),
        ]
    }
    fn fused_linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.shape();
        let inputs = row_len(&shape);
        let x = values(&x);
        let w = Strided::of(&w);
        assert_eq!(w.cols, inputs, "linear: weight width vs input width");
        let rows = x.len() / inputs;
        let mut y = vec![0.0; rows * w.rows];
        // y = x · wᵀ; wᵀ is w read with its strides swapped.
        gemm(
            [rows, inputs, w.rows],
            1.0,
            (&x, inputs as isize, 1),
            (&w.values, w.cs, w.rs),
            &mut y,
            w.rows,
        );
        tensor(y, with_row_len(&shape, w.rows))
    }

    fn fused_linear_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let shape = x.shape();
        let inputs = row_len(&shape);
        let (x, grad) = (values(&x), values(&grad));
        let w = Strided::of(&w);
        let rows = x.len() / inputs;
        let outputs = w.rows;
        let mut d_x = vec![0.0; rows * inputs];
        gemm(
            [rows, outputs, inputs],
            1.0,
            (&grad, outputs as isize, 1),
            (&w.values, w.rs, w.cs),
            &mut d_x,
            inputs,
        );
        let mut d_w = vec![0.0; outputs * inputs];
        gemm(
            [outputs, rows, inputs],
            1.0,
            (&grad, 1, outputs as isize),
            (&x, inputs as isize, 1),
            &mut d_w,
            inputs,
        );
        [
            tensor(d_x, shape),
            tensor(d_w, Shape::new([outputs, inputs])),
        ]
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        causal: bool,
    ) -> [FloatTensor<Self>; 2] {
        let shape = q.shape();
        let [n, t, d] = [shape[0], shape[1], shape[2]];
        let (width, scale) = head_width(d, heads);
        let (q, k, v) = (values(&q), values(&k), values(&v));
        let mut out = vec![0.0; n * t * d];
        let mut probs = vec![0.0; n * heads * t * t];
        for (block, p) in probs.chunks_exact_mut(t * t).enumerate() {
            // Head h of sample b is the column band [h·w, (h+1)·w) of the sample's T × d rows.
            let base = (block / heads) * t * d + (block % heads) * width;
            let d = d as isize;
            gemm(
                [t, width, t],
                scale,
                (&q[base..], d, 1),
                (&k[base..], 1, d),
                p,
                t,
            );
            softmax_rows(p, t, causal);
            gemm(
                [t, t, width],
                1.0,
                (p, t as isize, 1),
                (&v[base..], d, 1),
                &mut out[base..],
                d as usize,
            );
        }
        [
            tensor(out, shape),
            tensor(probs, Shape::new([n, heads, t, t])),
        ]
    }

    fn fused_attention_backward(
        [q, k, v]: [FloatTensor<Self>; 3],
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let shape = q.shape();
        let [t, d] = [shape[1], shape[2]];
        let heads = probs.shape()[1];
        let (width, scale) = head_width(d, heads);
        let (q, k, v) = (values(&q), values(&k), values(&v));
        let (probs, grad) = (values(&probs), values(&grad));
        let [mut d_q, mut d_k, mut d_v] = [(); 3].map(|_| vec![0.0; q.len()]);
        let mut d_scores = vec![0.0; t * t];
        for (block, p) in probs.chunks_exact(t * t).enumerate() {
            let base = (block / heads) * t * d + (block % heads) * width;
            let (d, tt) = (d as isize, t as isize);
            let g = &grad[base..];
            // dP = dO · Vᵀ, then through the softmax; the score scale goes into dQ and dK.
            gemm(
                [t, width, t],
                1.0,
                (g, d, 1),
                (&v[base..], 1, d),
                &mut d_scores,
                t,
            );
            softmax_backward_rows(p, &mut d_scores, t);
            let ds = &d_scores;
            gemm(
                [t, t, width],
                scale,
                (ds, tt, 1),
                (&k[base..], d, 1),
                &mut d_q[base..],
                d as usize,
            );
            gemm(
                [t, t, width],
                scale,
                (ds, 1, tt),
                (&q[base..], d, 1),
                &mut d_k[base..],
                d as usize,
            );
            gemm(
                [t, t, width],
                1.0,
                (p, 1, tt),
                (g, d, 1),
                &mut d_v[base..],
                d as usize,
            );
        }
        [d_q, d_k, d_v].map(|values| tensor(values, shape.clone()))
    }
}

/// Mean and `1/√(var + ε)` of a row (population variance, as the composite version).
fn moments(row: &[f32]) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + NORM_EPS).sqrt())
}

/// Row-wise softmax of `values` (rows of `cols`); with `causal`, row r of each `cols × cols`
/// block sees columns `0..=r % cols` and puts exactly 0 on the rest.
fn softmax_rows(values: &mut [f32], cols: usize, causal: bool) {
    for (r, row) in values.chunks_exact_mut(cols).enumerate() {
        let seen = if causal { r % cols + 1 } else { cols };
        let (kept, masked) = row.split_at_mut(seen);
        let max = kept.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for v in kept.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        kept.iter_mut().for_each(|v| *v *= inv);
        masked.fill(0.0);
    }
}

/// `grad ← y ⊙ (grad − Σ_j grad_j y_j)` row by row: the softmax backward pass in place.
fn softmax_backward_rows(y: &[f32], grad: &mut [f32], cols: usize) {
    for (d, y) in grad.chunks_exact_mut(cols).zip(y.chunks_exact(cols)) {
        let dot: f32 = d.iter().zip(y).map(|(g, y)| g * y).sum();
        d.iter_mut().zip(y).for_each(|(d, &y)| *d = y * (*d - dot));
    }
}

/// The width of one head and the score scale `1/√width`.
fn head_width(d: usize, heads: usize) -> (usize, f32) {
    assert!(
        heads > 0 && d.is_multiple_of(heads),
        "attention: width {d} does not split into {heads} heads"
    );
    let width = d / heads;
    (width, 1.0 / (width as f32).sqrt())
}

/// A CPU matrix with its element strides, borrowed when its memory is one block (a transposed
/// view included), copied to row-major otherwise.
struct Strided<'a> {
    values: Cow<'a, [f32]>,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

impl<'a> Strided<'a> {
    fn of(t: &'a NdArrayTensor) -> Self {
        let NdArrayTensor::F32(storage) = t else {
            not_f32(t)
        };
        let view = storage.view();
        let &[rows, cols] = view.shape() else {
            panic!(
                "a linear layer's weight is a matrix, got shape {:?}",
                view.shape()
            );
        };
        let strides = view.strides();
        match view.to_slice_memory_order() {
            Some(block) if strides.iter().all(|&s| s >= 0) => Self {
                values: Cow::Borrowed(block),
                rows,
                cols,
                rs: strides[0],
                cs: strides[1],
            },
            _ => Self {
                values: Cow::Owned(view.iter().copied().collect()),
                rows,
                cols,
                rs: cols as isize,
                cs: 1,
            },
        }
    }
}

/// `c ← α · a · b` for an `m × k` matrix `a` and a `k × n` matrix `b`, each given as values and
/// (row, column) element strides from the start of the slice, into the first `n` columns of
/// the rows of `c` (row stride `ldc`). Every index is checked against the slices before
/// matrixmultiply reads or writes them.
fn gemm(
    [m, k, n]: [usize; 3],
    alpha: f32,
    (a, rsa, csa): (&[f32], isize, isize),
    (b, rsb, csb): (&[f32], isize, isize),
    c: &mut [f32],
    ldc: usize,
) {
    assert!(m > 0 && k > 0 && n > 0, "gemm: empty operand {m}×{k}×{n}");
    // The offset of the last element of a positive-sized `rows × cols` operand.
    let last = |rows: usize, cols: usize, rs: isize, cs: isize| {
        assert!(rs >= 0 && cs >= 0, "gemm: negative strides");
        (rows - 1) * rs as usize + (cols - 1) * cs as usize
    };
    assert!(last(m, k, rsa, csa) < a.len(), "gemm: a out of bounds");
    assert!(last(k, n, rsb, csb) < b.len(), "gemm: b out of bounds");
    assert!(
        n <= ldc && last(m, n, ldc as isize, 1) < c.len(),
        "gemm: c out of bounds"
    );
    // SAFETY: the asserts above keep every element matrixmultiply touches inside the three
    // slices; `c` is borrowed mutably, so it aliases neither `a` nor `b`. With β = 0, c is
    // written, never read.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            0.0,
            c.as_mut_ptr(),
            ldc as isize,
            1,
        );
    }
}

/// A graph node with `N` inputs whose backward pass is `backward(state, grad)`, one gradient
/// per input.
#[derive(Debug)]
struct KernelNode<B: Backend, S, const N: usize> {
    backward: fn(S, FloatTensor<B>) -> [FloatTensor<B>; N],
}

impl<B, S, const N: usize> Backward<B, N> for KernelNode<B, S, N>
where
    B: Backend,
    S: Clone + Send + std::fmt::Debug + 'static,
{
    type State = S;

    fn backward(self, ops: Ops<S, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let gradients = (self.backward)(ops.state, grad);
        for (parent, gradient) in ops.parents.into_iter().zip(gradients) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, gradient);
            }
        }
    }
}

/// Records `output`, computed by a kernel from `inputs`, in the graph; `state` is what the
/// backward pass needs.
fn record<B, C, S, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    output: FloatTensor<B>,
    state: S,
    backward: fn(S, FloatTensor<B>) -> [FloatTensor<B>; N],
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    S: Clone + Send + std::fmt::Debug + 'static,
{
    let node = KernelNode { backward };
    match node
        .prepare::<C>(inputs.map(|t| t.node))
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// One graph node per kernel; the backward pass runs the inner backend's backward kernel.
impl<B: Kernels, C: CheckpointStrategy> Kernels for Autodiff<B, C> {
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (y, saved) = (B::fused_gelu(x.primitive.clone()), x.primitive.clone());
        record::<B, C, _, 1>([x], y, saved, |x, g| [B::fused_gelu_backward(x, g)])
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let y = B::fused_layer_norm(
            x.primitive.clone(),
            gamma.primitive.clone(),
            beta.primitive.clone(),
        );
        let state = (x.primitive.clone(), gamma.primitive.clone());
        record::<B, C, _, 3>([x, gamma, beta], y, state, |(x, gamma), g| {
            B::fused_layer_norm_backward(x, gamma, g)
        })
    }

    fn fused_linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let y = B::fused_linear(x.primitive.clone(), w.primitive.clone());
        let state = (x.primitive.clone(), w.primitive.clone());
        record::<B, C, _, 2>([x, w], y, state, |(x, w), g| {
            B::fused_linear_backward(x, w, g)
        })
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        causal: bool,
    ) -> [FloatTensor<Self>; 2] {
        let qkv = [
            q.primitive.clone(),
            k.primitive.clone(),
            v.primitive.clone(),
        ];
        let [out, probs] = B::fused_attention(
            qkv[0].clone(),
            qkv[1].clone(),
            qkv[2].clone(),
            heads,
            causal,
        );
        let probs_out = probs.clone();
        let out = record::<B, C, _, 3>([q, k, v], out, (qkv, probs), |(qkv, probs), g| {
            B::fused_attention_backward(qkv, probs, g)
        });
        [out, Self::from_inner(probs_out)]
    }
}

fn float<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// GPT-2's GELU through [`Kernels::fused_gelu`].
pub fn gelu<B: Kernels, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    float(B::fused_gelu(x.into_primitive().tensor()))
}

/// Layer normalisation of the last dimension through [`Kernels::fused_layer_norm`].
pub fn layer_norm<B: Kernels, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
) -> Tensor<B, D> {
    float(B::fused_layer_norm(
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
    ))
}

/// `x · wᵀ` through [`Kernels::fused_linear`].
pub fn linear<B: Kernels, const D: usize>(x: Tensor<B, D>, w: Tensor<B, 2>) -> Tensor<B, D> {
    float(B::fused_linear(
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
    ))
}

/// Multi-head attention of `N × T × d` projections through [`Kernels::fused_attention`].
pub fn attention<B: Kernels>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
    causal: bool,
) -> Tensor<B, 3> {
    let [out, _] = B::fused_attention(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
        heads,
        causal,
    );
    float(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::Distribution;

    type B = Autodiff<NdArray>;

    fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<B, D> {
        B::seed(&Default::default(), seed);
        Tensor::random(shape, Distribution::Normal(0.0, 2.0), &Default::default())
    }

    fn vec<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().into_vec().expect("f32")
    }

    fn assert_close(fused: &[f32], composite: &[f32], what: &str) {
        assert_eq!(fused.len(), composite.len(), "{what}: lengths");
        for (i, (a, b)) in fused.iter().zip(composite).enumerate() {
            assert!(
                (a - b).abs() <= 2e-5 * (1.0 + b.abs()),
                "{what}[{i}]: fused {a}, composite {b}"
            );
        }
    }

    fn as_autodiff(t: FloatTensor<B>) -> Tensor<B, 3> {
        float(t)
    }

    /// Runs `fused` and `composite` on the same inputs, then backpropagates the same random
    /// cotangent through both and compares outputs and every input's gradient.
    fn check(
        inputs: Vec<Tensor<B, 3>>,
        fused: impl Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>,
        composite: impl Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>,
        what: &str,
    ) {
        let run = |f: &dyn Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>| {
            let xs: Vec<_> = inputs
                .iter()
                .map(|x| x.clone().detach().require_grad())
                .collect();
            let y = f(&xs);
            let cotangent = random(y.dims(), 99);
            let grads = (y.clone() * cotangent).sum().backward();
            let dxs: Vec<Vec<f32>> = xs
                .iter()
                .map(|x| x.grad(&grads).expect("every input gets a gradient"))
                .map(|g| g.into_data().into_vec().expect("f32"))
                .collect();
            (vec(y), dxs)
        };
        let (y_fused, d_fused) = run(&fused);
        let (y_comp, d_comp) = run(&composite);
        assert_close(&y_fused, &y_comp, &format!("{what} output"));
        for (i, (a, b)) in d_fused.iter().zip(&d_comp).enumerate() {
            assert_close(a, b, &format!("{what} gradient of input {i}"));
        }
    }

    #[test]
    fn fused_gelu_matches_the_composite_one() {
        check(
            vec![random([2, 5, 7], 1)],
            |x| gelu(x[0].clone()),
            |x| as_autodiff(composite::gelu::<B>(x[0].clone().into_primitive().tensor())),
            "gelu",
        );
    }

    #[test]
    fn attention_softmax_rows_match_the_composite_softmax_forward_and_backward() {
        let primitive = |t: &Tensor<B, 3>| t.clone().into_primitive().tensor();
        for causal in [false, true] {
            let (x, grad) = (random([3, 6, 6], 2), random([3, 6, 6], 3));
            let y = composite::softmax::<B>(primitive(&x), causal);
            let dx = composite::softmax_backward::<B>(y.clone(), primitive(&grad));
            let mut rows = vec(x);
            softmax_rows(&mut rows, 6, causal);
            assert_close(
                &rows,
                &vec(as_autodiff(y)),
                &format!("softmax (causal {causal})"),
            );
            let mut d_rows = vec(grad);
            softmax_backward_rows(&rows, &mut d_rows, 6);
            assert_close(
                &d_rows,
                &vec(as_autodiff(dx)),
                &format!("softmax backward (causal {causal})"),
            );
        }
        // Causal: row i puts exactly zero mass on positions after i, and each row sums to 1.
        let mut y = vec(random([1, 4, 4], 3));
        softmax_rows(&mut y, 4, true);
        for (i, row) in y.chunks(4).enumerate() {
            assert!(row[i + 1..].iter().all(|&p| p == 0.0), "row {i}: {row:?}");
            assert!(
                (row.iter().sum::<f32>() - 1.0).abs() < 1e-6,
                "row {i}: {row:?}"
            );
        }
    }

    #[test]
    fn fused_layer_norm_matches_the_composite_one_in_all_three_gradients() {
        let gamma = random([1, 1, 9], 5);
        let beta = random([1, 1, 9], 6);
        let flat = |t: &Tensor<B, 3>| t.clone().reshape([9]);
        check(
            vec![random([2, 4, 9], 4), gamma, beta],
            |x| layer_norm(x[0].clone(), flat(&x[1]), flat(&x[2])),
            |x| {
                as_autodiff(composite::layer_norm::<B>(
                    x[0].clone().into_primitive().tensor(),
                    flat(&x[1]).into_primitive().tensor(),
                    flat(&x[2]).into_primitive().tensor(),
                ))
            },
            "layer norm",
        );
    }

    #[test]
    fn fused_linear_matches_the_composite_one_for_plain_and_transposed_weights() {
        // A factor U (n × out) enters as Uᵀ: a strided view the kernel reads without a copy.
        let plain: fn(&Tensor<B, 3>) -> Tensor<B, 2> = |w| w.clone().reshape([5, 7]);
        let transposed: fn(&Tensor<B, 3>) -> Tensor<B, 2> =
            |w| w.clone().reshape([7, 5]).transpose();
        for (weight, stored, what) in [
            (plain, [1, 5, 7], "linear"),
            (transposed, [1, 7, 5], "linear with a transposed weight"),
        ] {
            check(
                vec![random([2, 3, 7], 7), random(stored, 8)],
                |x| linear(x[0].clone(), weight(&x[1])),
                |x| {
                    as_autodiff(composite::linear::<B>(
                        x[0].clone().into_primitive().tensor(),
                        weight(&x[1]).into_primitive().tensor(),
                    ))
                },
                what,
            );
        }
    }

    #[test]
    fn fused_attention_matches_the_composite_one_in_q_k_and_v() {
        for causal in [false, true] {
            check(
                vec![
                    random([2, 5, 12], 11),
                    random([2, 5, 12], 12),
                    random([2, 5, 12], 13),
                ],
                |x| attention(x[0].clone(), x[1].clone(), x[2].clone(), 3, causal),
                |x| {
                    let [out, _] = composite::attention::<B>(
                        x[0].clone().into_primitive().tensor(),
                        x[1].clone().into_primitive().tensor(),
                        x[2].clone().into_primitive().tensor(),
                        3,
                        causal,
                    );
                    as_autodiff(out)
                },
                &format!("attention (causal {causal})"),
            );
        }
        // Causal: the first position attends to itself only, so its output is its own value.
        let (q, k, v) = (
            random([1, 4, 6], 14),
            random([1, 4, 6], 15),
            random([1, 4, 6], 16),
        );
        let out = vec(attention(q, k, v.clone(), 2, true));
        assert_close(&out[..6], &vec(v)[..6], "first causal position");
    }

    #[test]
    fn gelu_is_gpt2s_tanh_form_with_finite_gradients_everywhere() {
        let xs: Vec<f32> = vec![-200.0, -50.0, -8.0, -1.5, -0.3, 0.0, 0.4, 1.0, 3.0, 60.0];
        for fused in [true, false] {
            let x = Tensor::<B, 1>::from_data(
                TensorData::new(xs.clone(), [xs.len()]),
                &Default::default(),
            )
            .require_grad();
            let y: Tensor<B, 1> = if fused {
                gelu(x.clone())
            } else {
                float(composite::gelu::<B>(x.clone().into_primitive().tensor()))
            };
            let grads = y.clone().sum().backward();
            let dy: Vec<f32> = x
                .grad(&grads)
                .expect("grad")
                .into_data()
                .into_vec()
                .expect("f32");
            let y = vec(y);
            let c = (2.0 / std::f64::consts::PI).sqrt();
            for ((&xi, &yi), &gi) in xs.iter().zip(&y).zip(&dy) {
                let x = f64::from(xi);
                let t = (c * (x + 0.044715 * x.powi(3))).tanh();
                let expected = 0.5 * x * (1.0 + t);
                let slope =
                    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
                assert!(
                    (f64::from(yi) - expected).abs() <= 1e-5 * (1.0 + expected.abs()),
                    "gelu({x}), fused {fused}"
                );
                assert!(
                    gi.is_finite() && (f64::from(gi) - slope).abs() <= 1e-4,
                    "gelu'({x}) = {gi}, expected {slope}, fused {fused}"
                );
            }
        }
    }
}
