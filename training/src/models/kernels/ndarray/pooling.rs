//! Max and average pooling over `k × k` blocks, forward and backward.

use super::{tensor, values};
use crate::models::kernels::Pool;
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
