//! The kernels written with burn's tensor operations: the reference for the fused loops, and
//! the implementation on backends without them.
//!
//! Why a separate module: these run on any backend (CUDA included) and are the oracle the tests
//! hold the fused CPU loops and the autodiff nodes to, so they must stay plain burn code.

use super::{ConvGeometry, GELU_A, GELU_C, MaxWindow, NORM_EPS, Pool, float, with_row_len};
use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{Shape, Tensor, TensorData, TensorMetadata};

/// The tensor as `rows × last dimension`, and its shape to restore.
pub(super) fn rows<B: Backend>(x: FloatTensor<B>) -> (Tensor<B, 2>, Shape) {
    let shape = x.shape();
    let cols = shape[shape.num_dims() - 1];
    let flat = B::float_reshape(x, Shape::new([shape.num_elements() / cols, cols]));
    (float(flat), shape)
}

pub(super) fn restore<B: Backend>(t: Tensor<B, 2>, shape: Shape) -> FloatTensor<B> {
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

pub fn scale_rows<B: Backend>(x: FloatTensor<B>, scale: FloatTensor<B>) -> FloatTensor<B> {
    B::float_mul(x, scale)
}

pub fn sgd_step<B: Backend>(
    param: FloatTensor<B>,
    grad: FloatTensor<B>,
    velocity: Option<FloatTensor<B>>,
    lr: f64,
    momentum: f64,
    decay: f64,
) -> [FloatTensor<B>; 2] {
    let grad = if decay == 0.0 {
        grad
    } else {
        add_scaled::<B>(grad, param.clone(), decay)
    };
    let (param, shape) = rows::<B>(param);
    let (grad, _) = rows::<B>(grad);
    let velocity = match velocity {
        Some(v) => grad.add(rows::<B>(v).0.mul_scalar(momentum)),
        None => grad,
    };
    let stepped = param - velocity.clone().mul_scalar(lr);
    [restore(stepped, shape.clone()), restore(velocity, shape)]
}

pub fn add_scaled<B: Backend>(a: FloatTensor<B>, b: FloatTensor<B>, scale: f64) -> FloatTensor<B> {
    let (a, shape) = rows::<B>(a);
    let (b, _) = rows::<B>(b);
    restore(a + b.mul_scalar(scale), shape)
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
pub(super) fn normalise<B: Backend>(x: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let centred = x.clone() - x.mean_dim(1);
    let var = (centred.clone() * centred.clone()).mean_dim(1);
    let inv_std = var.add_scalar(f64::from(NORM_EPS)).sqrt().recip();
    (centred * inv_std.clone(), inv_std)
}

/// The gradient with respect to the rows `x` of [`normalise`], from the gradient `d_normed` of
/// its output `normed` and its `inv_std`.
pub(super) fn normalise_backward<B: Backend>(
    d_normed: Tensor<B, 2>,
    normed: Tensor<B, 2>,
    inv_std: Tensor<B, 2>,
) -> Tensor<B, 2> {
    (d_normed.clone()
        - d_normed.clone().mean_dim(1)
        - normed.clone() * (d_normed * normed).mean_dim(1))
        * inv_std
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
    let d_x = normalise_backward(d_normed, normed, inv_std);
    [
        restore(d_x, shape),
        d_gamma.into_primitive().tensor(),
        d_beta.into_primitive().tensor(),
    ]
}

pub fn linear<B: Backend>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let (x, shape) = rows::<B>(x);
    let w: Tensor<B, 2> = float(w);
    let out = with_row_len(&shape, w.dims()[0]);
    let y = x.matmul(w.transpose());
    let y = match bias {
        Some(b) => y + row_vector(b),
        None => y,
    };
    B::float_reshape(y.into_primitive().tensor(), out)
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

pub fn bias_backward<B: Backend>(grad: FloatTensor<B>) -> FloatTensor<B> {
    let (grad, _) = rows::<B>(grad);
    let outputs = grad.dims()[1];
    grad.sum_dim(0).reshape([outputs]).into_primitive().tensor()
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

pub fn conv2d<B: Backend>(
    x: FloatTensor<B>,
    filters: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    geometry: ConvGeometry,
) -> FloatTensor<B> {
    let (weight, options) = conv_weight::<B>(&x, filters, geometry);
    B::conv2d(x, weight, bias, options)
}

pub fn conv2d_backward<B: Backend>(
    x: FloatTensor<B>,
    filters: FloatTensor<B>,
    grad: FloatTensor<B>,
    geometry: ConvGeometry,
    with_bias: bool,
) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
    let filters_shape = filters.shape();
    let (weight, options) = conv_weight::<B>(&x, filters, geometry);
    let d_x = B::conv2d_x_backward(x.clone(), weight.clone(), grad.clone(), options.clone());
    let d_weight = B::conv2d_weight_backward(x, weight, grad.clone(), options);
    (
        d_x,
        B::float_reshape(d_weight, filters_shape),
        with_bias.then(|| conv_bias_backward::<B>(grad)),
    )
}

/// The gradient of a strided convolution with respect to its input (of shape `input`), from
/// the gradient `grad` of its output, as the stride-1 input gradient of `grad` spread out
/// with zeros: a convolution with stride s is the stride-1 convolution sampled at every s-th
/// position, so its input gradient is the stride-1 one of an output gradient that is zero
/// between the samples. `stride_one(spread, options)` computes that stride-1 gradient.
///
/// Why: burn's CUDA backend computes a strided input gradient with its direct transposed
/// convolution, which returns zeros where the kernel is smaller than the stride (the 1×1
/// stride-2 shortcuts of ResNet-18: its range of contributing outputs, from
/// `kernel − stride < 0`, is empty), and slowly where it is not.
pub fn strided_input_grad<B: Backend>(
    grad: FloatTensor<B>,
    input: &Shape,
    geometry: ConvGeometry,
    stride_one: impl FnOnce(FloatTensor<B>, ConvOptions<2>) -> FloatTensor<B>,
) -> FloatTensor<B> {
    let grad: Tensor<B, 4> = float(grad);
    let [n, c, h, w] = grad.dims();
    let [s0, s1] = geometry.stride;
    let unit = ConvGeometry {
        stride: [1, 1],
        ..geometry
    };
    let [full_h, full_w] = unit.output([input[2], input[3]]);
    let spread = Tensor::<B, 6>::zeros([n, c, h, s0, w, s1], &grad.device())
        .slice_assign(
            [0..n, 0..c, 0..h, 0..1, 0..w, 0..1],
            grad.reshape([n, c, h, 1, w, 1]),
        )
        .reshape([n, c, h * s0, w * s1])
        .slice([0..n, 0..c, 0..full_h, 0..full_w]);
    stride_one(spread.into_primitive().tensor(), unit.options())
}

/// The gradient of a convolution's bias: `grad` (`N × c_out × H' × W'`) summed per channel.
pub(super) fn conv_bias_backward<B: Backend>(grad: FloatTensor<B>) -> FloatTensor<B> {
    let grad: Tensor<B, 4> = float(grad);
    let c_out = grad.dims()[1];
    let d_bias = grad.sum_dim(0).sum_dim(2).sum_dim(3).reshape([c_out]);
    d_bias.into_primitive().tensor()
}

/// The `c_out × C × kh × kw` weight of a `c_out × (C kh kw)` filter matrix for input `x`, and
/// burn's options for the geometry.
pub(super) fn conv_weight<B: Backend>(
    x: &FloatTensor<B>,
    filters: FloatTensor<B>,
    geometry: ConvGeometry,
) -> (FloatTensor<B>, ConvOptions<2>) {
    let c_out = filters.shape()[0];
    let [kh, kw] = geometry.kernel;
    let weight = B::float_reshape(filters, Shape::new([c_out, x.shape()[1], kh, kw]));
    (weight, geometry.options())
}

/// `N × C × H × W` as `N·groups` rows of `(C/groups)·H·W` values.
pub(super) fn group_rows<B: Backend>(x: FloatTensor<B>, groups: usize) -> (Tensor<B, 2>, Shape) {
    let shape = x.shape();
    let rows = shape[0] * groups;
    let flat = B::float_reshape(x, Shape::new([rows, shape.num_elements() / rows]));
    (float(flat), shape)
}

/// A per-channel vector as `1 × C × 1 × 1`.
fn per_channel<B: Backend>(v: FloatTensor<B>) -> Tensor<B, 4> {
    let c = v.shape().num_elements();
    float(B::float_reshape(v, Shape::new([1, c, 1, 1])))
}

/// Normalised activations scaled by `gamma` and shifted by `beta`, per channel: the group
/// norm's output before its ReLU, and what the backward pass takes the ReLU's mask from.
fn scale_shift<B: Backend>(
    normed: Tensor<B, 4>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
) -> Tensor<B, 4> {
    normed * per_channel(gamma) + per_channel(beta)
}

pub fn group_norm<B: Backend>(
    x: FloatTensor<B>,
    [gamma, beta]: [FloatTensor<B>; 2],
    groups: usize,
    relu: bool,
) -> FloatTensor<B> {
    let (x, shape) = group_rows::<B>(x, groups);
    let (normed, _) = normalise(x);
    let normed: Tensor<B, 4> = float(restore(normed, shape));
    let y = scale_shift(normed, gamma, beta);
    let y = if relu { activation::relu(y) } else { y };
    y.into_primitive().tensor()
}

pub fn group_norm_backward<B: Backend>(
    x: FloatTensor<B>,
    [gamma, beta]: [FloatTensor<B>; 2],
    grad: FloatTensor<B>,
    groups: usize,
    relu: bool,
) -> [FloatTensor<B>; 3] {
    let grad: Tensor<B, 4> = float(grad);
    let (x, shape) = group_rows::<B>(x, groups);
    let (normed, inv_std) = normalise(x);
    let normed4: Tensor<B, 4> = float(restore(normed.clone(), shape.clone()));
    // Through the ReLU first: the gradient passes where the output is positive, the output
    // taken from the rows just normalised (normalising them again would cost two more
    // reductions on a GPU, where each is a kernel launch).
    let grad = if relu {
        let y = scale_shift(normed4.clone(), gamma.clone(), beta);
        grad * y.greater_elem(0.0).float()
    } else {
        grad
    };
    // Over the samples and positions, as two reductions: `N × C × H·W`.
    let channel_sum = |t: Tensor<B, 4>| {
        let [n, c, h, w] = t.dims();
        t.reshape([n, c, h * w]).sum_dim(2).sum_dim(0).reshape([c])
    };
    let d_gamma = channel_sum(grad.clone() * normed4);
    let d_beta = channel_sum(grad.clone());
    let (d_normed, _) = group_rows::<B>(
        (grad * per_channel(gamma)).into_primitive().tensor(),
        groups,
    );
    let d_x = normalise_backward(d_normed, normed, inv_std);
    [
        restore(d_x, shape),
        d_gamma.into_primitive().tensor(),
        d_beta.into_primitive().tensor(),
    ]
}

/// `N × C × H × W` as `N × C × H/k × k × W/k × k` blocks.
fn pool_blocks<B: Backend>(x: FloatTensor<B>, k: usize) -> Tensor<B, 6> {
    let s = x.shape();
    float(B::float_reshape(
        x,
        Shape::new([s[0], s[1], s[2] / k, k, s[3] / k, k]),
    ))
}

pub fn pool<B: Backend>(x: FloatTensor<B>, kind: Pool, k: usize) -> FloatTensor<B> {
    let s = x.shape();
    let blocks = pool_blocks::<B>(x, k);
    let pooled = match kind {
        Pool::Max => blocks.max_dim(5).max_dim(3),
        Pool::Average => blocks.mean_dim(5).mean_dim(3),
    };
    B::float_reshape(
        pooled.into_primitive().tensor(),
        Shape::new([s[0], s[1], s[2] / k, s[3] / k]),
    )
}

pub fn pool_backward<B: Backend>(
    x: FloatTensor<B>,
    grad: FloatTensor<B>,
    kind: Pool,
    k: usize,
) -> FloatTensor<B> {
    let s = x.shape();
    let blocked = [s[0], s[1], s[2] / k, 1, s[3] / k, 1];
    let grad: Tensor<B, 6> = float(B::float_reshape(grad, Shape::new(blocked)));
    let blocks = pool_blocks::<B>(x, k);
    let dims = blocks.dims();
    let d_blocks = match kind {
        // The gradient goes to every position that holds its block's maximum (one, for
        // values without ties).
        Pool::Max => {
            let max = blocks.clone().max_dim(5).max_dim(3);
            let hits = blocks.equal(max.expand(dims)).float();
            hits * grad.expand(dims)
        }
        Pool::Average => grad.expand(blocks.dims()).div_scalar((k * k) as f64),
    };
    B::float_reshape(d_blocks.into_primitive().tensor(), s)
}

/// burn's `max_pool2d` over `window`.
pub fn max_pool<B: Backend>(x: FloatTensor<B>, window: MaxWindow) -> FloatTensor<B> {
    let [k, s, p, d] = window.burn();
    B::max_pool2d(x, k, s, p, d, false)
}

/// The gradient of [`max_pool`] with respect to `x`, through burn's indices.
pub fn max_pool_backward<B: Backend>(
    x: FloatTensor<B>,
    grad: FloatTensor<B>,
    window: MaxWindow,
) -> FloatTensor<B> {
    let [k, s, p, d] = window.burn();
    let indices = B::max_pool2d_with_indices(x.clone(), k, s, p, d, false).indices;
    B::max_pool2d_with_indices_backward(x, k, s, p, d, false, grad, indices).x_grad
}
