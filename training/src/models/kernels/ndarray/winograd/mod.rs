//! 3 × 3 convolutions of stride 1 by Winograd's minimal filtering F(M × M, 3 × 3) (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016; measured in
//! docs/performance.md): each M × M block of outputs is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` for the
//! T × T input tile `d` under it (T = M + 2), so a channel pair costs T² products per tile
//! where the patch matrix costs 9 M². Summed over input channels, the T² element products
//! become T² matrix products `M_k = V_k · U_kᵀ` (`tiles × c_in` by `c_in × c_out`). The
//! matrices hold a tile per row, its channels side by side ([`Tiles::tile`] says why).
//! [`minimal`] has the two tilings: F(4 × 4) where the maps are large enough, F(2 × 2) on
//! smaller ones ([`Tiles::of`]).
//!
//! The backward pass uses the same tiles. The output `y = Aᵀ (U ⊙ V) A` is linear in `U` and
//! in `V`, so with `Z = A dy Aᵀ` (the output gradient's tiles) the filter gradient is
//! `Gᵀ (Σ_tiles Z ⊙ V) G` and the input gradient `B (Σ_c_out U ⊙ Z) Bᵀ` added back into the
//! overlapping input tiles: T² products each again, and the forward keeps `V` (T²/M² floats
//! per input pixel, where the patch matrix is 9).
//!
//! The sums run in another order than the patch matrix's (and the transforms round), so the
//! result differs from it in the last bits: only convolutions of at least [`MIN_CHANNELS`]
//! input channels (and [`MIN_TILES`] tiles) take this path, which leaves the digits CNN (and
//! so the main job's digests) as they were.

mod minimal;

use super::products::{Layout, Strided, gemm_planes};
use super::{lane_sum, tensor, values};
use crate::models::kernels::ConvGeometry;
use burn::tensor::{Shape, TensorMetadata};
use burn_ndarray::NdArrayTensor;
use minimal::{
    Columns, F2, F4, FilterAdjoint, FilterTransform, InputAdjoint, InputTransform, LANES, Lanes,
    Linear, Minimal, OutputAdjoint, OutputTransform, Rows, sandwich,
};
use std::mem::MaybeUninit;

/// Fewer input channels than this, and a convolution runs on the patch matrix: each of the
/// products is `c_in` deep, and shallower ones run too far below the machine's speed to gain.
const MIN_CHANNELS: usize = 64;

/// Fewer tiles than this over the batch, and a convolution runs on the patch matrix: the filter
/// transforms (T² values per channel pair, in each direction) cost about what the products
/// save. One convolution's forward and backward pass at batch 8 (AVX2 products): ResNet-18's
/// last stage (4 × 4 maps, 512 channels: 32 tiles of F(2 × 2)) ran 1.3 times slower with
/// them, its third (8 × 8, 256 channels: 128 tiles) 1.5 times faster; with the last stage on
/// tiles, the whole model trained at 25–26 samples/s, without at 28–29 (docs/performance.md).
/// F(4 × 4) takes a convolution only where it makes this many of its larger tiles.
const MIN_TILES: usize = 64;

/// The side of a tiling's output blocks: which of [`minimal`]'s filterings it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// F(2 × 2, 3 × 3) on 4 × 4 tiles.
    Two,
    /// F(4 × 4, 3 × 3) on 6 × 6 tiles.
    Four,
}

impl Block {
    fn side(self) -> usize {
        match self {
            Block::Two => 2,
            Block::Four => 4,
        }
    }
}

/// The tiling of a 3 × 3 stride-1 convolution's `N × C × H × W` input.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tiles {
    n: usize,
    c: usize,
    side: [usize; 2],
    padding: [usize; 2],
    out: [usize; 2],
    block: Block,
    /// Output blocks down and across one image.
    grid: [usize; 2],
}

/// Where a tile's [`LANES`] lie, in memory a tile is read from or written to: entry (i, j) of
/// the first lane at `first + (i · row + j) · step`, `valid` lanes of it. Among the T²
/// transformed entries ([`Tiles::tile`]) a row is T entries; in a channels-last padded image
/// set ([`Maps::stage`]) it is the padded image's width, and `step` its channels.
#[derive(Debug, Clone, Copy)]
struct Entries {
    first: usize,
    row: usize,
    step: usize,
    valid: usize,
}

impl Entries {
    fn at(self, i: usize, j: usize) -> usize {
        self.first + (i * self.row + j) * self.step
    }
}

/// The tile at some [`Entries`].
impl<const R: usize> Columns<R> for (Entries, &[f32]) {
    /// Column `j` (zero past `valid` lanes): one vector load per entry once inlined.
    #[inline(always)]
    fn column(&self, j: usize) -> [Lanes; R] {
        let (entries, values) = *self;
        let mut column = [Lanes::default(); R];
        for (i, lanes) in column.iter_mut().enumerate() {
            *lanes = Lanes::read(&values[entries.at(i, j)..], entries.valid);
        }
        column
    }
}

/// Transformed tiles being written ([`Tiles::tile`]): the first `valid` lanes of each entry.
impl<const R: usize> Rows<R> for (Entries, &mut [MaybeUninit<f32>]) {
    #[inline(always)]
    fn row(&mut self, i: usize, row: &[Lanes; R]) {
        let entries = self.0;
        for (j, lanes) in row.iter().enumerate() {
            lanes.write(&mut self.1[entries.at(i, j)..], entries.valid);
        }
    }
}

/// The padded images a tile is added into ([`Tiles::untile`]): the first `valid` lanes of each
/// entry, added to what is there (tiles overlap).
impl<const R: usize> Rows<R> for (Entries, &mut [f32]) {
    #[inline(always)]
    fn row(&mut self, i: usize, row: &[Lanes; R]) {
        let entries = self.0;
        for (j, lanes) in row.iter().enumerate() {
            lanes.add_to(&mut self.1[entries.at(i, j)..], entries.valid);
        }
    }
}

/// [`LANES`] filters' 3 × 3 taps, filter `l`'s tap (i, j) at `bases[l] + (3i + j) · step` of
/// `values`.
struct Taps<'a> {
    values: &'a [f32],
    bases: [usize; LANES],
    step: usize,
}

impl Columns<3> for Taps<'_> {
    #[inline(always)]
    fn column(&self, j: usize) -> [Lanes; 3] {
        let mut column = [Lanes::default(); 3];
        for (i, lanes) in column.iter_mut().enumerate() {
            for (v, base) in lanes.0.iter_mut().zip(self.bases) {
                *v = self.values[base + (3 * i + j) * self.step];
            }
        }
        column
    }
}

/// Filter gradients, 9 taps per filter, one filter per lane.
struct TapGradients<'a>(&'a mut [f32]);

impl Rows<3> for TapGradients<'_> {
    #[inline(always)]
    fn row(&mut self, i: usize, row: &[Lanes; 3]) {
        for (l, taps) in self.0.chunks_exact_mut(9).enumerate() {
            for (d, lanes) in taps[3 * i..][..3].iter_mut().zip(row) {
                *d = lanes.0[l];
            }
        }
    }
}

impl Tiles {
    /// The tiling of an input of shape `s` under `geometry`, or `None` where this path does
    /// not apply (another kernel or stride, fewer than [`MIN_CHANNELS`] channels or
    /// [`MIN_TILES`] tiles): F(4 × 4) where it makes [`MIN_TILES`] tiles, else F(2 × 2).
    pub(super) fn of(s: &Shape, geometry: ConvGeometry) -> Option<Self> {
        let applies = s.num_dims() == 4
            && geometry.kernel == [3, 3]
            && geometry.stride == [1, 1]
            && s[1] >= MIN_CHANNELS;
        if !applies {
            return None;
        }
        let side = [s[2], s[3]];
        let out = geometry.output(side);
        [Block::Four, Block::Two]
            .into_iter()
            .map(|block| Self {
                n: s[0],
                c: s[1],
                side,
                padding: geometry.padding,
                out,
                block,
                grid: out.map(|o| o.div_ceil(block.side())),
            })
            .find(|tiles| tiles.count() >= MIN_TILES)
    }

    /// Tiles over the whole batch: the columns of each product.
    fn count(&self) -> usize {
        self.n * self.grid[0] * self.grid[1]
    }

    /// The shape of `V`, the transformed input tiles that the forward pass keeps for the
    /// backward: tiles × T² × channels, where an M × M block of a 3 × 3 filter's outputs
    /// reads a T × T tile, T = M + 2.
    fn transformed(&self) -> Shape {
        let t = self.block.side() + 2;
        Shape::new([self.count(), t * t, self.c])
    }

    /// How the tiles lie on the input images (T × T tiles M apart, over the padded image) or
    /// output images (M × M blocks).
    fn maps(&self, input: bool) -> Maps {
        let m = self.block.side();
        let [gh, gw] = self.grid;
        let (image, corner, reach) = if input {
            (self.side, self.padding, 2)
        } else {
            (self.out, [0, 0], 0)
        };
        let [rows, cols] = self.grid.map(|g| m * g + reach);
        let tiles = (0..self.count())
            .map(|t| {
                let (b, t) = (t / (gh * gw), t % (gh * gw));
                (b * rows + m * (t / gw)) * cols + m * (t % gw)
            })
            .collect();
        Maps {
            n: self.n,
            image,
            plane: [rows, cols],
            corner,
            tiles,
        }
    }

    /// Every tile of every channel of `images` (`channels` of them, laid out as `maps` says),
    /// its `R × R` block `x` transformed to `L x Lᵀ`, as `tiles × T² × channels` floats: the
    /// T² matrices `tiles × channels` of the products interleaved by rows ([`Layout`]), matrix
    /// k = Ti + j holding entry (i, j). A tile's channels lie side by side, so that every
    /// product reads its operands down contiguous columns (`gemm` packs an operand read across
    /// its rows element by element: 8% of a ResNet-18 step), and its T² entries lie together,
    /// so that a tile is written (and read back) in one stretch of memory rather than T²
    /// streams (no gain measured over T² matrices apart, docs/performance.md). The lanes run
    /// over 16 channels of one tile, read from a channels-last copy of the images
    /// ([`Maps::stage`]).
    fn tile<const T: usize, const R: usize, L: Linear<R, T>>(
        &self,
        (images, channels, maps): (&[f32], usize, Maps),
    ) -> Vec<f32> {
        let len = T * T * channels * self.count();
        let padded = maps.stage(images, channels);
        // Not zeroed first: the loops write every float (zeroing cost 3% of a ResNet-18 step).
        let mut out = Vec::with_capacity(len);
        let spare = &mut out.spare_capacity_mut()[..len];
        for (t, &tile) in maps.tiles.iter().enumerate() {
            for first in (0..channels).step_by(LANES) {
                let valid = LANES.min(channels - first);
                let (window, slot) = maps.places::<T>(tile, (t, first, valid), channels);
                sandwich::<R, T, L>((window, &padded[..]), (slot, &mut *spare));
            }
        }
        // SAFETY: for each tile t, the chunks of channels stored lanes `first..first + valid`
        // of each of its T² entries: all `len` floats.
        unsafe { out.set_len(len) };
        out
    }

    /// The way back from [`Tiles::tile`]: each tile `x` of `tiles` (laid out as it lays
    /// them) transformed to the `R × R` block `L x Lᵀ` and added where that block lies (tiles
    /// overlap on the input), then each image row of each channel handed to
    /// `finish(channel, image row, its pixels)`.
    fn untile<const T: usize, const R: usize, L: Linear<T, R>>(
        &self,
        (tiles, channels, maps): (&[f32], usize, Maps),
        finish: impl FnMut(usize, &mut [f32], Pixels),
    ) -> Vec<f32> {
        let mut padded = vec![0.0; self.n * maps.area() * channels];
        for (t, &tile) in maps.tiles.iter().enumerate() {
            for first in (0..channels).step_by(LANES) {
                let valid = LANES.min(channels - first);
                let (window, slot) = maps.places::<T>(tile, (t, first, valid), channels);
                sandwich::<T, R, L>((slot, tiles), (window, &mut padded[..]));
            }
        }
        maps.unstage(&padded, channels, finish)
    }

    /// `V`: `Bᵀ d B` of every input tile (zeros beyond the image).
    fn input<const M: usize, const T: usize, W: Minimal<M, T>>(&self, x: &[f32]) -> Vec<f32> {
        self.tile::<T, T, InputTransform<W, M, T>>((x, self.c, self.maps(true)))
    }

    /// The adjoint of [`Tiles::input`]: `B dV Bᵀ` of every tile added into the input pixels
    /// it covers.
    fn input_adjoint<const M: usize, const T: usize, W: Minimal<M, T>>(
        &self,
        d_v: &[f32],
    ) -> Vec<f32> {
        self.untile::<T, T, InputAdjoint<W, M, T>>(
            (d_v, self.c, self.maps(true)),
            |_, x, pixels| x.iter_mut().zip(pixels).for_each(|(x, v)| *x = *v),
        )
    }

    /// `N × c_out × H' × W'` from the T² products `M_k` (`tiles × c_out` each, laid out as
    /// [`Tiles::tile`] lays them): `Aᵀ M A` of each tile, plus the bias.
    fn output<const M: usize, const T: usize, W: Minimal<M, T>>(
        &self,
        m: &[f32],
        c_out: usize,
        bias: Option<&[f32]>,
    ) -> Vec<f32> {
        self.untile::<T, M, OutputTransform<W, M, T>>(
            (m, c_out, self.maps(false)),
            |co, y, pixels| {
                let shift = bias.map_or(0.0, |b| b[co]);
                for (y, v) in y.iter_mut().zip(pixels) {
                    *y = v + shift;
                }
            },
        )
    }

    /// The adjoint of [`Tiles::output`] without the bias: `Z = A dy Aᵀ` of every output
    /// block (zeros beyond the output).
    fn output_adjoint<const M: usize, const T: usize, W: Minimal<M, T>>(
        &self,
        d_y: &[f32],
        c_out: usize,
    ) -> Vec<f32> {
        self.tile::<T, M, OutputAdjoint<W, M, T>>((d_y, c_out, self.maps(false)))
    }
}

/// One channel's pixels along a row of a channels-last image.
type Pixels<'a> = std::iter::StepBy<std::slice::Iter<'a, f32>>;

/// Where one side of a convolution's tiles lies: `n` images of `image` sides, each copied
/// channels-last at `corner` into a zero image of `plane` sides (so that a tile's channels are
/// side by side for the lanes), and each tile's top-left pixel in those ([`Tiles::maps`]).
struct Maps {
    n: usize,
    image: [usize; 2],
    plane: [usize; 2],
    corner: [usize; 2],
    tiles: Vec<usize>,
}

impl Maps {
    /// Pixels in one padded image.
    fn area(&self) -> usize {
        self.plane[0] * self.plane[1]
    }

    /// Where the lanes `first..first + valid` of tile `t` (top-left pixel `tile`) lie in the
    /// padded images and among the transformed tiles ([`Tiles::tile`]).
    fn places<const T: usize>(
        &self,
        tile: usize,
        (t, first, valid): (usize, usize, usize),
        channels: usize,
    ) -> (Entries, Entries) {
        let window = Entries {
            first: tile * channels + first,
            row: self.plane[1],
            step: channels,
            valid,
        };
        let slot = Entries {
            first: t * T * T * channels + first,
            row: T,
            step: channels,
            valid,
        };
        (window, slot)
    }

    /// The rows and columns of an image inside its padded copy (cut at its edge).
    fn inside(&self) -> [usize; 2] {
        let ([h, w], [rows, cols], [top, left]) = (self.image, self.plane, self.corner);
        [
            h.min(rows.saturating_sub(top)),
            w.min(cols.saturating_sub(left)),
        ]
    }

    /// The channels-last padded copy of the `n × channels × H × W` `images`. Each image row's
    /// block (`W × channels` floats) stays in the cache while its channels are written across.
    fn stage(&self, images: &[f32], channels: usize) -> Vec<f32> {
        let ([h, w], [rows, cols], [top, left]) = (self.image, self.plane, self.corner);
        let [down, across] = self.inside();
        let mut padded = vec![0.0; self.n * self.area() * channels];
        for b in 0..self.n {
            for y in 0..down {
                let to = &mut padded[((b * rows + y + top) * cols + left) * channels..];
                for c in 0..channels {
                    let from = &images[((b * channels + c) * h + y) * w..][..across];
                    for (x, v) in from.iter().enumerate() {
                        to[x * channels + c] = *v;
                    }
                }
            }
        }
        padded
    }

    /// The way back from [`Maps::stage`]: each row of each channel of each image, with the
    /// padded copy's pixels under it, handed to `finish(channel, image row, pixels)`.
    fn unstage(
        &self,
        padded: &[f32],
        channels: usize,
        mut finish: impl FnMut(usize, &mut [f32], Pixels),
    ) -> Vec<f32> {
        let ([h, w], [rows, cols], [top, left]) = (self.image, self.plane, self.corner);
        let [down, across] = self.inside();
        let mut images = vec![0.0; self.n * channels * h * w];
        for b in 0..self.n {
            for y in 0..down {
                let from = &padded[((b * rows + y + top) * cols + left) * channels..];
                for c in 0..channels {
                    let row = &mut images[((b * channels + c) * h + y) * w..][..across];
                    finish(c, row, from[c..].iter().step_by(channels));
                }
            }
        }
        images
    }
}

/// `U`: `G g Gᵀ` of every `c_out × c_in` filter pair, as T² matrices `c_out × c_in`, one
/// after the other.
fn filters<const M: usize, const T: usize, W: Minimal<M, T>>(f: &Strided) -> Vec<f32> {
    let (c_out, c_in) = (f.rows, f.cols / 9);
    let len = c_out * c_in;
    let mut u = Vec::with_capacity(T * T * len);
    let spare = &mut u.spare_capacity_mut()[..T * T * len];
    let (rs, cs) = (f.rs as usize, f.cs as usize);
    for first in (0..len).step_by(LANES) {
        let valid = LANES.min(len - first);
        let mut bases = [0; LANES];
        for (l, base) in bases.iter_mut().enumerate() {
            // Each lane's pair, the last repeated past the end.
            let pair = first + l.min(valid - 1);
            *base = pair / c_in * rs + pair % c_in * 9 * cs;
        }
        let taps = Taps {
            values: &f.values,
            bases,
            step: cs,
        };
        let slot = Entries {
            first,
            row: T,
            step: len,
            valid,
        };
        sandwich::<3, T, FilterTransform<W, M, T>>(taps, (slot, &mut *spare));
    }
    // SAFETY: the chunks of pairs stored lanes `first..first + valid` at `first` of each of
    // the T² matrices: all T² · len floats.
    unsafe { u.set_len(T * T * len) };
    u
}

/// The adjoint of [`filters`]: `Gᵀ dU G` of every filter pair, as the `c_out × (c_in·3·3)`
/// filter gradient.
fn filters_adjoint<const M: usize, const T: usize, W: Minimal<M, T>>(
    d_u: &[f32],
    c_out: usize,
    c_in: usize,
) -> Vec<f32> {
    let len = c_out * c_in;
    let mut d_f = vec![0.0; len * 9];
    for first in (0..len).step_by(LANES) {
        let valid = LANES.min(len - first);
        let slot = Entries {
            first,
            row: T,
            step: len,
            valid,
        };
        let d_f = TapGradients(&mut d_f[first * 9..][..valid * 9]);
        sandwich::<T, 3, FilterAdjoint<W, M, T>>((slot, d_u), d_f);
    }
    d_f
}

/// The convolution of `x` by `filters` on `tiles` ([`super::convolution::conv2d`]'s
/// contract): the output and `V`, which the backward pass keeps.
pub(super) fn conv2d(
    tiles: Tiles,
    x: &[f32],
    f: &Strided,
    bias: Option<&[f32]>,
) -> [NdArrayTensor; 2] {
    let (y, v) = match tiles.block {
        Block::Two => forward::<2, 4, F2>(tiles, x, f, bias),
        Block::Four => forward::<4, 6, F4>(tiles, x, f, bias),
    };
    let [oh, ow] = tiles.out;
    [
        tensor(y, Shape::new([tiles.n, f.rows, oh, ow])),
        tensor(v, tiles.transformed()),
    ]
}

/// The output and `V` of [`conv2d`] on F(M × M, 3 × 3).
fn forward<const M: usize, const T: usize, W: Minimal<M, T>>(
    tiles: Tiles,
    x: &[f32],
    f: &Strided,
    bias: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let (c_out, c_in, count) = (f.rows, tiles.c, tiles.count());
    let u = filters::<M, T, W>(f);
    let v = tiles.input::<M, T, W>(x);
    // M_k = V_k · U_kᵀ (tiles × c_out), V_k and M_k interleaved by tiles.
    let m = gemm_planes(
        T * T,
        [count, c_in, c_out],
        (&v, c_in, (T * T * c_in) as isize, 1),
        (&u, c_out * c_in, 1, c_in as isize),
        Layout::Interleaved,
    );
    (tiles.output::<M, T, W>(&m, c_out, bias), v)
}

/// The gradients of [`conv2d`] from `saved` (its `V`): input, filters, and bias where
/// `with_bias`.
pub(super) fn conv2d_backward(
    tiles: Tiles,
    saved: &NdArrayTensor,
    f: &Strided,
    grad: &[f32],
    with_bias: bool,
) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    assert_eq!(
        saved.shape(),
        tiles.transformed(),
        "conv2d backward: the saved tiles do not match the input's shape"
    );
    let v = values(saved);
    let [d_x, d_f] = match tiles.block {
        Block::Two => backward::<2, 4, F2>(tiles, &v, f, grad),
        Block::Four => backward::<4, 6, F4>(tiles, &v, f, grad),
    };
    let (c_out, [oh, ow]) = (f.rows, tiles.out);
    let d_bias = with_bias.then(|| {
        (0..c_out)
            .map(|co| {
                (0..tiles.n)
                    .map(|b| lane_sum(&grad[(b * c_out + co) * oh * ow..][..oh * ow]))
                    .sum()
            })
            .collect()
    });
    (d_x, d_f, d_bias)
}

/// The input and filter gradients of [`conv2d`] on F(M × M, 3 × 3), from its `V`.
fn backward<const M: usize, const T: usize, W: Minimal<M, T>>(
    tiles: Tiles,
    v: &[f32],
    f: &Strided,
    grad: &[f32],
) -> [Vec<f32>; 2] {
    let (c_out, c_in, count) = (f.rows, tiles.c, tiles.count());
    let u = filters::<M, T, W>(f);
    let z = tiles.output_adjoint::<M, T, W>(grad, c_out);
    // With the tiles down the rows of V_k and Z_k: dU_k = Z_kᵀ · V_k (c_out × c_in) and
    // dV_k = Z_k · U_k (tiles × c_in).
    let (z_rows, v_rows) = ((T * T * c_out) as isize, (T * T * c_in) as isize);
    let d_u = gemm_planes(
        T * T,
        [c_out, count, c_in],
        (&z, c_out, 1, z_rows),
        (v, c_in, v_rows, 1),
        Layout::Stacked,
    );
    let d_v = gemm_planes(
        T * T,
        [count, c_out, c_in],
        (&z, c_out, z_rows, 1),
        (&u, c_out * c_in, c_in as isize, 1),
        Layout::Interleaved,
    );
    [
        tiles.input_adjoint::<M, T, W>(&d_v),
        filters_adjoint::<M, T, W>(&d_u, c_out, c_in),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiles a shape makes and the side of their output blocks.
    fn tiles(shape: [usize; 4], padding: usize) -> Option<(usize, usize)> {
        let geometry = ConvGeometry {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [padding; 2],
        };
        Tiles::of(&Shape::new(shape), geometry).map(|t| (t.count(), t.block.side()))
    }

    /// The shapes of the kernel test (`winograd_conv_matches_burns_conv…`) and ResNet-18's
    /// first three stages take this path, its first two on 4 × 4 blocks; its last stage, its
    /// stem, the digits CNN's convolutions (whose digests pin the patch matrix's sums) and
    /// strided ones do not.
    #[test]
    fn which_convolutions_take_the_tiles() {
        assert_eq!(tiles([2, 72, 12, 12], 1), Some((72, 2)));
        assert_eq!(tiles([2, 72, 13, 13], 1), Some((98, 2)));
        assert_eq!(tiles([2, 72, 13, 13], 0), Some((72, 2)));
        assert_eq!(tiles([2, 72, 12, 12], 2), Some((98, 2)));
        assert_eq!(tiles([2, 72, 24, 24], 1), Some((72, 4)));
        assert_eq!(tiles([2, 72, 25, 25], 1), Some((98, 4)));
        assert_eq!(tiles([2, 72, 26, 26], 0), Some((72, 4)));
        assert_eq!(tiles([2, 72, 25, 25], 2), Some((98, 4)));
        assert_eq!(tiles([8, 64, 32, 32], 1), Some((512, 4)));
        assert_eq!(tiles([8, 128, 16, 16], 1), Some((128, 4)));
        assert_eq!(tiles([8, 256, 8, 8], 1), Some((128, 2)));
        assert_eq!(tiles([8, 512, 4, 4], 1), None);
        assert_eq!(tiles([8, 3, 32, 32], 1), None);
        for c in [1, 16, 32] {
            assert_eq!(tiles([32, c, 8, 8], 1), None);
        }
        let strided = ConvGeometry {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
        };
        assert!(Tiles::of(&Shape::new([8, 64, 32, 32]), strided).is_none());
    }
}
