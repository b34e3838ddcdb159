//! The fused kernels of the CPU backend, `NdArray<f32>`: one pass per element-wise kernel over
//! contiguous rows, and the `gemm` crate's strided product for the matrix products.
//!
//! Why: burn's tensor operations cost 5–10 allocating passes per kernel, and burn-ndarray's
//! matmul copies transposed operands; here transposes and per-head column bands are read in
//! place. The loops must agree with [`composite`](super::composite) (see the tests).
//!
//! One file per kind of kernel: [`activations`], [`norms`], [`products`], [`attention`],
//! [`convolution`], [`pooling`], [`scaling`] and [`sgd`]; the [`Kernels`] implementation below only routes to them.

mod activations;
mod attention;
mod convolution;
mod norms;
mod pooling;
mod products;
mod scaling;
mod sgd;
mod winograd;

#[cfg(test)]
pub(super) use activations::{softmax_backward_rows, softmax_rows};
pub(super) use products::gemm_into;

use super::{ConvGeometry, Kernels, MaxWindow, Pool, cohort};
use burn::backend::NdArray;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DataError, Shape, Tensor, TensorData, TensorMetadata};
use burn_ndarray::NdArrayTensor;
use ndarray::{ArcArray, ArrayViewD, Dimension, Ix1, Ix2, Ix3, Ix4, Ix5, IxDyn};
use std::borrow::Cow;

/// fedshard trains in f32 only; any other CPU tensor reaching a kernel is a bug.
fn not_f32(t: &NdArrayTensor) -> ! {
    panic!(
        "fedshard's CPU kernels take f32 tensors, got {:?}",
        t.dtype()
    )
}

/// The f32 array of `t` if nothing else holds it and it is in row-major order (so writing it
/// in place changes no other tensor), else `t` back.
fn exclusive(t: NdArrayTensor) -> Result<ArcArray<f32, IxDyn>, NdArrayTensor> {
    match t {
        NdArrayTensor::F32(storage) if storage.is_unique() => {
            let array = storage.into_shared();
            if array.is_standard_layout() {
                Ok(array)
            } else {
                Err(NdArrayTensor::from(array))
            }
        }
        other => Err(other),
    }
}

/// The values of an array [`exclusive`] returned, to write in place.
fn contiguous(array: &mut ArcArray<f32, IxDyn>) -> &mut [f32] {
    array
        .as_slice_mut()
        .expect("exclusive() returns contiguous arrays")
}

/// `t`'s array to overwrite: its own when [`exclusive`], else a row-major copy (the copies of
/// a gradient and of the saved input were 2.5% of a ResNet-18 step, in the group norm's
/// backward pass).
fn writable(t: NdArrayTensor) -> ArcArray<f32, IxDyn> {
    exclusive(t).unwrap_or_else(|t| {
        exclusive(tensor(values(&t).into_owned(), t.shape()))
            .unwrap_or_else(|_| unreachable!("a fresh row-major tensor is exclusive"))
    })
}

/// `f()`, compiled for AVX-512 where the CPU has it and the `avx512` feature is on: the
/// element-wise loops inlined into `f` (an `#[inline(always)]` closure) then run 16 floats wide
/// instead of the build's 8 (x86-64-v3, .cargo/config.toml). Each element takes the same
/// operations either way (Rust does not contract `a·b + c` into an FMA, and the sums keep their
/// [`LANES`] partial sums), so the results are the same bits; calls `f` does not inline keep
/// the build's width. Used for the GELU (8.5% of a char-transformer step before, 6.3% after)
/// and the softmax beside it; the Winograd transforms gained nothing measurable when their
/// lanes still read one channel plane each (those loads became vector gathers and scatters,
/// slow on AMD's Zen 4), and were not retried on the channels-last tiles.
#[inline(always)]
fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(all(feature = "avx512", target_arch = "x86_64"))]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F, checked just above.
        return unsafe { with_avx512(f) };
    }
    f()
}

/// [`wide`]'s AVX-512 copy of `f`.
#[cfg(all(feature = "avx512", target_arch = "x86_64"))]
#[target_feature(enable = "avx512f")]
unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// The values of an f32 CPU tensor in row-major order: borrowed when contiguous.
fn values(t: &NdArrayTensor) -> Cow<'_, [f32]> {
    let NdArrayTensor::F32(storage) = t else {
        not_f32(t)
    };
    let view = storage.view();
    match view.to_slice() {
        Some(slice) => Cow::Borrowed(slice),
        None => Cow::Owned(strided_values(view)),
    }
}

/// The values of a non-contiguous view (a transposed factor, a client's slice of a stacked
/// parameter) in row-major order. ndarray's iterator over a view of dynamic rank clones its
/// index at every element (these copies were 6% of the main job); with the rank fixed it is a
/// nested loop.
fn strided_values(view: ArrayViewD<'_, f32>) -> Vec<f32> {
    fn fixed<D: Dimension>(view: ArrayViewD<'_, f32>) -> Vec<f32> {
        match view.into_dimensionality::<D>() {
            Ok(view) => view.iter().copied().collect(),
            Err(_) => unreachable!("the rank was matched"),
        }
    }
    match view.ndim() {
        1 => fixed::<Ix1>(view),
        2 => fixed::<Ix2>(view),
        3 => fixed::<Ix3>(view),
        4 => fixed::<Ix4>(view),
        5 => fixed::<Ix5>(view),
        _ => view.iter().copied().collect(),
    }
}

fn tensor(values: Vec<f32>, shape: Shape) -> NdArrayTensor {
    NdArrayTensor::from_data(TensorData::new(values, shape))
}

/// The length of the last dimension.
fn row_len(shape: &Shape) -> usize {
    shape[shape.num_dims() - 1]
}

/// Accumulators of the vectorised sums: a float sum taken in order is one long dependency
/// chain the compiler may not reorder, so the sums below keep `LANES` partial sums instead (a
/// fixed order: the result depends on the data only).
const LANES: usize = 16;

/// `Σ values`, in [`LANES`] partial sums.
#[inline(always)]
fn lane_sum(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (acc, v) in lanes.iter_mut().zip(chunk) {
            *acc += v;
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// `Σ a_i b_i`, in [`LANES`] partial sums.
#[inline(always)]
fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((acc, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *acc += x * y;
        }
    }
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    lanes.iter().sum::<f32>() + tail
}

impl Kernels for NdArray<f32> {
    /// A cohort's kernels run one client at a time (`cohort.rs`): bit-exact with each client
    /// alone.
    const BATCHED_COHORTS: bool = false;

    fn read_values<const D: usize>(t: Tensor<Self, D>) -> Result<Vec<f32>, DataError> {
        Ok(values(&t.into_primitive().tensor()).into_owned())
    }

    fn cohort_client(stacked: FloatTensor<Self>, c: usize) -> FloatTensor<Self> {
        let NdArrayTensor::F32(storage) = stacked else {
            not_f32(&stacked)
        };
        NdArrayTensor::from(storage.into_shared().index_axis_move(ndarray::Axis(0), c))
    }

    fn cohort_stack(mut parts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        if parts.len() != 1 {
            return cohort::stack::<Self>(parts);
        }
        let part = parts.pop().expect("one part");
        let NdArrayTensor::F32(storage) = part else {
            not_f32(&part)
        };
        NdArrayTensor::from(storage.into_shared().insert_axis(ndarray::Axis(0)))
    }

    fn scale_rows(x: FloatTensor<Self>, scale: FloatTensor<Self>) -> FloatTensor<Self> {
        scaling::scale_rows(x, scale)
    }

    fn sgd_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        velocity: Option<FloatTensor<Self>>,
        lr: f64,
        momentum: f64,
        decay: f64,
    ) -> [FloatTensor<Self>; 2] {
        sgd::step(param, grad, velocity, lr, momentum, decay)
    }

    fn add_scaled(a: FloatTensor<Self>, b: FloatTensor<Self>, scale: f64) -> FloatTensor<Self> {
        sgd::add_scaled(a, b, scale)
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        activations::gelu(x)
    }

    fn fused_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        activations::gelu_backward(x, grad)
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        norms::layer_norm(x, gamma, beta)
    }

    fn fused_layer_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        norms::layer_norm_backward(x, gamma, grad)
    }

    fn fused_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        products::linear(x, w, bias)
    }

    fn fused_linear_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        products::linear_backward(x, w, grad)
    }

    fn fused_bias_backward(grad: FloatTensor<Self>) -> FloatTensor<Self> {
        products::bias_backward(grad)
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        causal: bool,
    ) -> [FloatTensor<Self>; 2] {
        attention::attention(q, k, v, heads, causal)
    }

    fn fused_attention_backward(
        qkv: [FloatTensor<Self>; 3],
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        causal: bool,
    ) -> [FloatTensor<Self>; 3] {
        attention::attention_backward(qkv, probs, grad, causal)
    }

    fn fused_conv2d(
        x: FloatTensor<Self>,
        filters: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        geometry: ConvGeometry,
    ) -> [FloatTensor<Self>; 2] {
        convolution::conv2d(x, filters, bias, geometry)
    }

    fn fused_conv2d_backward(
        saved: FloatTensor<Self>,
        shape: Shape,
        filters: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geometry: ConvGeometry,
        with_bias: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        convolution::conv2d_backward(saved, shape, filters, grad, geometry, with_bias)
    }

    fn fused_group_norm(
        x: FloatTensor<Self>,
        gamma_beta: [FloatTensor<Self>; 2],
        groups: usize,
        relu: bool,
    ) -> FloatTensor<Self> {
        norms::group_norm(x, gamma_beta, groups, relu)
    }

    fn fused_group_norm_backward(
        x: FloatTensor<Self>,
        gamma_beta: [FloatTensor<Self>; 2],
        grad: FloatTensor<Self>,
        groups: usize,
        relu: bool,
    ) -> [FloatTensor<Self>; 3] {
        norms::group_norm_backward(x, gamma_beta, grad, groups, relu)
    }

    fn fused_pool(x: FloatTensor<Self>, kind: Pool, k: usize) -> FloatTensor<Self> {
        pooling::pool(x, kind, k)
    }

    fn fused_pool_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: Pool,
        k: usize,
    ) -> FloatTensor<Self> {
        pooling::pool_backward(x, grad, kind, k)
    }

    fn fused_max_pool(x: FloatTensor<Self>, window: MaxWindow) -> FloatTensor<Self> {
        pooling::max_pool(x, window)
    }

    fn fused_max_pool_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        window: MaxWindow,
    ) -> FloatTensor<Self> {
        pooling::max_pool_backward(x, grad, window)
    }
}

#[cfg(test)]
mod tests {
    use super::strided_values;
    use ndarray::{ArrayD, IxDyn};

    /// Every rank, permuted and sliced: the values in the view's own row-major order.
    #[test]
    fn strided_values_read_a_view_in_row_major_order() {
        for rank in 1..=6 {
            let shape: Vec<usize> = (0..rank).map(|d| 2 + d % 3).collect();
            let len = shape.iter().product();
            let array = ArrayD::from_shape_vec(IxDyn(&shape), (0..len).map(|v| v as f32).collect())
                .expect("the shape's length");
            let mut axes: Vec<usize> = (0..rank).collect();
            axes.reverse();
            let permuted = array.view().permuted_axes(IxDyn(&axes));
            let expected: Vec<f32> = permuted.iter().copied().collect();
            assert_eq!(
                strided_values(permuted),
                expected,
                "rank {rank}, axes reversed"
            );
            let stepped = array.slice_each_axis(|a| {
                ndarray::Slice::new(0, None, if a.axis.index() == 0 { 2 } else { 1 })
            });
            let expected: Vec<f32> = stepped.iter().copied().collect();
            assert_eq!(
                strided_values(stepped),
                expected,
                "rank {rank}, every other first index"
            );
        }
    }
}
