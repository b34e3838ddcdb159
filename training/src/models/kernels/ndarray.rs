//! The fused kernels of the CPU backend, `NdArray<f32>`: one pass per element-wise kernel over
//! contiguous rows, and matrixmultiply's strided `sgemm` for the products.
//!
//! Why: burn's tensor operations cost 5–10 allocating passes per kernel, and burn-ndarray's
//! matmul copies transposed operands; here transposes and per-head column bands are read in
//! place. The loops must agree with [`composite`](super::composite) (see the tests).

use super::{GELU_A, GELU_C, Kernels, NORM_EPS, with_row_len};
use burn::backend::NdArray;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorData, TensorMetadata};
use burn_ndarray::NdArrayTensor;
use std::borrow::Cow;

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

/// `σ(2u)` of GPT-2's GELU at `x` (see [`composite`](super::composite)).
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
pub(super) fn softmax_rows(values: &mut [f32], cols: usize, causal: bool) {
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
pub(super) fn softmax_backward_rows(y: &[f32], grad: &mut [f32], cols: usize) {
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
