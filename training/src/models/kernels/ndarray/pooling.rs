//! Max and average pooling over `k × k` blocks, and max pooling over overlapping windows,
//! forward and backward.

use super::{tensor, values};
use crate::models::kernels::{MaxWindow, Pool};
use burn::tensor::{Shape, TensorMetadata};
use burn_ndarray::NdArrayTensor;

pub(super) fn pool(x: NdArrayTensor, kind: Pool, k: usize) -> NdArrayTensor {
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

pub(super) fn pool_backward(
    x: NdArrayTensor,
    grad: NdArrayTensor,
    kind: Pool,
    k: usize,
) -> NdArrayTensor {
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

/// The maximum of the window at output `(oy, ox)` of an `h × w` plane and its position in the
/// plane, in burn's order: row by row, the first value strictly above the maximum so far
/// (from −∞, at position 0) wins, and the border, −∞ in burn, is skipped, as it never wins.
/// Selects, not branches: which position wins is data-dependent.
#[inline(always)]
fn window_max(plane: &[f32], w: usize, rows: [usize; 2], cols: [usize; 2]) -> (f32, usize) {
    let (mut top, mut at) = (f32::NEG_INFINITY, 0);
    for y in rows[0]..rows[1] {
        for (x, &v) in plane[y * w + cols[0]..y * w + cols[1]].iter().enumerate() {
            let better = v > top;
            at = if better { y * w + cols[0] + x } else { at };
            top = if better { v } else { top };
        }
    }
    (top, at)
}

/// Calls `visit(output index, maximum, its position)` for every window of an `h × w` plane.
#[inline(always)]
fn each_window(
    plane: &[f32],
    [h, w]: [usize; 2],
    window: MaxWindow,
    mut visit: impl FnMut(usize, f32, usize),
) {
    let span = |o: usize, side: usize| {
        let start = (o * window.stride).saturating_sub(window.padding);
        let end = (o * window.stride + window.size - window.padding).min(side);
        [start, end]
    };
    let (oh, ow) = (window.output(h), window.output(w));
    for oy in 0..oh {
        let rows = span(oy, h);
        for ox in 0..ow {
            let (top, at) = window_max(plane, w, rows, span(ox, w));
            visit(oy * ow + ox, top, at);
        }
    }
}

/// Checks the input's shape against `window`: every window must hold an input position.
fn planes(shape: &Shape, window: MaxWindow) -> [usize; 4] {
    let [n, c, h, w] = [shape[0], shape[1], shape[2], shape[3]];
    assert!(
        window.size > 0 && window.stride > 0 && window.padding < window.size,
        "max pool: window {window:?}"
    );
    assert!(
        h + 2 * window.padding >= window.size && w + 2 * window.padding >= window.size,
        "max pool: {h}×{w} is smaller than the window {window:?}"
    );
    [n, c, h, w]
}

pub(super) fn max_pool(x: NdArrayTensor, window: MaxWindow) -> NdArrayTensor {
    let [n, c, h, w] = planes(&x.shape(), window);
    let (oh, ow) = (window.output(h), window.output(w));
    let x = values(&x);
    let mut y = vec![0.0f32; n * c * oh * ow];
    for (plane, out) in x.chunks_exact(h * w).zip(y.chunks_exact_mut(oh * ow)) {
        each_window(plane, [h, w], window, |o, top, _| out[o] = top);
    }
    tensor(y, Shape::new([n, c, oh, ow]))
}

pub(super) fn max_pool_backward(
    x: NdArrayTensor,
    grad: NdArrayTensor,
    window: MaxWindow,
) -> NdArrayTensor {
    let shape = x.shape();
    let [_, _, h, w] = planes(&shape, window);
    let (oh, ow) = (window.output(h), window.output(w));
    let (x, grad) = (values(&x), values(&grad));
    let mut dx = vec![0.0f32; x.len()];
    for ((plane, d_plane), g) in x
        .chunks_exact(h * w)
        .zip(dx.chunks_exact_mut(h * w))
        .zip(grad.chunks_exact(oh * ow))
    {
        // In output order, as burn sums where windows share their maximum.
        each_window(plane, [h, w], window, |o, _, at| d_plane[at] += g[o]);
    }
    tensor(dx, shape)
}

#[cfg(test)]
mod tests {
    use crate::models::kernels::{MaxWindow, max_pool};
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::module::max_pool2d;
    use burn::tensor::{Distribution, Tensor};

    type B = Autodiff<NdArray>;

    /// The fused max pool and its gradient against burn's `max_pool2d`, to the bit, over
    /// CCT's windows and others, with ties (values rounded to a few levels) and a loss that
    /// weighs each output differently.
    #[test]
    fn the_fused_max_pool_is_burns_bit_for_bit() {
        let device = Default::default();
        let windows = [
            (3, 2, 1),
            (3, 1, 1),
            (2, 2, 0),
            (3, 3, 0),
            (2, 1, 1),
            (3, 2, 0),
        ];
        for (size, stride, padding) in windows {
            let window = MaxWindow {
                size,
                stride,
                padding,
            };
            for (shape, levels) in [([2, 3, 9, 8], 0.0), ([1, 2, 7, 7], 3.0)] {
                let raw =
                    Tensor::<NdArray, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
                let raw = if levels > 0.0 {
                    raw.mul_scalar(levels).round()
                } else {
                    raw
                };
                let ours_x = Tensor::<B, 4>::from_inner(raw.clone()).require_grad();
                let burns_x = Tensor::<B, 4>::from_inner(raw).require_grad();
                let ours = max_pool(ours_x.clone(), window);
                // burn's arguments written out, not taken from `MaxWindow::burn`.
                let burns = max_pool2d(
                    burns_x.clone(),
                    [size; 2],
                    [stride; 2],
                    [padding; 2],
                    [1, 1],
                    false,
                );
                assert_eq!(ours.dims(), burns.dims(), "{window:?}");
                let bits = |t: Tensor<NdArray, 4>| {
                    t.into_data()
                        .to_vec::<f32>()
                        .unwrap()
                        .into_iter()
                        .map(f32::to_bits)
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    bits(ours.clone().inner()),
                    bits(burns.clone().inner()),
                    "{window:?}"
                );
                let weights = Tensor::<B, 4>::random(ours.dims(), Distribution::Default, &device);
                let ours_grads = (ours * weights.clone()).sum().backward();
                let burns_grads = (burns * weights).sum().backward();
                assert_eq!(
                    bits(ours_x.grad(&ours_grads).unwrap()),
                    bits(burns_x.grad(&burns_grads).unwrap()),
                    "{window:?}"
                );
            }
        }
    }
}
