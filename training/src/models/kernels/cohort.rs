//! The layers' kernels for a cohort: several clients with the same sub-model shape trained as
//! one computation (docs/design.md, "Cohorts"). Every parameter of a cohort's model carries a
//! leading client axis (`C × …`), and its activations hold the clients' samples one client after
//! another along dimension 0, client c owning the `rows[c]` rows that follow those of clients
//! 0..c (clients hold different sample counts, so the last batch of an epoch differs).
//!
//! Two ways to run them. One client at a time ([`linear`], [`layer_norm`], …): the one-client
//! kernel of [`Kernels`] on each client's rows and parameters, the results joined; a client's
//! numbers are then exactly those it gets trained alone, which is what the CPU backend needs (a
//! cohort and one-by-one training give the same model bytes), and its override uses only
//! these. Batched ([`batched_linear`], …), the default of every other backend where the clients
//! own equal rows: the clients' rows as a leading axis and one batched product or broadcast
//! per operation, whatever the cohort's size (a GPU's launches do not grow with it); a
//! convolution as each client's patch matrix times its filters, one batched product (a GPU's
//! implicit-GEMM convolution takes one client's filters per launch, so one client at a time it
//! cost C launches per pass). Under
//! [`Autodiff`](burn::backend::autodiff::Autodiff) a cohort kernel is one graph node
//! (`autodiff.rs`), so the graph does not grow with the cohort either.

use super::composite::{
    group_rows, normalise, normalise_backward, restore, rows, strided_input_grad,
};
use super::{ConvGeometry, Kernels, float, with_row_len};
use burn::tensor::Tensor;
use burn::tensor::ops::FloatTensor;
use burn::tensor::ops::PadMode;
use burn::tensor::{Shape, Slice, TensorMetadata};
use std::sync::Arc;

/// The clients of a cohort computation and how many rows of dimension 0 each owns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cohort {
    rows: Arc<[usize]>,
}

impl Cohort {
    /// A cohort of `rows.len()` clients; panics on no client, as no computation has none.
    pub fn new(rows: impl Into<Arc<[usize]>>) -> Self {
        let rows = rows.into();
        assert!(!rows.is_empty(), "a cohort has at least one client");
        Self { rows }
    }

    /// One client owning `rows` rows.
    pub fn single(rows: usize) -> Self {
        Self::new(vec![rows])
    }

    /// `clients` clients of one row each: the layout of a stacked parameter (`C × …`).
    pub fn stacked(clients: usize) -> Self {
        Self::new(vec![1; clients])
    }

    /// The number of clients C.
    pub fn clients(&self) -> usize {
        self.rows.len()
    }

    /// Rows of dimension 0 per client.
    pub fn rows(&self) -> &[usize] {
        &self.rows
    }

    /// All rows.
    pub fn total(&self) -> usize {
        self.rows.iter().sum()
    }

    /// The same cohort with each client's rows multiplied by `factor` (samples → positions of
    /// a sequence model, whose activations a reshape spreads over `samples × positions` rows).
    pub fn scaled(&self, factor: usize) -> Self {
        Self::new(self.rows.iter().map(|r| r * factor).collect::<Vec<_>>())
    }

    /// The rows every client owns, if they all own the same number.
    pub fn uniform(&self) -> Option<usize> {
        let first = self.rows[0];
        self.rows.iter().all(|&r| r == first).then_some(first)
    }

    /// The index of the client of every row, in order.
    pub fn client_of_rows(&self) -> Vec<i64> {
        self.rows
            .iter()
            .enumerate()
            .flat_map(|(c, &r)| std::iter::repeat_n(c as i64, r))
            .collect()
    }
}

/// Client c's rows of `t` (dimension 0), for each client; a single client's is `t` itself.
pub fn split<B: Kernels>(t: FloatTensor<B>, cohort: &Cohort) -> Vec<FloatTensor<B>> {
    if cohort.clients() == 1 {
        return vec![t];
    }
    let dims = t.shape().num_dims();
    let mut start = 0;
    cohort
        .rows()
        .iter()
        .map(|&r| {
            let mut slices = vec![Slice::new(0, None, 1); dims];
            slices[0] = Slice::new(start as isize, Some((start + r) as isize), 1);
            start += r;
            B::float_slice(t.clone(), &slices)
        })
        .collect()
}

/// Client c's slice of a stacked parameter (`C × …` → `…`), through
/// [`Kernels::cohort_client`].
pub fn client<B: Kernels>(stacked: &FloatTensor<B>, c: usize) -> FloatTensor<B> {
    B::cohort_client(stacked.clone(), c)
}

/// The default [`Kernels::cohort_client`]: a slice of dimension 0, reshaped.
pub fn slice_client<B: Kernels>(stacked: FloatTensor<B>, c: usize) -> FloatTensor<B> {
    let shape = stacked.shape();
    let dims = shape.num_dims();
    let mut slices = vec![Slice::new(0, None, 1); dims];
    slices[0] = Slice::new(c as isize, Some(c as isize + 1), 1);
    let inner: Vec<usize> = (1..dims).map(|i| shape[i]).collect();
    B::float_reshape(B::float_slice(stacked, &slices), Shape::from(inner))
}

/// The clients' results joined along dimension 0 (rows one client after another).
pub fn join<B: Kernels>(mut parts: Vec<FloatTensor<B>>) -> FloatTensor<B> {
    if parts.len() == 1 {
        return parts.pop().expect("one part");
    }
    B::float_cat(parts, 0)
}

/// Per-client tensors stacked along a new leading client axis (`…` → `C × …`): the default
/// [`Kernels::cohort_stack`].
pub fn stack<B: Kernels>(parts: Vec<FloatTensor<B>>) -> FloatTensor<B> {
    let unsqueezed = parts
        .into_iter()
        .map(|p| {
            let shape = p.shape();
            let dims: Vec<usize> = std::iter::once(1)
                .chain((0..shape.num_dims()).map(|i| shape[i]))
                .collect();
            B::float_reshape(p, Shape::from(dims))
        })
        .collect();
    join::<B>(unsqueezed)
}

/// [`Kernels::cohort_linear`] one client at a time.
pub fn linear<B: Kernels>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    cohort: &Cohort,
) -> FloatTensor<B> {
    let parts = split::<B>(x, cohort)
        .into_iter()
        .enumerate()
        .map(|(c, x)| {
            B::fused_linear(
                x,
                client::<B>(&w, c),
                bias.as_ref().map(|b| client::<B>(b, c)),
            )
        })
        .collect();
    join::<B>(parts)
}

/// [`Kernels::cohort_linear_backward`] one client at a time.
pub fn linear_backward<B: Kernels>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    grad: FloatTensor<B>,
    with_bias: bool,
    cohort: &Cohort,
) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
    let (mut d_x, mut d_w, mut d_b) = (Vec::new(), Vec::new(), Vec::new());
    let grads = split::<B>(grad, cohort);
    for (c, (x, g)) in split::<B>(x, cohort).into_iter().zip(grads).enumerate() {
        if with_bias {
            d_b.push(B::fused_bias_backward(g.clone()));
        }
        let [dx, dw] = B::fused_linear_backward(x, client::<B>(&w, c), g);
        d_x.push(dx);
        d_w.push(dw);
    }
    let d_b = with_bias.then(|| B::cohort_stack(d_b));
    (join::<B>(d_x), B::cohort_stack(d_w), d_b)
}

/// [`Kernels::cohort_layer_norm`] one client at a time.
pub fn layer_norm<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    cohort: &Cohort,
) -> FloatTensor<B> {
    let parts = split::<B>(x, cohort)
        .into_iter()
        .enumerate()
        .map(|(c, x)| B::fused_layer_norm(x, client::<B>(&gamma, c), client::<B>(&beta, c)))
        .collect();
    join::<B>(parts)
}

/// [`Kernels::cohort_layer_norm_backward`] one client at a time.
pub fn layer_norm_backward<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    grad: FloatTensor<B>,
    cohort: &Cohort,
) -> [FloatTensor<B>; 3] {
    let (mut d_x, mut d_gamma, mut d_beta) = (Vec::new(), Vec::new(), Vec::new());
    let grads = split::<B>(grad, cohort);
    for (c, (x, g)) in split::<B>(x, cohort).into_iter().zip(grads).enumerate() {
        let [dx, dg, db] = B::fused_layer_norm_backward(x, client::<B>(&gamma, c), g);
        d_x.push(dx);
        d_gamma.push(dg);
        d_beta.push(db);
    }
    [
        join::<B>(d_x),
        B::cohort_stack(d_gamma),
        B::cohort_stack(d_beta),
    ]
}

/// [`Kernels::cohort_conv2d`] one client at a time.
pub fn conv2d<B: Kernels>(
    x: FloatTensor<B>,
    filters: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    geometry: ConvGeometry,
    cohort: &Cohort,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let (mut ys, mut saved) = (Vec::new(), Vec::new());
    for (c, x) in split::<B>(x, cohort).into_iter().enumerate() {
        let bias = bias.as_ref().map(|b| client::<B>(b, c));
        let [y, s] = B::fused_conv2d(x, client::<B>(&filters, c), bias, geometry);
        ys.push(y);
        saved.push(s);
    }
    (join::<B>(ys), saved)
}

/// [`Kernels::cohort_conv2d_backward`] one client at a time.
pub fn conv2d_backward<B: Kernels>(
    saved: Vec<FloatTensor<B>>,
    input: Shape,
    filters: FloatTensor<B>,
    grad: FloatTensor<B>,
    geometry: ConvGeometry,
    with_bias: bool,
    cohort: &Cohort,
) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
    let (mut d_x, mut d_f, mut d_b) = (Vec::new(), Vec::new(), Vec::new());
    let grads = split::<B>(grad, cohort);
    for (c, (s, g)) in saved.into_iter().zip(grads).enumerate() {
        let mut dims: Vec<usize> = (0..input.num_dims()).map(|i| input[i]).collect();
        dims[0] = cohort.rows()[c];
        let shape = Shape::from(dims);
        let (dx, df, db) =
            B::fused_conv2d_backward(s, shape, client::<B>(&filters, c), g, geometry, with_bias);
        d_x.push(dx);
        d_f.push(df);
        d_b.extend(db);
    }
    (
        join::<B>(d_x),
        B::cohort_stack(d_f),
        with_bias.then(|| B::cohort_stack(d_b)),
    )
}

/// [`Kernels::cohort_group_norm`] one client at a time.
pub fn group_norm<B: Kernels>(
    x: FloatTensor<B>,
    [gamma, beta]: [FloatTensor<B>; 2],
    groups: usize,
    relu: bool,
    cohort: &Cohort,
) -> FloatTensor<B> {
    let parts = split::<B>(x, cohort)
        .into_iter()
        .enumerate()
        .map(|(c, x)| {
            let params = [client::<B>(&gamma, c), client::<B>(&beta, c)];
            B::fused_group_norm(x, params, groups, relu)
        })
        .collect();
    join::<B>(parts)
}

/// [`Kernels::cohort_group_norm_backward`] one client at a time.
pub fn group_norm_backward<B: Kernels>(
    x: FloatTensor<B>,
    [gamma, beta]: [FloatTensor<B>; 2],
    grad: FloatTensor<B>,
    groups: usize,
    relu: bool,
    cohort: &Cohort,
) -> [FloatTensor<B>; 3] {
    let (mut d_x, mut d_gamma, mut d_beta) = (Vec::new(), Vec::new(), Vec::new());
    let grads = split::<B>(grad, cohort);
    for (c, (x, g)) in split::<B>(x, cohort).into_iter().zip(grads).enumerate() {
        let params = [client::<B>(&gamma, c), client::<B>(&beta, c)];
        let [dx, dg, db] = B::fused_group_norm_backward(x, params, g, groups, relu);
        d_x.push(dx);
        d_gamma.push(dg);
        d_beta.push(db);
    }
    [
        join::<B>(d_x),
        B::cohort_stack(d_gamma),
        B::cohort_stack(d_beta),
    ]
}

/// Whether a cohort runs batched: several clients owning equal rows.
pub fn batches(cohort: &Cohort) -> bool {
    cohort.clients() > 1 && cohort.uniform().is_some()
}

/// Whether a cohort's convolution runs batched: [`batches`], and a padding no wider than the
/// kernel less one, so that the input gradient is itself a convolution of the output gradient
/// (with padding `kernel − 1 − padding`). Every shipped model's convolutions qualify.
pub fn batches_conv(cohort: &Cohort, geometry: ConvGeometry) -> bool {
    batches(cohort) && (0..2).all(|i| geometry.padding[i] < geometry.kernel[i])
}

/// `x` (the clients' equal rows of dimension 0, any middle dimensions, last of length `k`) as
/// `C × R × k`, and its shape.
fn by_client<B: Kernels>(x: FloatTensor<B>, clients: usize) -> (Tensor<B, 3>, Shape) {
    let shape = x.shape();
    let cols = shape[shape.num_dims() - 1];
    let per_client = shape.num_elements() / (clients * cols);
    let t = B::float_reshape(x, Shape::new([clients, per_client, cols]));
    (float(t), shape)
}

/// A stacked `C × k` parameter as `C × 1 × k`, to broadcast over each client's rows.
fn per_client_row<B: Kernels>(p: FloatTensor<B>) -> Tensor<B, 3> {
    let t: Tensor<B, 2> = float(p);
    t.unsqueeze_dim(1)
}

/// [`Kernels::cohort_linear`] as one batched product.
pub fn batched_linear<B: Kernels>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    cohort: &Cohort,
) -> FloatTensor<B> {
    let (x, shape) = by_client::<B>(x, cohort.clients());
    let w: Tensor<B, 3> = float(w);
    let out = with_row_len(&shape, w.dims()[1]);
    let y = x.matmul(w.swap_dims(1, 2));
    let y = match bias {
        Some(b) => y + per_client_row::<B>(b),
        None => y,
    };
    B::float_reshape(y.into_primitive().tensor(), out)
}

/// [`Kernels::cohort_linear_backward`] as batched products.
pub fn batched_linear_backward<B: Kernels>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    grad: FloatTensor<B>,
    with_bias: bool,
    cohort: &Cohort,
) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
    let clients = cohort.clients();
    let (x, shape) = by_client::<B>(x, clients);
    let (grad, _) = by_client::<B>(grad, clients);
    let w: Tensor<B, 3> = float(w);
    let outputs = w.dims()[1];
    let d_x = B::float_reshape(grad.clone().matmul(w).into_primitive().tensor(), shape);
    let d_w = grad.clone().swap_dims(1, 2).matmul(x);
    let d_b = with_bias.then(|| {
        let sums = grad.sum_dim(1).reshape([clients, outputs]);
        sums.into_primitive().tensor()
    });
    (d_x, d_w.into_primitive().tensor(), d_b)
}

/// [`Kernels::cohort_layer_norm`] batched: every row normalised at once, then each client's
/// scale and shift broadcast over its rows.
pub fn batched_layer_norm<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    cohort: &Cohort,
) -> FloatTensor<B> {
    let (x, shape) = rows::<B>(x);
    let [all, cols] = x.dims();
    let clients = cohort.clients();
    let (normed, _) = normalise(x);
    let normed = normed.reshape([clients, all / clients, cols]);
    let y = normed * per_client_row::<B>(gamma) + per_client_row::<B>(beta);
    B::float_reshape(y.into_primitive().tensor(), shape)
}

/// [`Kernels::cohort_layer_norm_backward`] batched.
pub fn batched_layer_norm_backward<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    grad: FloatTensor<B>,
    cohort: &Cohort,
) -> [FloatTensor<B>; 3] {
    let (x, shape) = rows::<B>(x);
    let (grad, _) = rows::<B>(grad);
    let [all, cols] = x.dims();
    let clients = cohort.clients();
    let by_client = |t: Tensor<B, 2>| t.reshape([clients, all / clients, cols]);
    let (normed, inv_std) = normalise(x);
    let (grad3, normed3) = (by_client(grad), by_client(normed.clone()));
    let d_gamma = (grad3.clone() * normed3)
        .sum_dim(1)
        .reshape([clients, cols]);
    let d_beta = grad3.clone().sum_dim(1).reshape([clients, cols]);
    let d_normed = (grad3 * per_client_row::<B>(gamma)).reshape([all, cols]);
    let d_x = normalise_backward(d_normed, normed, inv_std);
    [
        restore(d_x, shape),
        d_gamma.into_primitive().tensor(),
        d_beta.into_primitive().tensor(),
    ]
}

/// `N × ch × H × W` activations as `C × N/C × ch × H·W`.
fn by_client_channels<B: Kernels>(t: Tensor<B, 4>, clients: usize) -> Tensor<B, 4> {
    let [n, ch, h, w] = t.dims();
    t.reshape([clients, n / clients, ch, h * w])
}

/// A stacked `C × ch` parameter as `C × 1 × ch × 1`.
fn per_client_channel<B: Kernels>(p: FloatTensor<B>) -> Tensor<B, 4> {
    let t: Tensor<B, 2> = float(p);
    let [clients, ch] = t.dims();
    t.reshape([clients, 1, ch, 1])
}

/// Normalised activations (`C × N/C × ch × H·W`) scaled and shifted by each client's stacked
/// `gamma` and `beta` (`C × ch`): the group norm's output before its ReLU, and what the
/// backward pass takes the ReLU's mask from.
fn client_scale_shift<B: Kernels>(
    normed: Tensor<B, 4>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
) -> Tensor<B, 4> {
    normed * per_client_channel::<B>(gamma) + per_client_channel::<B>(beta)
}

/// [`Kernels::cohort_group_norm`] batched: every sample normalised at once, then each client's
/// scale and shift broadcast over its samples.
pub fn batched_group_norm<B: Kernels>(
    x: FloatTensor<B>,
    [gamma, beta]: [FloatTensor<B>; 2],
    groups: usize,
    relu: bool,
    cohort: &Cohort,
) -> FloatTensor<B> {
    let clients = cohort.clients();
    let (x, shape) = group_rows::<B>(x, groups);
    let (normed, _) = normalise(x);
    let normed: Tensor<B, 4> = float(restore(normed, shape.clone()));
    let y = client_scale_shift(by_client_channels(normed, clients), gamma, beta);
    let y: Tensor<B, 4> = float(B::float_reshape(y.into_primitive().tensor(), shape));
    let y = if relu {
        burn::tensor::activation::relu(y)
    } else {
        y
    };
    y.into_primitive().tensor()
}

/// [`Kernels::cohort_group_norm_backward`] batched.
pub fn batched_group_norm_backward<B: Kernels>(
    x: FloatTensor<B>,
    [gamma, beta]: [FloatTensor<B>; 2],
    grad: FloatTensor<B>,
    groups: usize,
    relu: bool,
    cohort: &Cohort,
) -> [FloatTensor<B>; 3] {
    let clients = cohort.clients();
    let channels = gamma.shape()[1];
    let grad: Tensor<B, 4> = float(grad);
    let (x, shape) = group_rows::<B>(x, groups);
    let (normed, inv_std) = normalise(x);
    let normed4: Tensor<B, 4> = float(restore(normed.clone(), shape.clone()));
    // Through the ReLU first: the gradient passes where the output is positive, the output
    // taken from the rows just normalised (as `composite::group_norm_backward`).
    let grad_c = by_client_channels(grad, clients);
    let grad_c = if relu {
        let y = client_scale_shift(
            by_client_channels(normed4.clone(), clients),
            gamma.clone(),
            beta,
        );
        grad_c * y.greater_elem(0.0).float()
    } else {
        grad_c
    };
    let channel_sum = |t: Tensor<B, 4>| t.sum_dim(1).sum_dim(3).reshape([clients, channels]);
    let d_gamma = channel_sum(grad_c.clone() * by_client_channels(normed4, clients));
    let d_beta = channel_sum(grad_c.clone());
    let d_normed = (grad_c * per_client_channel::<B>(gamma))
        .into_primitive()
        .tensor();
    let (d_normed, _) = group_rows::<B>(B::float_reshape(d_normed, shape.clone()), groups);
    let d_x = normalise_backward(d_normed, normed, inv_std);
    [
        restore(d_x, shape),
        d_gamma.into_primitive().tensor(),
        d_beta.into_primitive().tensor(),
    ]
}

/// `x` (`N × C_in × H × W`, the clients' equal rows one after another) as each client's patch
/// matrix, `C × (N/C·H'·W') × (C_in·kh·kw)`, columns ordered as a filter matrix's rows: the
/// windows are strided views of the zero-padded input (`unfold`), made contiguous once.
fn patches<B: Kernels>(x: Tensor<B, 4>, clients: usize, geometry: ConvGeometry) -> Tensor<B, 3> {
    let [n, c_in, h, w] = x.dims();
    let ([kh, kw], [sh, sw], [ph, pw]) = (geometry.kernel, geometry.stride, geometry.padding);
    let [h_out, w_out] = geometry.output([h, w]);
    let x = if ph + pw > 0 {
        x.pad([(ph, ph), (pw, pw)], PadMode::Constant(0.0))
    } else {
        x
    };
    // N × C_in × H' × W' × kh × kw
    let windows: Tensor<B, 6> = x.unfold::<5, _>(2, kh, sh).unfold(3, kw, sw);
    windows.permute([0, 2, 3, 1, 4, 5]).reshape([
        clients,
        n / clients * h_out * w_out,
        c_in * kh * kw,
    ])
}

/// The convolution of each client's rows of `x` by its `c_out × (C_in·kh·kw)` filter matrix
/// (`filters`: `C × c_out × (C_in·kh·kw)`), plus its bias (`C × c_out`): one batched product.
fn batched_conv<B: Kernels>(
    x: Tensor<B, 4>,
    filters: Tensor<B, 3>,
    bias: Option<Tensor<B, 2>>,
    geometry: ConvGeometry,
) -> Tensor<B, 4> {
    let [n, _, h, w] = x.dims();
    let [clients, c_out, _] = filters.dims();
    let [h_out, w_out] = geometry.output([h, w]);
    let y = patches(x, clients, geometry).matmul(filters.swap_dims(1, 2));
    let y = match bias {
        Some(b) => y + b.unsqueeze_dim(1),
        None => y,
    };
    y.reshape([n, h_out, w_out, c_out]).permute([0, 3, 1, 2])
}

/// [`Kernels::cohort_conv2d`] as one batched product; the backward pass keeps the input.
pub fn batched_conv2d<B: Kernels>(
    x: FloatTensor<B>,
    filters: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    geometry: ConvGeometry,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let y = batched_conv::<B>(float(x.clone()), float(filters), bias.map(float), geometry);
    (y.into_primitive().tensor(), vec![x])
}

/// [`Kernels::cohort_conv2d_backward`] batched: the filter gradient as each client's output
/// gradient times its patch matrix; the input gradient as the stride-1 convolution of the
/// output gradient (spread with zeros where the stride skipped positions) by the client's
/// filters flipped in space with their channel axes swapped, padded by `kernel − 1 − padding`.
pub fn batched_conv2d_backward<B: Kernels>(
    saved: Vec<FloatTensor<B>>,
    input: Shape,
    filters: FloatTensor<B>,
    grad: FloatTensor<B>,
    geometry: ConvGeometry,
    with_bias: bool,
) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
    let [x]: [FloatTensor<B>; 1] = saved.try_into().unwrap_or_else(|saved: Vec<_>| {
        panic!(
            "a batched convolution keeps its input alone, not {} tensors",
            saved.len()
        )
    });
    let filters: Tensor<B, 3> = float(filters);
    let [clients, c_out, _] = filters.dims();
    let c_in = input[1];
    let ([kh, kw], [ph, pw]) = (geometry.kernel, geometry.padding);
    let g: Tensor<B, 4> = float(grad.clone());
    let [n, _, h_out, w_out] = g.dims();
    let g_rows = g
        .permute([0, 2, 3, 1])
        .reshape([clients, n / clients * h_out * w_out, c_out]);
    let d_bias = with_bias.then(|| g_rows.clone().sum_dim(1).reshape([clients, c_out]));
    let d_filters = g_rows
        .swap_dims(1, 2)
        .matmul(patches(float(x), clients, geometry));
    let flipped = filters
        .reshape([clients, c_out, c_in, kh, kw])
        .flip([3, 4])
        .swap_dims(1, 2)
        .reshape([clients, c_in, c_out * kh * kw]);
    let adjoint = ConvGeometry {
        kernel: geometry.kernel,
        stride: [1, 1],
        padding: [kh - 1 - ph, kw - 1 - pw],
    };
    let stride_one = |spread: FloatTensor<B>, _| {
        batched_conv::<B>(float(spread), flipped, None, adjoint)
            .into_primitive()
            .tensor()
    };
    let d_x = if geometry.stride == [1, 1] {
        stride_one(grad, geometry.options())
    } else {
        strided_input_grad::<B>(grad, &input, geometry, stride_one)
    };
    (
        d_x,
        d_filters.into_primitive().tensor(),
        d_bias.map(|d_bias| d_bias.into_primitive().tensor()),
    )
}
