//! Winograd's minimal filterings F(2 × 2, 3 × 3) and F(4 × 4, 3 × 3) (Lavin and Gray, "Fast
//! Algorithms for Convolutional Neural Networks", CVPR 2016, sections 4.1 and 4.2): the 1-D
//! transforms `Bᵀ`, `G`, `Aᵀ` and their adjoints, each applied to one column or row of a tile
//! by [`sandwich`], on [`LANES`] channels at once.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::{Add, Mul, Neg, Sub};

/// Channels of one tile (or filter pairs) transformed at once, one per lane of a vector.
pub(super) const LANES: usize = 16;

/// One entry of a tile in [`LANES`] channels (or of [`LANES`] filter pairs): the transforms'
/// additions and scalings on it are lane-wise loops of fixed length, which the compiler turns
/// into vector instructions, and each of the matrices a tile spreads over gets a whole cache
/// line at a time (one channel at a time, the scalar transforms cost more than the products
/// saved). Aligned to a cache line, so that the tiles the transforms keep on the stack are
/// whole vectors (unaligned, the compiler split their loads and stores across lanes).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub(super) struct Lanes(pub(super) [f32; LANES]);

impl Lanes {
    /// The first `valid` floats of `from`, zeros past them. The partial copy is a function
    /// of its own: inline, the compiler merged both branches into one call to `memcpy` of
    /// `valid` floats (4% of a ResNet-18 step on the AMD EPYC of Zen 5, in 64-byte calls),
    /// where 16 floats are a vector load.
    #[inline(always)]
    pub(super) fn read(from: &[f32], valid: usize) -> Self {
        if valid == LANES {
            let mut lanes = Self::default();
            lanes.0.copy_from_slice(&from[..LANES]);
            lanes
        } else {
            Self::read_partial(from, valid)
        }
    }

    /// [`Lanes::read`] of fewer than [`LANES`] floats: the last chunk of channels or pairs.
    #[cold]
    #[inline(never)]
    fn read_partial(from: &[f32], valid: usize) -> Self {
        let mut lanes = Self::default();
        lanes.0[..valid].copy_from_slice(&from[..valid]);
        lanes
    }

    /// Writes the first `valid` lanes at the start of `to`. Each branch copies a length of
    /// its own: with one loop over a length of either, the compiler made it a call to
    /// `memcpy` (10% of a ResNet-18 step on 6 × 6 tiles), where 16 floats are a vector store.
    #[inline(always)]
    pub(super) fn write(&self, to: &mut [MaybeUninit<f32>], valid: usize) {
        if valid == LANES {
            for (to, v) in to[..LANES].iter_mut().zip(&self.0) {
                to.write(*v);
            }
        } else {
            for (to, v) in to[..valid].iter_mut().zip(&self.0) {
                to.write(*v);
            }
        }
    }

    /// Adds the first `valid` lanes into the start of `to` (vector additions where all lanes
    /// count, as [`Lanes::write`]).
    #[inline(always)]
    pub(super) fn add_to(&self, to: &mut [f32], valid: usize) {
        if valid == LANES {
            for (to, v) in to[..LANES].iter_mut().zip(&self.0) {
                *to += v;
            }
        } else {
            for (to, v) in to[..valid].iter_mut().zip(&self.0) {
                *to += v;
            }
        }
    }
}

impl Add for Lanes {
    type Output = Self;
    #[inline(always)]
    fn add(mut self, o: Self) -> Self {
        self.0.iter_mut().zip(o.0).for_each(|(a, b)| *a += b);
        self
    }
}

impl Sub for Lanes {
    type Output = Self;
    #[inline(always)]
    fn sub(mut self, o: Self) -> Self {
        self.0.iter_mut().zip(o.0).for_each(|(a, b)| *a -= b);
        self
    }
}

impl Neg for Lanes {
    type Output = Self;
    #[inline(always)]
    fn neg(mut self) -> Self {
        self.0.iter_mut().for_each(|a| *a = -*a);
        self
    }
}

impl Mul<f32> for Lanes {
    type Output = Self;
    #[inline(always)]
    fn mul(mut self, k: f32) -> Self {
        self.0.iter_mut().for_each(|a| *a *= k);
        self
    }
}

/// F(M × M, 3 × 3) on `T × T` input tiles (`T = M + 2`): each `M × M` block of outputs is
/// `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` for the tile `d` under it and the filter `g`.
pub(super) trait Minimal<const M: usize, const T: usize> {
    /// `Bᵀ r`, the input transform.
    fn bt(r: &[Lanes; T]) -> [Lanes; T];
    /// `B r`, its adjoint.
    fn b(r: &[Lanes; T]) -> [Lanes; T];
    /// `G r`, the filter transform.
    fn g(r: &[Lanes; 3]) -> [Lanes; T];
    /// `Gᵀ r`, its adjoint.
    fn gt(r: &[Lanes; T]) -> [Lanes; 3];
    /// `Aᵀ r`, the output transform.
    fn at(r: &[Lanes; T]) -> [Lanes; M];
    /// `A r`, its adjoint.
    fn a(r: &[Lanes; M]) -> [Lanes; T];
}

/// F(2 × 2, 3 × 3): 16 products per tile of 4 outputs (2.25 times fewer than the patch
/// matrix's), transforms of additions and halvings.
pub(super) struct F2;

impl Minimal<2, 4> for F2 {
    #[inline(always)]
    fn bt(&[r0, r1, r2, r3]: &[Lanes; 4]) -> [Lanes; 4] {
        [r0 - r2, r1 + r2, r2 - r1, r1 - r3]
    }

    #[inline(always)]
    fn b(&[r0, r1, r2, r3]: &[Lanes; 4]) -> [Lanes; 4] {
        [r0, r1 - r2 + r3, r1 + r2 - r0, -r3]
    }

    #[inline(always)]
    fn g(&[r0, r1, r2]: &[Lanes; 3]) -> [Lanes; 4] {
        [r0, (r0 + r1 + r2) * 0.5, (r0 - r1 + r2) * 0.5, r2]
    }

    #[inline(always)]
    fn gt(&[r0, r1, r2, r3]: &[Lanes; 4]) -> [Lanes; 3] {
        [r0 + (r1 + r2) * 0.5, (r1 - r2) * 0.5, (r1 + r2) * 0.5 + r3]
    }

    #[inline(always)]
    fn at(&[r0, r1, r2, r3]: &[Lanes; 4]) -> [Lanes; 2] {
        [r0 + r1 + r2, r1 - r2 - r3]
    }

    #[inline(always)]
    fn a(&[r0, r1]: &[Lanes; 2]) -> [Lanes; 4] {
        [r0, r0 + r1, r0 - r1, -r1]
    }
}

/// F(4 × 4, 3 × 3) on the points 0, ±1, ±2, ∞: 36 products per tile of 16 outputs (4 times
/// fewer than the patch matrix's), and a tile's transformed entries 2.25 floats per output
/// where F(2 × 2, 3 × 3) has 4. Its transforms scale by up to 8 and 1/24, so it rounds more:
/// in the kernel test (`winograd_conv_matches_burns_conv…`) its worst element is 2.9e-5 off
/// burn's convolution, relative to the outputs' size, where F(2 × 2)'s is 2.7e-6.
pub(super) struct F4;

impl Minimal<4, 6> for F4 {
    #[inline(always)]
    fn bt(&[r0, r1, r2, r3, r4, r5]: &[Lanes; 6]) -> [Lanes; 6] {
        let (s, d) = (r4 - r2 * 4.0, r3 - r1 * 4.0);
        let (p, q) = (r4 - r2, (r3 - r1) * 2.0);
        [
            r0 * 4.0 - r2 * 5.0 + r4,
            s + d,
            s - d,
            p + q,
            p - q,
            r1 * 4.0 - r3 * 5.0 + r5,
        ]
    }

    #[inline(always)]
    fn b(&[r0, r1, r2, r3, r4, r5]: &[Lanes; 6]) -> [Lanes; 6] {
        [
            r0 * 4.0,
            (r2 - r1 + r5) * 4.0 + (r4 - r3) * 2.0,
            -(r0 * 5.0 + (r1 + r2) * 4.0 + r3 + r4),
            r1 - r2 + (r3 - r4) * 2.0 - r5 * 5.0,
            r0 + r1 + r2 + r3 + r4,
            r5,
        ]
    }

    #[inline(always)]
    fn g(&[r0, r1, r2]: &[Lanes; 3]) -> [Lanes; 6] {
        let (even, odd) = (r0 + r2, r1);
        [
            r0 * 0.25,
            (even + odd) * (-1.0 / 6.0),
            (even - odd) * (-1.0 / 6.0),
            r0 * (1.0 / 24.0) + r1 * (1.0 / 12.0) + r2 * (1.0 / 6.0),
            r0 * (1.0 / 24.0) - r1 * (1.0 / 12.0) + r2 * (1.0 / 6.0),
            r2,
        ]
    }

    #[inline(always)]
    fn gt(&[r0, r1, r2, r3, r4, r5]: &[Lanes; 6]) -> [Lanes; 3] {
        [
            r0 * 0.25 - (r1 + r2) * (1.0 / 6.0) + (r3 + r4) * (1.0 / 24.0),
            (r2 - r1) * (1.0 / 6.0) + (r3 - r4) * (1.0 / 12.0),
            (r3 + r4 - r1 - r2) * (1.0 / 6.0) + r5,
        ]
    }

    #[inline(always)]
    fn at(&[r0, r1, r2, r3, r4, r5]: &[Lanes; 6]) -> [Lanes; 4] {
        let (s, d) = (r1 + r2, r1 - r2);
        let (s2, d2) = (r3 + r4, r3 - r4);
        [r0 + s + s2, d + d2 * 2.0, s + s2 * 4.0, d + d2 * 8.0 + r5]
    }

    #[inline(always)]
    fn a(&[r0, r1, r2, r3]: &[Lanes; 4]) -> [Lanes; 6] {
        let (even, odd) = (r0 + r2, r1 + r3);
        let (even2, odd2) = (r0 + r2 * 4.0, r1 * 2.0 + r3 * 8.0);
        [r0, even + odd, even - odd, even2 + odd2, even2 - odd2, r3]
    }
}

/// One of a filtering's six 1-D transforms as a type, so that [`sandwich`] calls it
/// directly: passed as a function value, F(4 × 4)'s transforms stayed calls through
/// `Fn::call`, each moving a tile's rows through memory and `memcpy` (11% of a ResNet-18
/// step).
pub(super) trait Linear<const R: usize, const P: usize> {
    fn apply(r: &[Lanes; R]) -> [Lanes; P];
}

/// `Linear` types naming each transform of a [`Minimal`] filtering `W`.
macro_rules! linear {
    ($($name:ident: $transform:ident, $r:ident -> $p:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        pub(super) struct $name<W, const M: usize, const T: usize>(PhantomData<W>);

        impl<W: Minimal<M, T>, const M: usize, const T: usize> Linear<$r, $p>
            for $name<W, M, T>
        {
            #[inline(always)]
            fn apply(r: &[Lanes; $r]) -> [Lanes; $p] {
                W::$transform(r)
            }
        }
    )*};
}

/// The filter's 3 taps, as a const generic like the tiles' sides.
const K: usize = 3;

linear! {
    InputTransform: bt, T -> T, "`Bᵀ`, the input transform.";
    InputAdjoint: b, T -> T, "`B`, its adjoint.";
    FilterTransform: g, K -> T, "`G`, the filter transform.";
    FilterAdjoint: gt, T -> K, "`Gᵀ`, its adjoint.";
    OutputTransform: at, T -> M, "`Aᵀ`, the output transform.";
    OutputAdjoint: a, M -> T, "`A`, its adjoint.";
}

/// A tile that [`sandwich`] reads a column of `R` entries at a time.
pub(super) trait Columns<const R: usize> {
    fn column(&self, j: usize) -> [Lanes; R];
}

/// Where [`sandwich`] writes its result, a row of `P` entries at a time.
pub(super) trait Rows<const P: usize> {
    fn row(&mut self, i: usize, row: &[Lanes; P]);
}

/// `L x Lᵀ` of a small `R × R` matrix `x` read a column at a time (`L` applied to each
/// column, then to each row), each row of the result handed to `out`. Tiles and their rows
/// never move as whole values (the transforms take them by reference, the loops index them):
/// F(4 × 4)'s 6 × 6 tiles moved by value went through `memcpy`, 384 bytes a row being past
/// what the compiler copies inline.
#[inline(always)]
pub(super) fn sandwich<const R: usize, const P: usize, L: Linear<R, P>>(
    x: impl Columns<R>,
    mut out: impl Rows<P>,
) {
    let mut t = [[Lanes::default(); R]; P];
    for j in 0..R {
        for (row, value) in t.iter_mut().zip(&L::apply(&x.column(j))) {
            row[j] = *value;
        }
    }
    for (i, t) in t.iter().enumerate() {
        out.row(i, &L::apply(t));
    }
}
