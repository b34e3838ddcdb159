//! 2-D convolution as a product with the input's patch matrix (im2col), and its backward
//! pass through the same matrix; 3 × 3 convolutions of stride 1 over many channels by
//! Winograd's tiles instead ([`super::winograd`]).

use super::products::{Strided, gemm_fresh};
use super::winograd::{self, Tiles};
use super::{lane_sum, tensor, values};
use crate::models::kernels::ConvGeometry;
use burn::tensor::{Shape, TensorMetadata};
use burn_ndarray::NdArrayTensor;

pub(super) fn conv2d(
    x: NdArrayTensor,
    filters: NdArrayTensor,
    bias: Option<NdArrayTensor>,
    geometry: ConvGeometry,
) -> [NdArrayTensor; 2] {
    let image = Image::of(&x.shape(), geometry);
    let f = Strided::of(&filters);
    assert_eq!(f.cols, image.patch_len(), "conv2d: filter width vs C·kh·kw");
    let bias = bias.as_ref().map(values);
    if let Some(bias) = &bias {
        assert_eq!(bias.len(), f.rows, "conv2d: bias length vs output channels");
    }
    if let Some(tiles) = Tiles::of(&x.shape(), geometry) {
        return winograd::conv2d(tiles, &values(&x), &f, bias.as_deref());
    }
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
        for (plane, b) in y.chunks_exact_mut(oh * ow).zip(bias.iter().cycle()) {
            plane.iter_mut().for_each(|v| *v += b);
        }
    }
    [
        tensor(y, Shape::new([image.n, f.rows, oh, ow])),
        tensor(cols, Shape::new([image.patch_len(), positions])),
    ]
}

/// `saved` is the forward pass's patch matrix (or Winograd tiles).
pub(super) fn conv2d_backward(
    saved: NdArrayTensor,
    shape: Shape,
    filters: NdArrayTensor,
    grad: NdArrayTensor,
    geometry: ConvGeometry,
    with_bias: bool,
) -> (NdArrayTensor, NdArrayTensor, Option<NdArrayTensor>) {
    let image = Image::of(&shape, geometry);
    let f = Strided::of(&filters);
    let (patch, positions, c_out) = (image.patch_len(), image.positions(), f.rows);
    if let Some(tiles) = Tiles::of(&shape, geometry) {
        let (d_x, d_f, d_b) =
            winograd::conv2d_backward(tiles, &saved, &f, &values(&grad), with_bias);
        return (
            tensor(d_x, shape),
            tensor(d_f, Shape::new([c_out, patch])),
            d_b.map(|d_b| tensor(d_b, Shape::new([c_out]))),
        );
    }
    let cols = values(&saved);
    assert_eq!(
        cols.len(),
        patch * positions,
        "conv2d backward: the saved patch matrix does not match the input's shape"
    );
    let grad = image.batch_to_channels(&values(&grad), c_out);
    let d_bias = with_bias.then(|| grad.chunks_exact(positions).map(lane_sum).collect());
    let g = (grad.as_slice(), positions as isize, 1);
    // dF = dY · colsᵀ, d cols = Fᵀ · dY, then the patches are added back into dX. `gemm`
    // computes a row-major product as its transpose and packs, element by element, the operand
    // that is then not contiguous down its columns: for dY · colsᵀ the patch matrix (C·kh·kw ×
    // N·H'·W'), for (cols · dYᵀ)ᵀ dY (c_out × N·H'·W') plus a transpose of the c_out × C·kh·kw
    // result. Whichever moves fewer elements: the digits CNN's wide, shallow maps turn round
    // (28% of its step at batch 32 on the AMD EPYC was that packing), ResNet-18's deep ones do
    // not. Both are the same sums in the same order: the same bits.
    let d_filters = if c_out * (patch + positions) < patch * positions {
        transpose(
            &gemm_fresh(
                [patch, positions, c_out],
                1.0,
                (&cols, positions as isize, 1),
                (grad.as_slice(), 1, positions as isize),
            ),
            patch,
            c_out,
        )
    } else {
        gemm_fresh(
            [c_out, positions, patch],
            1.0,
            g,
            (&cols, 1, positions as isize),
        )
    };
    let d_cols = gemm_fresh([patch, c_out, positions], 1.0, (&f.values, f.cs, f.rs), g);
    (
        tensor(image.col2im(d_cols), shape),
        tensor(d_filters, Shape::new([c_out, patch])),
        d_bias.map(|d_bias| tensor(d_bias, Shape::new([c_out]))),
    )
}

/// The `cols × rows` transpose of a row-major `rows × cols` matrix.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate() {
        for (c, v) in row.iter().enumerate() {
            t[c * rows + r] = *v;
        }
    }
    t
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
