//! 3 × 3 convolutions of stride 1 by Winograd's minimal filtering F(2 × 2, 3 × 3) (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016; measured in
//! docs/performance.md): each 2 × 2 block of outputs is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` for the 4 × 4 input
//! tile `d` under it, so a channel pair costs 16 products per tile where the patch matrix
//! costs 36. Summed over input channels, the 16 element products become 16 matrix products
//! `U_k · V_k` (`c_out × c_in` by `c_in × tiles`), 2.25 times fewer multiplications than the
//! patch matrix's one product, and the transforms are additions and halvings.
//!
//! The backward pass uses the same tiles. The output `y = Aᵀ (U ⊙ V) A` is linear in `U` and
//! in `V`, so with `Z = A dy Aᵀ` (the output gradient's tiles) the filter gradient is
//! `Gᵀ (Σ_tiles Z ⊙ V) G` and the input gradient `B (Σ_c_out U ⊙ Z) Bᵀ` added back into the
//! overlapping input tiles: 16 products each again, and the forward keeps `V` (4 floats per
//! input pixel, where the patch matrix is 9).
//!
//! The sums run in another order than the patch matrix's (and the transforms round), so the
//! result differs from it in the last bits: only convolutions of at least [`MIN_CHANNELS`]
//! input channels (and [`MIN_TILES`] tiles) take this path, which leaves the digits CNN (and
//! so the main job's digests) as they were.

use super::products::{Strided, gemm_planes};
use super::{lane_sum, tensor, values};
use crate::models::kernels::ConvGeometry;
use burn::tensor::{Shape, TensorMetadata};
use burn_ndarray::NdArrayTensor;
use std::ops::{Add, Mul, Neg, Sub};

/// Fewer input channels than this, and a convolution runs on the patch matrix: each of the 16
/// products is `c_in` deep, and shallower ones run too far below the machine's speed to gain.
const MIN_CHANNELS: usize = 64;

/// Fewer tiles than this over the batch, and a convolution runs on the patch matrix: the filter
/// transforms (16 values per channel pair, in each direction) cost about what the products
/// save. One convolution's forward and backward pass at batch 8 (AVX2 products): ResNet-18's
/// last stage (4 × 4 maps, 512 channels: 32 tiles) ran 1.3 times slower with them, its third
/// (8 × 8, 256 channels: 128 tiles) 1.5 times faster; with the last stage on tiles, the whole
/// model trained at 25–26 samples/s, without at 28–29 (docs/performance.md).
const MIN_TILES: usize = 64;

/// Tiles (or filter pairs) transformed at once, one per lane of a vector.
const LANES: usize = 16;

/// One value of [`LANES`] tiles: the transforms' additions and halvings on it are lane-wise
/// loops of fixed length, which the compiler turns into vector instructions, and each of the
/// 16 matrices a tile spreads over gets a whole cache line at a time (one tile at a time, the
/// scalar transforms cost more than the products saved).
#[derive(Debug, Clone, Copy, Default)]
struct Lanes([f32; LANES]);

impl Add for Lanes {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self(std::array::from_fn(|l| self.0[l] + o.0[l]))
    }
}

impl Sub for Lanes {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self(std::array::from_fn(|l| self.0[l] - o.0[l]))
    }
}

impl Neg for Lanes {
    type Output = Self;
    fn neg(self) -> Self {
        Self(self.0.map(|x| -x))
    }
}

impl Mul<f32> for Lanes {
    type Output = Self;
    fn mul(self, k: f32) -> Self {
        Self(self.0.map(|x| x * k))
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
    /// 2 × 2 output blocks down and across one image.
    grid: [usize; 2],
}

/// A fresh buffer of 16 matrices of `len` floats, one after the other.
fn planes(len: usize) -> Vec<f32> {
    vec![0.0; 16 * len]
}

/// The 16 values at `index..index + LANES` of the 16 matrices of `len` floats in `planes`
/// (zero past `valid` of them).
fn load(planes: &[f32], len: usize, index: usize, valid: usize) -> [[Lanes; 4]; 4] {
    std::array::from_fn(|i| {
        std::array::from_fn(|j| {
            let from = &planes[(4 * i + j) * len + index..];
            let mut lanes = Lanes::default();
            if valid == LANES {
                // A copy of fixed length: a vector load, where `valid` floats are a call.
                lanes.0.copy_from_slice(&from[..LANES]);
            } else {
                lanes.0[..valid].copy_from_slice(&from[..valid]);
            }
            lanes
        })
    })
}

/// Writes the first `valid` lanes of `tile` at `index` of the 16 matrices of `len` floats in
/// `planes`.
fn store(planes: &mut [f32], len: usize, index: usize, valid: usize, tile: [[Lanes; 4]; 4]) {
    for (k, lanes) in tile.as_flattened().iter().enumerate() {
        let to = &mut planes[k * len + index..];
        if valid == LANES {
            to[..LANES].copy_from_slice(&lanes.0);
        } else {
            to[..valid].copy_from_slice(&lanes.0[..valid]);
        }
    }
}

/// The `R × C` entries at `offsets` (one per lane) of `plane`, `cols` apart down.
fn gather<const R: usize, const C: usize>(
    plane: &[f32],
    offsets: &[usize],
    cols: usize,
) -> [[Lanes; C]; R] {
    std::array::from_fn(|i| {
        std::array::from_fn(|j| Lanes(std::array::from_fn(|l| plane[offsets[l] + i * cols + j])))
    })
}

/// Each of the first `valid` lanes of `tile` added at its offset (`cols` apart down) into
/// `plane`.
fn spread<const R: usize, const C: usize>(
    tile: [[Lanes; C]; R],
    (plane, cols): (&mut [f32], usize),
    offsets: &[usize],
    valid: usize,
) {
    for (l, &offset) in offsets[..valid].iter().enumerate() {
        for (i, row) in tile.iter().enumerate() {
            for (j, lanes) in row.iter().enumerate() {
                plane[offset + i * cols + j] += lanes.0[l];
            }
        }
    }
}

impl Tiles {
    /// The tiling of an input of shape `s` under `geometry`, or `None` where this path does
    /// not apply (another kernel or stride, fewer than [`MIN_CHANNELS`] channels or
    /// [`MIN_TILES`] tiles).
    pub(super) fn of(s: &Shape, geometry: ConvGeometry) -> Option<Self> {
        let applies = s.num_dims() == 4
            && geometry.kernel == [3, 3]
            && geometry.stride == [1, 1]
            && s[1] >= MIN_CHANNELS;
        let side = [s[2], s[3]];
        let out = geometry.output(side);
        let tiles = Self {
            n: s[0],
            c: s[1],
            side,
            padding: geometry.padding,
            out,
            grid: out.map(|o| o.div_ceil(2)),
        };
        (applies && tiles.count() >= MIN_TILES).then_some(tiles)
    }

    /// Tiles over the whole batch: the columns of each product.
    fn count(&self) -> usize {
        self.n * self.grid[0] * self.grid[1]
    }

    /// How the tiles lie on the input images (4 × 4 tiles 2 apart, over the padded image) or
    /// on the output images (2 × 2 blocks).
    fn maps(&self, input: bool) -> Maps {
        let [gh, gw] = self.grid;
        let (image, corner, reach) = if input {
            (self.side, self.padding, 2)
        } else {
            (self.out, [0, 0], 0)
        };
        let [rows, cols] = self.grid.map(|g| 2 * g + reach);
        let mut offsets: Vec<usize> = (0..self.count())
            .map(|t| {
                let (b, t) = (t / (gh * gw), t % (gh * gw));
                b * rows * cols + 2 * (t / gw) * cols + 2 * (t % gw)
            })
            .collect();
        let last = offsets[offsets.len() - 1];
        offsets.resize(offsets.len().next_multiple_of(LANES), last);
        Maps {
            image,
            plane: [rows, cols],
            corner,
            offsets,
        }
    }

    /// Every tile of every channel of `images` (`channels` of them, laid out as `maps` says),
    /// its `R × C` block transformed by `transform`, as 16 matrices `channels × tiles`
    /// ([`planes`]), matrix k = 4i + j holding entry (i, j).
    fn tile<const R: usize, const C: usize>(
        &self,
        (images, channels, maps): (&[f32], usize, Maps),
        transform: impl Fn([[Lanes; C]; R]) -> [[Lanes; 4]; 4],
    ) -> Vec<f32> {
        let (tiles, len) = (self.count(), channels * self.count());
        let cols = maps.plane[1];
        let mut out = planes(len);
        let mut padded = vec![0.0; self.n * maps.plane[0] * cols];
        for c in 0..channels {
            maps.rows((self.n, c, channels), |i, p, len| {
                padded[p..p + len].copy_from_slice(&images[i..i + len]);
            });
            for (chunk, offsets) in maps.offsets.chunks_exact(LANES).enumerate() {
                let first = chunk * LANES;
                let block = gather::<R, C>(&padded, offsets, cols);
                let valid = LANES.min(tiles - first);
                store(&mut out, len, c * tiles + first, valid, transform(block));
            }
        }
        out
    }

    /// The way back from [`Tiles::tile`]: each tile of `planes` (16 matrices `channels ×
    /// tiles`) transformed by `transform` and added where its `R × C` block lies (tiles
    /// overlap on the input), then each image row handed to `finish(channel, image row,
    /// padded row)`.
    fn untile<const R: usize, const C: usize>(
        &self,
        (planes, channels, maps): (&[f32], usize, Maps),
        transform: impl Fn([[Lanes; 4]; 4]) -> [[Lanes; C]; R],
        mut finish: impl FnMut(usize, &mut [f32], &[f32]),
    ) -> Vec<f32> {
        let (tiles, len) = (self.count(), channels * self.count());
        let [h, w] = maps.image;
        let cols = maps.plane[1];
        let mut images = vec![0.0; self.n * channels * h * w];
        let mut padded = vec![0.0; self.n * maps.plane[0] * cols];
        for c in 0..channels {
            padded.fill(0.0);
            for (chunk, offsets) in maps.offsets.chunks_exact(LANES).enumerate() {
                let first = chunk * LANES;
                let valid = LANES.min(tiles - first);
                let block = transform(load(planes, len, c * tiles + first, valid));
                spread(block, (&mut padded, cols), offsets, valid);
            }
            maps.rows((self.n, c, channels), |i, p, len| {
                finish(c, &mut images[i..i + len], &padded[p..p + len]);
            });
        }
        images
    }

    /// `V`: `Bᵀ d B` of every input tile `d` (zeros beyond the image).
    fn input(&self, x: &[f32]) -> Vec<f32> {
        self.tile((x, self.c, self.maps(true)), |d| sandwich(d, bt, bt))
    }

    /// The adjoint of [`Tiles::input`]: `B dV Bᵀ` of every tile added into the input pixels
    /// it covers.
    fn input_adjoint(&self, d_v: &[f32]) -> Vec<f32> {
        let maps = self.maps(true);
        self.untile(
            (d_v, self.c, maps),
            |t| sandwich(t, bb, bb),
            |_, x, padded| x.copy_from_slice(padded),
        )
    }

    /// `N × c_out × H' × W'` from the 16 products `M_k` (`c_out × tiles` each, [`planes`]):
    /// `Aᵀ M A` of each tile, plus the bias.
    fn output(&self, m: &[f32], c_out: usize, bias: Option<&[f32]>) -> Vec<f32> {
        self.untile(
            (m, c_out, self.maps(false)),
            |t| sandwich(t, at_, at_),
            |co, y, block| {
                let shift = bias.map_or(0.0, |b| b[co]);
                for (y, v) in y.iter_mut().zip(block) {
                    *y = v + shift;
                }
            },
        )
    }

    /// The adjoint of [`Tiles::output`] without the bias: `Z = A dy Aᵀ` of every output
    /// block (zeros beyond the output).
    fn output_adjoint(&self, d_y: &[f32], c_out: usize) -> Vec<f32> {
        self.tile((d_y, c_out, self.maps(false)), |s| sandwich(s, aa, aa))
    }
}

/// Where one side of a convolution's tiles lies: images of `image` sides, each copied at
/// `corner` into a zero plane of `plane` sides, and each tile's top-left entry in those planes
/// ([`Tiles::maps`]).
struct Maps {
    image: [usize; 2],
    plane: [usize; 2],
    corner: [usize; 2],
    /// By tile index, the last repeated to a whole number of [`LANES`].
    offsets: Vec<usize>,
}

impl Maps {
    /// The rows of channel `c` of `n × channels` images and of their planes that hold the same
    /// pixels (the image cut at the plane's edge): `copy(image_row, plane_row, len)` gets each
    /// pair's offsets and the length in common.
    fn rows(
        &self,
        (n, c, channels): (usize, usize, usize),
        mut copy: impl FnMut(usize, usize, usize),
    ) {
        let ([h, w], [rows, cols], [top, left]) = (self.image, self.plane, self.corner);
        let len = w.min(cols.saturating_sub(left));
        for b in 0..n {
            for y in 0..h.min(rows.saturating_sub(top)) {
                copy(
                    (b * channels + c) * h * w + y * w,
                    b * rows * cols + (y + top) * cols + left,
                    len,
                );
            }
        }
    }
}

/// `U`: `G g Gᵀ` of every `c_out × c_in` filter pair, as 16 matrices `c_out × c_in`
/// ([`planes`]).
fn filters(f: &Strided) -> Vec<f32> {
    let (c_out, c_in) = (f.rows, f.cols / 9);
    let len = c_out * c_in;
    let mut u = planes(len);
    let (rs, cs) = (f.rs as usize, f.cs as usize);
    for first in (0..len).step_by(LANES) {
        let valid = LANES.min(len - first);
        // Each lane's pair, the last repeated past the end.
        let base: [usize; LANES] = std::array::from_fn(|l| {
            let pair = first + l.min(valid - 1);
            pair / c_in * rs + pair % c_in * 9 * cs
        });
        let taps: [[Lanes; 3]; 3] = std::array::from_fn(|i| {
            std::array::from_fn(|j| Lanes(base.map(|b| f.values[b + (3 * i + j) * cs])))
        });
        store(&mut u, len, first, valid, sandwich(taps, g, g));
    }
    u
}

/// The adjoint of [`filters`]: `Gᵀ dU G` of every filter pair, as the `c_out × (c_in·3·3)`
/// filter gradient.
fn filters_adjoint(d_u: &[f32], c_out: usize, c_in: usize) -> Vec<f32> {
    let len = c_out * c_in;
    let mut d_f = vec![0.0; len * 9];
    for first in (0..len).step_by(LANES) {
        let valid = LANES.min(len - first);
        let taps = sandwich(load(d_u, len, first, valid), gt, gt);
        for (l, d_f) in d_f[first * 9..][..valid * 9]
            .chunks_exact_mut(9)
            .enumerate()
        {
            for (d, lanes) in d_f.iter_mut().zip(taps.as_flattened()) {
                *d = lanes.0[l];
            }
        }
    }
    d_f
}

/// `L x Rᵀ` of a small matrix `x`, given `L` as `cols` (applied to each column) and `R` as
/// `rows` (applied to each row).
fn sandwich<const R: usize, const C: usize, const P: usize, const Q: usize>(
    x: [[Lanes; C]; R],
    cols: impl Fn([Lanes; R]) -> [Lanes; P],
    rows: impl Fn([Lanes; C]) -> [Lanes; Q],
) -> [[Lanes; Q]; P] {
    let mut t = [[Lanes::default(); C]; P];
    for j in 0..C {
        let col = cols(std::array::from_fn(|i| x[i][j]));
        for (i, value) in col.into_iter().enumerate() {
            t[i][j] = value;
        }
    }
    t.map(rows)
}

/// `Bᵀ r`, the input transform.
fn bt([r0, r1, r2, r3]: [Lanes; 4]) -> [Lanes; 4] {
    [r0 - r2, r1 + r2, r2 - r1, r1 - r3]
}

/// `B r`, its adjoint.
fn bb([r0, r1, r2, r3]: [Lanes; 4]) -> [Lanes; 4] {
    [r0, r1 - r2 + r3, r1 + r2 - r0, -r3]
}

/// `G r`, the filter transform.
fn g([r0, r1, r2]: [Lanes; 3]) -> [Lanes; 4] {
    [r0, (r0 + r1 + r2) * 0.5, (r0 - r1 + r2) * 0.5, r2]
}

/// `Gᵀ r`, its adjoint.
fn gt([r0, r1, r2, r3]: [Lanes; 4]) -> [Lanes; 3] {
    [r0 + (r1 + r2) * 0.5, (r1 - r2) * 0.5, (r1 + r2) * 0.5 + r3]
}

/// `Aᵀ r`, the output transform.
fn at_([r0, r1, r2, r3]: [Lanes; 4]) -> [Lanes; 2] {
    [r0 + r1 + r2, r1 - r2 - r3]
}

/// `A r`, its adjoint.
fn aa([r0, r1]: [Lanes; 2]) -> [Lanes; 4] {
    [r0, r0 + r1, r0 - r1, -r1]
}

/// The 16 products `a_k · b_k` (`m × depth` by `depth × n`) of the [`planes`] `a` (matrices of
/// `a_len` floats) and `b` (`b_len`), each operand read with the given (row, column) strides,
/// as [`planes`] of `m × n`.
fn products(
    [m, depth, n]: [usize; 3],
    (a, a_len, ars, acs): (&[f32], usize, isize, isize),
    (b, b_len, brs, bcs): (&[f32], usize, isize, isize),
) -> Vec<f32> {
    gemm_planes(
        16,
        [m, depth, n],
        (a, a_len, ars, acs),
        (b, b_len, brs, bcs),
    )
}

/// The convolution of `x` by `filters` on `tiles` ([`super::convolution::conv2d`]'s
/// contract): the output and `V`, which the backward pass keeps.
pub(super) fn conv2d(
    tiles: Tiles,
    x: &[f32],
    f: &Strided,
    bias: Option<&[f32]>,
) -> [NdArrayTensor; 2] {
    let (c_out, c_in, count) = (f.rows, tiles.c, tiles.count());
    let u = filters(f);
    let v = tiles.input(x);
    let m = products(
        [c_out, c_in, count],
        (&u, c_out * c_in, c_in as isize, 1),
        (&v, c_in * count, count as isize, 1),
    );
    let y = tiles.output(&m, c_out, bias);
    let [oh, ow] = tiles.out;
    let saved = Shape::new([16, c_in, count]);
    [
        tensor(y, Shape::new([tiles.n, c_out, oh, ow])),
        tensor(v, saved),
    ]
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
    let (c_out, c_in, count) = (f.rows, tiles.c, tiles.count());
    assert_eq!(
        saved.shape(),
        Shape::new([16, c_in, count]),
        "conv2d backward: the saved tiles do not match the input's shape"
    );
    let v = values(saved);
    let u = filters(f);
    let z = tiles.output_adjoint(grad, c_out);
    // dU_k = Z_k · V_kᵀ, dV_k = U_kᵀ · Z_k.
    let d_u = products(
        [c_out, count, c_in],
        (&z, c_out * count, count as isize, 1),
        (&v, c_in * count, 1, count as isize),
    );
    let d_v = products(
        [c_in, c_out, count],
        (&u, c_out * c_in, 1, c_in as isize),
        (&z, c_out * count, count as isize, 1),
    );
    let [oh, ow] = tiles.out;
    let d_bias = with_bias.then(|| {
        (0..c_out)
            .map(|co| {
                (0..tiles.n)
                    .map(|b| lane_sum(&grad[(b * c_out + co) * oh * ow..][..oh * ow]))
                    .sum()
            })
            .collect()
    });
    (
        tiles.input_adjoint(&d_v),
        filters_adjoint(&d_u, c_out, c_in),
        d_bias,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiles(shape: [usize; 4], padding: usize) -> Option<usize> {
        let geometry = ConvGeometry {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [padding; 2],
        };
        Tiles::of(&Shape::new(shape), geometry).map(|t| t.count())
    }

    /// The shapes of the kernel test (`winograd_conv_matches_burns_conv…`) and ResNet-18's
    /// first three stages take this path; its last stage, its stem, the digits CNN's
    /// convolutions (whose digests pin the patch matrix's sums) and strided ones do not.
    #[test]
    fn which_convolutions_take_the_tiles() {
        assert_eq!(tiles([2, 64, 12, 12], 1), Some(72));
        assert_eq!(tiles([2, 64, 13, 13], 1), Some(98));
        assert_eq!(tiles([2, 64, 13, 13], 0), Some(72));
        assert_eq!(tiles([2, 64, 12, 12], 2), Some(98));
        assert_eq!(tiles([8, 64, 32, 32], 1), Some(2048));
        assert_eq!(tiles([8, 256, 8, 8], 1), Some(128));
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
