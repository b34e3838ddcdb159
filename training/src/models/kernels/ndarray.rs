//! The fused kernels of the CPU backend, `NdArray<f32>`: one pass per element-wise kernel over
//! contiguous rows, and the `gemm` crate's strided product for the matrix products.
//!
//! Why: burn's tensor operations cost 5–10 allocating passes per kernel, and burn-ndarray's
//! matmul copies transposed operands; here transposes and per-head column bands are read in
//! place. The loops must agree with [`composite`](super::composite) (see the tests).

use super::{ConvGeometry, GELU_A, GELU_C, Kernels, NORM_EPS, Pool, with_row_len};
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
    1.0 / (1.0 + exp((-2.0 * u).min(80.0)))
}

/// `eˣ` to within 2 ulp (Cephes' `expf`: x = k·ln 2 + r, |r| ≤ ln 2 / 2, a degree-7 polynomial
/// in r, scaled by 2ᵏ through the exponent bits), for x in [−87.3, 88]; it returns e^−87.3
/// ≈ 1.2·10⁻³⁸ below that range (not 0) and e⁸⁸ above it (every caller stays below 80).
///
/// Why not `f32::exp`: that is a call into libm per element, which keeps the GELU and softmax
/// loops scalar (6% of a char-transformer step was `__expf_fma`); this is plain arithmetic the
/// compiler vectorises with the rest of the loop.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two, so that k · LN2_HI is exact for |k| < 2⁹.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2²³ rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.0);
    let shifted = x * LOG2_E + ROUND;
    let k = shifted - ROUND;
    // k as an integer, read from the mantissa of `shifted` (a float → int cast would be
    // saturating, per lane and not vectorised).
    let k_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = x - k * LN2_HI - k * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((k_int + 127) as u32) << 23)
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
    fn fused_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let shape = x.shape();
        let inputs = row_len(&shape);
        let x = Rows::of(&x);
        let w = Strided::of(&w);
        assert_eq!(w.cols, inputs, "linear: weight width vs input width");
        let rows = shape.num_elements() / inputs;
        // y = x · wᵀ (wᵀ is w read with its strides swapped), added to the bias laid into
        // every row first, if any.
        let (x, w_t) = ((&x.values[..], x.rs, x.cs), (&w.values[..], w.cs, w.rs));
        let mkn = [rows, inputs, w.rows];
        let y = match &bias {
            Some(bias) => {
                let bias = values(bias);
                assert_eq!(bias.len(), w.rows, "linear: bias length vs output width");
                let mut y = bias.repeat(rows);
                gemm_into(mkn, 1.0, x, w_t, (&mut y, w.rows), true);
                y
            }
            None => gemm_fresh(mkn, 1.0, x, w_t),
        };
        tensor(y, with_row_len(&shape, w.rows))
    }

    fn fused_linear_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let shape = x.shape();
        let inputs = row_len(&shape);
        let (x, grad) = (Rows::of(&x), values(&grad));
        let w = Strided::of(&w);
        let rows = shape.num_elements() / inputs;
        let outputs = w.rows;
        let d_x = gemm_fresh(
            [rows, outputs, inputs],
            1.0,
            (&grad, outputs as isize, 1),
            (&w.values, w.rs, w.cs),
        );
        let d_w = gemm_fresh(
            [outputs, rows, inputs],
            1.0,
            (&grad, 1, outputs as isize),
            (&x.values, x.rs, x.cs),
        );
        [
            tensor(d_x, shape),
            tensor(d_w, Shape::new([outputs, inputs])),
        ]
    }

    fn fused_bias_backward(grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let outputs = row_len(&grad.shape());
        let grad = values(&grad);
        let mut d_bias = vec![0.0f32; outputs];
        for row in grad.chunks_exact(outputs) {
            d_bias.iter_mut().zip(row).for_each(|(s, g)| *s += g);
        }
        tensor(d_bias, Shape::new([outputs]))
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
        let rows = QueryBands::of(t, causal);
        for (block, p) in probs.chunks_exact_mut(t * t).enumerate() {
            // Head h of sample b is the column band [h·w, (h+1)·w) of the sample's T × d rows.
            let base = (block / heads) * t * d + (block % heads) * width;
            let d = d as isize;
            for (first, count, keys) in rows.bands() {
                gemm(
                    [count, width, keys],
                    scale,
                    (&q[base + first * d as usize..], d, 1),
                    (&k[base..], 1, d),
                    &mut p[first * t..],
                    t,
                );
            }
            softmax_rows(p, t, causal);
            for (first, count, keys) in rows.bands() {
                gemm(
                    [count, keys, width],
                    1.0,
                    (&p[first * t..], t as isize, 1),
                    (&v[base..], d, 1),
                    &mut out[base + first * d as usize..],
                    d as usize,
                );
            }
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
        causal: bool,
    ) -> [FloatTensor<Self>; 3] {
        let shape = q.shape();
        let [t, d] = [shape[1], shape[2]];
        let heads = probs.shape()[1];
        let (width, scale) = head_width(d, heads);
        let (q, k, v) = (values(&q), values(&k), values(&v));
        let (probs, grad) = (values(&probs), values(&grad));
        let [mut d_q, mut d_k, mut d_v] = [(); 3].map(|_| vec![0.0; q.len()]);
        // The masked block of dP is never computed and stays zero (its probabilities are zero,
        // so the softmax backward keeps it zero too).
        let mut d_scores = vec![0.0; t * t];
        let rows = QueryBands::of(t, causal);
        for (block, p) in probs.chunks_exact(t * t).enumerate() {
            let base = (block / heads) * t * d + (block % heads) * width;
            let (du, tt) = (d, t as isize);
            let d = d as isize;
            let g = &grad[base..];
            // dP = dO · Vᵀ, then through the softmax; the score scale goes into dQ and dK.
            for (first, count, keys) in rows.bands() {
                gemm(
                    [count, width, keys],
                    1.0,
                    (&g[first * du..], d, 1),
                    (&v[base..], 1, d),
                    &mut d_scores[first * t..],
                    t,
                );
            }
            softmax_backward_rows(p, &mut d_scores, t);
            let ds = &d_scores;
            // dQ = dS · K, by bands of query rows.
            for (first, count, keys) in rows.bands() {
                gemm(
                    [count, keys, width],
                    scale,
                    (&ds[first * t..], tt, 1),
                    (&k[base..], d, 1),
                    &mut d_q[base + first * du..],
                    du,
                );
            }
            // dK = dSᵀ · Q and dV = Pᵀ · dO, by bands of keys: key j gets queries `from`..T.
            for (first, count, from) in rows.key_bands() {
                let queries = t - from;
                gemm(
                    [count, queries, width],
                    scale,
                    (&ds[from * t + first..], 1, tt),
                    (&q[base + from * du..], d, 1),
                    &mut d_k[base + first * du..],
                    du,
                );
                gemm(
                    [count, queries, width],
                    1.0,
                    (&p[from * t + first..], 1, tt),
                    (&g[from * du..], d, 1),
                    &mut d_v[base + first * du..],
                    du,
                );
            }
        }
        [d_q, d_k, d_v].map(|values| tensor(values, shape.clone()))
    }

    fn fused_conv2d(
        x: FloatTensor<Self>,
        filters: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        geometry: ConvGeometry,
    ) -> [FloatTensor<Self>; 2] {
        let image = Image::of(&x.shape(), geometry);
        let f = Strided::of(&filters);
        assert_eq!(f.cols, image.patch_len(), "conv2d: filter width vs C·kh·kw");
        let cols = image.im2col(&values(&x));
        let positions = image.positions();
        // Y = F · cols (c_out × N·P), then laid out as N × c_out × P.
        let y = gemm_fresh(
            [f.rows, image.patch_len(), positions],
            1.0,
            (&f.values, f.rs, f.cs),
            (&cols, positions as isize, 1),
        );
        let [oh, ow] = image.out;
        let mut y = image.channels_to_batch(&y, f.rows);
        if let Some(bias) = bias {
            let bias = values(&bias);
            assert_eq!(bias.len(), f.rows, "conv2d: bias length vs output channels");
            for (plane, b) in y.chunks_exact_mut(oh * ow).zip(bias.iter().cycle()) {
                plane.iter_mut().for_each(|v| *v += b);
            }
        }
        [
            tensor(y, Shape::new([image.n, f.rows, oh, ow])),
            tensor(cols, Shape::new([image.patch_len(), positions])),
        ]
    }

    /// `saved` is the forward pass's patch matrix.
    fn fused_conv2d_backward(
        saved: FloatTensor<Self>,
        shape: Shape,
        filters: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geometry: ConvGeometry,
    ) -> [FloatTensor<Self>; 3] {
        let image = Image::of(&shape, geometry);
        let f = Strided::of(&filters);
        let (patch, positions, c_out) = (image.patch_len(), image.positions(), f.rows);
        let cols = values(&saved);
        assert_eq!(
            cols.len(),
            patch * positions,
            "conv2d backward: the saved patch matrix does not match the input's shape"
        );
        let grad = image.batch_to_channels(&values(&grad), c_out);
        let d_bias = grad.chunks_exact(positions).map(lane_sum).collect();
        let g = (grad.as_slice(), positions as isize, 1);
        // dF = dY · colsᵀ, d cols = Fᵀ · dY, then the patches are added back into dX.
        let d_filters = gemm_fresh(
            [c_out, positions, patch],
            1.0,
            g,
            (&cols, 1, positions as isize),
        );
        let d_cols = gemm_fresh([patch, c_out, positions], 1.0, (&f.values, f.cs, f.rs), g);
        [
            tensor(image.col2im(d_cols), shape),
            tensor(d_filters, Shape::new([c_out, patch])),
            tensor(d_bias, Shape::new([c_out])),
        ]
    }

    fn fused_group_norm(
        x: FloatTensor<Self>,
        [gamma, beta]: [FloatTensor<Self>; 2],
        groups: usize,
        relu: bool,
    ) -> FloatTensor<Self> {
        let shape = x.shape();
        let (gamma, beta) = (values(&gamma), values(&beta));
        let (plane, per_group) = group_layout(&shape, groups);
        let mut y = values(&x).into_owned();
        for (i, group) in y.chunks_exact_mut(per_group * plane).enumerate() {
            let (mean, inv_std) = moments(group);
            let first = (i % groups) * per_group;
            for (c, values) in group.chunks_exact_mut(plane).enumerate() {
                let (g, b) = (gamma[first + c], beta[first + c]);
                let (scale, shift) = (inv_std * g, b - mean * inv_std * g);
                if relu {
                    values
                        .iter_mut()
                        .for_each(|v| *v = (*v * scale + shift).max(0.0));
                } else {
                    values.iter_mut().for_each(|v| *v = *v * scale + shift);
                }
            }
        }
        tensor(y, shape)
    }

    fn fused_group_norm_backward(
        x: FloatTensor<Self>,
        [gamma, beta]: [FloatTensor<Self>; 2],
        grad: FloatTensor<Self>,
        groups: usize,
        relu: bool,
    ) -> [FloatTensor<Self>; 3] {
        let shape = x.shape();
        let channels = shape[1];
        let (gamma, beta) = (values(&gamma), values(&beta));
        // Through the ReLU first: zero where the forward output was clamped.
        let mut grad = values(&grad).into_owned();
        let (plane, per_group) = group_layout(&shape, groups);
        let len = per_group * plane;
        let mut dx = values(&x).into_owned();
        let mut d_gamma = vec![0.0f32; channels];
        let mut d_beta = vec![0.0f32; channels];
        let scale = 1.0 / len as f32;
        for (i, (group, g)) in dx
            .chunks_exact_mut(len)
            .zip(grad.chunks_exact_mut(len))
            .enumerate()
        {
            let (mean, inv_std) = moments(group);
            let first = (i % groups) * per_group;
            // group ← x̂ and g ← the gradient through the ReLU, in element-wise passes; then
            // per channel Σg and Σg·x̂, from which both means of dx̂ = g·γ follow:
            // Σ dx̂ = Σ_c γ_c Σg, Σ dx̂·x̂ = Σ_c γ_c Σg·x̂.
            let (mut mean_d, mut mean_dx) = (0.0f32, 0.0f32);
            for (c, (values, g)) in group
                .chunks_exact_mut(plane)
                .zip(g.chunks_exact_mut(plane))
                .enumerate()
            {
                let (gamma, beta) = (gamma[first + c], beta[first + c]);
                // A select, not a branch: the ReLU's mask is data-dependent and mispredicted
                // about half the time (this loop was 11% of a digits-cnn step).
                for (v, g) in values.iter_mut().zip(g.iter_mut()) {
                    let normed = (*v - mean) * inv_std;
                    *v = normed;
                    *g = if relu && normed * gamma + beta <= 0.0 {
                        0.0
                    } else {
                        *g
                    };
                }
                let db = lane_sum(g);
                let dg = lane_dot(g, values);
                d_gamma[first + c] += dg;
                d_beta[first + c] += db;
                mean_d += db * gamma;
                mean_dx += dg * gamma;
            }
            mean_d *= scale;
            mean_dx *= scale;
            for (c, (values, g)) in group
                .chunks_exact_mut(plane)
                .zip(g.chunks_exact(plane))
                .enumerate()
            {
                let gamma = gamma[first + c];
                for (v, &g) in values.iter_mut().zip(g) {
                    *v = (g * gamma - mean_d - *v * mean_dx) * inv_std;
                }
            }
        }
        [
            tensor(dx, shape),
            tensor(d_gamma, Shape::new([channels])),
            tensor(d_beta, Shape::new([channels])),
        ]
    }

    fn fused_pool(x: FloatTensor<Self>, kind: Pool, k: usize) -> FloatTensor<Self> {
        let shape = x.shape();
        let [n, c, h, w] = [shape[0], shape[1], shape[2], shape[3]];
        assert!(
            k > 0 && h.is_multiple_of(k) && w.is_multiple_of(k),
            "pool: {h}×{w} does not split into {k}×{k} blocks"
        );
        let (oh, ow) = (h / k, w / k);
        let x = values(&x);
        let mut y = vec![0.0f32; n * c * oh * ow];
        for (image, out) in x.chunks_exact(h * w).zip(y.chunks_exact_mut(oh * ow)) {
            // Reduce each block's rows into its output row, k input rows at a time.
            for (rows, out) in image.chunks_exact(k * w).zip(out.chunks_exact_mut(ow)) {
                match kind {
                    Pool::Max => {
                        out.fill(f32::NEG_INFINITY);
                        for row in rows.chunks_exact(w) {
                            for (o, block) in out.iter_mut().zip(row.chunks_exact(k)) {
                                *o = block.iter().copied().fold(*o, f32::max);
                            }
                        }
                    }
                    Pool::Average => {
                        for row in rows.chunks_exact(w) {
                            for (o, block) in out.iter_mut().zip(row.chunks_exact(k)) {
                                *o += block.iter().sum::<f32>();
                            }
                        }
                        let scale = 1.0 / (k * k) as f32;
                        out.iter_mut().for_each(|o| *o *= scale);
                    }
                }
            }
        }
        tensor(y, Shape::new([n, c, oh, ow]))
    }

    fn fused_pool_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: Pool,
        k: usize,
    ) -> FloatTensor<Self> {
        let shape = x.shape();
        let [h, w] = [shape[2], shape[3]];
        let (oh, ow) = (h / k, w / k);
        let (x, grad) = (values(&x), values(&grad));
        let mut dx = vec![0.0f32; x.len()];
        let per_block = 1.0 / (k * k) as f32;
        for ((image, d_image), g) in x
            .chunks_exact(h * w)
            .zip(dx.chunks_exact_mut(h * w))
            .zip(grad.chunks_exact(oh * ow))
        {
            for (by, g) in g.chunks_exact(ow).enumerate() {
                let top = by * k * w;
                for (bx, &g) in g.iter().enumerate() {
                    let corner = top + bx * k;
                    match kind {
                        // The first position holding the block's maximum takes the gradient.
                        // Selects, not branches: which position holds the maximum is
                        // data-dependent (this loop was 7% of a digits-cnn step).
                        Pool::Max => {
                            let (mut best, mut top) = (corner, image[corner]);
                            for i in 0..k {
                                let start = corner + i * w;
                                for (o, &v) in image[start..start + k].iter().enumerate() {
                                    let o = start + o;
                                    let better = v > top;
                                    best = if better { o } else { best };
                                    top = if better { v } else { top };
                                }
                            }
                            d_image[best] = g;
                        }
                        Pool::Average => {
                            for i in 0..k {
                                d_image[corner + i * w..][..k].fill(g * per_block);
                            }
                        }
                    }
                }
            }
        }
        tensor(dx, shape)
    }
}

/// The plane size `H·W` and the channels per group of `N × C × H × W` activations.
fn group_layout(shape: &Shape, groups: usize) -> (usize, usize) {
    let channels = shape[1];
    assert!(
        groups > 0 && channels.is_multiple_of(groups),
        "group norm: {channels} channels do not split into {groups} groups"
    );
    (shape[2] * shape[3], channels / groups)
}

/// The geometry of a convolution's input: `N × C × H × W` images, and its `H' × W'` output.
struct Image {
    n: usize,
    c: usize,
    side: [usize; 2],
    out: [usize; 2],
    geometry: ConvGeometry,
}

impl Image {
    fn of(s: &Shape, geometry: ConvGeometry) -> Self {
        assert_eq!(
            s.num_dims(),
            4,
            "conv2d: input of shape {s:?}, expected N × C × H × W"
        );
        let side = [s[2], s[3]];
        Self {
            n: s[0],
            c: s[1],
            side,
            out: geometry.output(side),
            geometry,
        }
    }

    /// `C·kh·kw`: the rows of the patch matrix.
    fn patch_len(&self) -> usize {
        self.c * self.geometry.kernel[0] * self.geometry.kernel[1]
    }

    /// `N·H'·W'`: the columns of the patch matrix.
    fn positions(&self) -> usize {
        self.n * self.out[0] * self.out[1]
    }

    /// For each patch row (c, i, j) and image b, the output positions `(oy, ox)` that read an
    /// input pixel, as `(row offset in the patch matrix, input offset, ox range, input x of
    /// the range's first position)`: `visit` gets the contiguous runs of one output row.
    fn runs(&self, mut visit: impl FnMut(usize, usize, usize, usize)) {
        let [h, w] = self.side;
        let [oh, ow] = self.out;
        let ConvGeometry {
            kernel: [kh, kw],
            stride: [sh, sw],
            padding: [ph, pw],
        } = self.geometry;
        let per_image = oh * ow;
        let positions = self.positions();
        for c in 0..self.c {
            for i in 0..kh {
                for j in 0..kw {
                    let row = ((c * kh + i) * kw + j) * positions;
                    // Output columns ox whose input column ox·sw + j − pw lies in [0, w).
                    let first = pw.saturating_sub(j).div_ceil(sw);
                    let end = ow.min((w + pw).saturating_sub(j).div_ceil(sw));
                    if first >= end {
                        continue;
                    }
                    for b in 0..self.n {
                        let image = (b * self.c + c) * h * w;
                        for oy in 0..oh {
                            let Some(iy) = (oy * sh + i).checked_sub(ph).filter(|&y| y < h) else {
                                continue;
                            };
                            let out = row + b * per_image + oy * ow;
                            visit(
                                out + first,
                                image + iy * w + first * sw + j - pw,
                                end - first,
                                sw,
                            );
                        }
                    }
                }
            }
        }
    }

    /// The `C·kh·kw × N·H'·W'` patch matrix of `x` (zeros where a patch reaches the padding).
    fn im2col(&self, x: &[f32]) -> Vec<f32> {
        let mut cols = vec![0.0; self.patch_len() * self.positions()];
        if self.same_width() {
            self.same_width_blocks(|block| {
                let len = block.len();
                cols[block.out + block.first..][..len].copy_from_slice(&x[block.input..][..len]);
                // The run also filled the entries a patch takes from the padding with pixels of
                // the neighbouring input row: zero them.
                block.zero_padding(&mut cols);
            });
            return cols;
        }
        self.runs(|out, input, len, stride| {
            if stride == 1 {
                cols[out..out + len].copy_from_slice(&x[input..input + len]);
            } else {
                for (t, o) in cols[out..out + len].iter_mut().enumerate() {
                    *o = x[input + t * stride];
                }
            }
        });
        cols
    }

    /// Whether [`Image::same_width_blocks`] applies: stride 1 and W' = W (a "same"
    /// convolution, as in every shipped CNN).
    fn same_width(&self) -> bool {
        self.geometry.stride == [1, 1] && self.out[1] == self.side[1]
    }

    /// For a same-width convolution, the patch rows of one (channel, kernel offset, image) over
    /// all valid output rows are one contiguous run of the input, shifted by the kernel offset:
    /// `visit(block)` for each. Row by row, an 8 × 8 digit was eight `memcpy` calls of at most 8
    /// floats each (13% of a digits-cnn step with `im2col` itself).
    fn same_width_blocks(&self, mut visit: impl FnMut(Block)) {
        let [h, w] = self.side;
        let [oh, ow] = self.out;
        let ConvGeometry {
            kernel: [kh, kw],
            padding: [ph, pw],
            ..
        } = self.geometry;
        let positions = self.positions();
        for c in 0..self.c {
            for i in 0..kh {
                // Output rows oy whose input row oy + i − ph lies in [0, h).
                let (top, bottom) = (ph.saturating_sub(i), oh.min((h + ph).saturating_sub(i)));
                if top >= bottom {
                    continue;
                }
                for j in 0..kw {
                    // Output columns ox whose input column ox + j − pw lies in [0, w).
                    let (first, end) = (pw.saturating_sub(j), ow.min((w + pw).saturating_sub(j)));
                    if first >= end {
                        continue;
                    }
                    let row = ((c * kh + i) * kw + j) * positions;
                    for b in 0..self.n {
                        let image = (b * self.c + c) * h * w;
                        visit(Block {
                            out: row + b * oh * ow + top * ow,
                            input: image + (top + i - ph) * w + first + j - pw,
                            rows: bottom - top,
                            width: ow,
                            first,
                            end,
                        });
                    }
                }
            }
        }
    }

    /// The adjoint of [`Image::im2col`]: every patch entry added back into its input pixel.
    fn col2im(&self, mut cols: Vec<f32>) -> Vec<f32> {
        let [h, w] = self.side;
        let mut x = vec![0.0; self.n * self.c * h * w];
        if self.same_width() {
            self.same_width_blocks(|block| {
                // The entries of padding positions have no pixel: zeroed, the contiguous sum
                // adds nothing for them (in the same order per pixel as the row-wise loop).
                block.zero_padding(&mut cols);
                let len = block.len();
                let run = &cols[block.out + block.first..][..len];
                for (x, v) in x[block.input..][..len].iter_mut().zip(run) {
                    *x += v;
                }
            });
            return x;
        }
        self.runs(|out, input, len, stride| {
            let cols = &cols[out..out + len];
            if stride == 1 {
                for (x, v) in x[input..input + len].iter_mut().zip(cols) {
                    *x += v;
                }
            } else {
                for (t, v) in cols.iter().enumerate() {
                    x[input + t * stride] += v;
                }
            }
        });
        x
    }

    /// `c × N·P` (P = H'·W') rows as `N × c × P`.
    fn channels_to_batch(&self, y: &[f32], c: usize) -> Vec<f32> {
        let p = self.out[0] * self.out[1];
        let mut out = Vec::with_capacity(y.len());
        for b in 0..self.n {
            for ch in 0..c {
                out.extend_from_slice(&y[ch * self.n * p + b * p..][..p]);
            }
        }
        out
    }

    /// `N × c × P` as `c × N·P` rows: the inverse of [`Image::channels_to_batch`].
    fn batch_to_channels(&self, y: &[f32], c: usize) -> Vec<f32> {
        let p = self.out[0] * self.out[1];
        let mut out = Vec::with_capacity(y.len());
        for ch in 0..c {
            for b in 0..self.n {
                out.extend_from_slice(&y[(b * c + ch) * p..][..p]);
            }
        }
        out
    }
}

/// One (channel, kernel offset, image) of a same-width convolution
/// ([`Image::same_width_blocks`]): `rows` patch rows of `width` entries from `out` in the
/// patch matrix, of which columns `[first, end)` hold pixels; entry `out + first` is pixel
/// `input`, and the rest follow contiguously in both.
struct Block {
    out: usize,
    input: usize,
    rows: usize,
    width: usize,
    first: usize,
    end: usize,
}

impl Block {
    /// From the first pixel of the first row to the last pixel of the last row.
    fn len(&self) -> usize {
        (self.rows - 1) * self.width + self.end - self.first
    }

    /// Zeroes the block's entries outside `[first, end)` in every row: column by column, as
    /// there are only `pw` such columns on either side (row by row, each was a `memset` call
    /// of one float).
    fn zero_padding(&self, cols: &mut [f32]) {
        for column in (0..self.first).chain(self.end..self.width) {
            for r in 0..self.rows {
                cols[self.out + r * self.width + column] = 0.0;
            }
        }
    }
}

/// Mean and `1/√(var + ε)` of a row (population variance, as the composite version).
fn moments(row: &[f32]) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = lane_sum(row) / n;
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (acc, v) in lanes.iter_mut().zip(chunk) {
            *acc += (v - mean) * (v - mean);
        }
    }
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|v| (v - mean) * (v - mean))
        .sum();
    let var = (lanes.iter().sum::<f32>() + tail) / n;
    (mean, 1.0 / (var + NORM_EPS).sqrt())
}

/// Accumulators of the vectorised sums: a float sum taken in order is one long dependency
/// chain the compiler may not reorder, so the sums below keep `LANES` partial sums instead (a
/// fixed order: the result depends on the data only).
const LANES: usize = 16;

/// `Σ values`, in [`LANES`] partial sums.
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

/// Row-wise softmax of `values` (rows of `cols`); with `causal`, row r of each `cols × cols`
/// block sees columns `0..=r % cols` and puts exactly 0 on the rest.
pub(super) fn softmax_rows(values: &mut [f32], cols: usize, causal: bool) {
    for (r, row) in values.chunks_exact_mut(cols).enumerate() {
        let seen = if causal { r % cols + 1 } else { cols };
        let (kept, masked) = row.split_at_mut(seen);
        let max = kept.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        kept.iter_mut().for_each(|v| *v = exp(*v - max));
        let inv = 1.0 / lane_sum(kept);
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

/// The causal mask's block structure, so that the attention products skip the block it zeroes:
/// queries before `half` see only keys before `half`, the others see every key up to their
/// own. (The diagonal blocks are still computed whole and masked; splitting them further
/// makes the products too small to run at speed.) Without the mask, one band of everything.
#[derive(Debug, Clone, Copy)]
struct QueryBands {
    t: usize,
    half: usize,
}

impl QueryBands {
    fn of(t: usize, causal: bool) -> Self {
        let half = if causal { t / 2 } else { 0 };
        Self { t, half }
    }

    /// (first query row, rows, keys they need).
    fn bands(self) -> impl Iterator<Item = (usize, usize, usize)> {
        let Self { t, half } = self;
        [(0, half, half), (half, t - half, t)]
            .into_iter()
            .filter(|&(_, rows, _)| rows > 0)
    }

    /// (first key, keys, first query row that sees them).
    fn key_bands(self) -> impl Iterator<Item = (usize, usize, usize)> {
        let Self { t, half } = self;
        [(0, half, 0), (half, t - half, half)]
            .into_iter()
            .filter(|&(_, keys, _)| keys > 0)
    }
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

/// The input of a linear layer as `rows × last dimension`: a matrix keeps its strides (a
/// transposed factor `Uᵀ` is read in place), a higher-rank tensor is taken as contiguous rows.
struct Rows<'a> {
    values: Cow<'a, [f32]>,
    rs: isize,
    cs: isize,
}

impl<'a> Rows<'a> {
    fn of(t: &'a NdArrayTensor) -> Self {
        let shape = t.shape();
        if shape.num_dims() == 2 {
            let m = Strided::of(t);
            return Self {
                values: m.values,
                rs: m.rs,
                cs: m.cs,
            };
        }
        Self {
            values: values(t),
            rs: row_len(&shape) as isize,
            cs: 1,
        }
    }
}

/// `c ← α · a · b` for an `m × k` matrix `a` and a `k × n` matrix `b`, each given as values and
/// (row, column) element strides from the start of the slice, into the first `n` columns of
/// the rows of `c` (row stride `ldc`). Every index is checked against the slices before the
/// kernel reads or writes them.
///
/// Why the `gemm` crate (already built for faer) rather than matrixmultiply: on this project's
/// AMD EPYC VM its AVX2 kernels were 4–8% faster per training step for every shipped model (A/B
/// in one binary, docs/performance.md). Its AVX-512 kernels (feature `x86-v4`, picked at run
/// time) were 13% slower there for the CNN, but on the Intel Xeon VM that replaced it they
/// train the transformer 1.6× and the other models 1.2–1.4× faster, so they are on.
fn gemm(
    mkn: [usize; 3],
    alpha: f32,
    a: (&[f32], isize, isize),
    b: (&[f32], isize, isize),
    c: &mut [f32],
    ldc: usize,
) {
    gemm_into(mkn, alpha, a, b, (c, ldc), false);
}

/// [`gemm`] that adds `alpha · a · b` to what `c` holds when `accumulate`, instead of
/// overwriting it (the linear layer's bias is laid into `c` first).
pub(super) fn gemm_into(
    mkn: [usize; 3],
    alpha: f32,
    a: (&[f32], isize, isize),
    b: (&[f32], isize, isize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    // SAFETY: `c` is a live, exclusively borrowed slice of `c.len()` initialised floats.
    unsafe { gemm_raw(mkn, alpha, a, b, (c.as_mut_ptr(), c.len(), ldc), accumulate) }
}

/// `alpha · a · b` as a fresh row-major `m × n` matrix. The matrix is not zeroed first: the
/// kernel writes every element (a `vec![0.0; m·n]` cost a `memset` of each product's output,
/// 2% of a char-transformer step).
fn gemm_fresh(
    [m, k, n]: [usize; 3],
    alpha: f32,
    a: (&[f32], isize, isize),
    b: (&[f32], isize, isize),
) -> Vec<f32> {
    let mut c = Vec::with_capacity(m * n);
    let spare = c.spare_capacity_mut().as_mut_ptr().cast::<f32>();
    // SAFETY: `spare` points to m·n writable floats owned by `c`; with `accumulate` false the
    // kernel writes each of the m × n elements (row stride n) and reads none, so all m·n are
    // initialised when `set_len` runs.
    unsafe {
        gemm_raw([m, k, n], alpha, a, b, (spare, m * n, n), false);
        c.set_len(m * n);
    }
    c
}

/// The one call into the `gemm` crate, every index checked against the operands first.
///
/// # Safety
/// `c` must point to `c_len` floats writable for the duration of the call that alias neither
/// `a` nor `b`, initialised when `accumulate` (they are read then).
unsafe fn gemm_raw(
    [m, k, n]: [usize; 3],
    alpha: f32,
    (a, rsa, csa): (&[f32], isize, isize),
    (b, rsb, csb): (&[f32], isize, isize),
    (c, c_len, ldc): (*mut f32, usize, usize),
    accumulate: bool,
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
        n <= ldc && last(m, n, ldc as isize, 1) < c_len,
        "gemm: c out of bounds"
    );
    // SAFETY: the asserts above keep every element the kernel touches inside the three
    // buffers, and the caller guarantees `c` is writable and aliases neither `a` nor `b`. With
    // `read_dst` false, c is written, never read. (gemm's convention: dst ← α·dst + β·lhs·rhs,
    // strides given as (column, row); our α is its β, and its α is 1 when accumulating.)
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.as_ptr(),
            csa,
            rsa,
            b.as_ptr(),
            csb,
            rsb,
            if accumulate { 1.0 } else { 0.0 },
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::exp;

    #[test]
    fn the_polynomial_exp_is_within_two_ulp_of_libm() {
        let mut worst = 0.0f64;
        for i in -8730..=8800 {
            let x = i as f32 * 0.01;
            let (ours, libm) = (f64::from(exp(x)), f64::from(x).exp());
            worst = worst.max((ours - libm).abs() / libm);
        }
        // 2 ulp of f32 relative to the value: 2 · 2⁻²³.
        assert!(worst < 2.4e-7, "relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1.3e-38);
    }
}
