//! GPT-2's GELU and the attention's row softmax, forward and backward, one pass per row.

use super::{contiguous, lane_dot, lane_sum, values, wide, writable};
use crate::models::kernels::{GELU_A, GELU_C};
use burn_ndarray::NdArrayTensor;

pub(super) fn gelu(x: NdArrayTensor) -> NdArrayTensor {
    let mut y = writable(x);
    wide(
        #[inline(always)]
        || {
            for y in contiguous(&mut y) {
                *y *= half_one_plus_tanh(*y);
            }
        },
    );
    NdArrayTensor::from(y)
}

pub(super) fn gelu_backward(x: NdArrayTensor, grad: NdArrayTensor) -> NdArrayTensor {
    let mut dx = writable(grad);
    let x = values(&x);
    assert_eq!(
        dx.len(),
        x.len(),
        "gelu backward: gradient and input of other lengths"
    );
    wide(
        #[inline(always)]
        || {
            for (g, &x) in contiguous(&mut dx).iter_mut().zip(x.iter()) {
                let s = half_one_plus_tanh(x);
                let du = 2.0 * GELU_C * (1.0 + 3.0 * GELU_A * x * x);
                *g *= s + x * s * (1.0 - s) * du;
            }
        },
    );
    NdArrayTensor::from(dx)
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

/// Row-wise softmax of `values` (rows of `cols`); with `causal`, row r of each `cols × cols`
/// block sees columns `0..=r % cols` and puts exactly 0 on the rest.
pub(in crate::models::kernels) fn softmax_rows(values: &mut [f32], cols: usize, causal: bool) {
    wide(
        #[inline(always)]
        || {
            for (r, row) in values.chunks_exact_mut(cols).enumerate() {
                let seen = if causal { r % cols + 1 } else { cols };
                let (kept, masked) = row.split_at_mut(seen);
                let max = kept.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                kept.iter_mut().for_each(|v| *v = exp(*v - max));
                let inv = 1.0 / lane_sum(kept);
                kept.iter_mut().for_each(|v| *v *= inv);
                masked.fill(0.0);
            }
        },
    );
}

/// `grad ← y ⊙ (grad − Σ_j grad_j y_j)` row by row: the softmax backward pass in place.
///
/// The row's `Σ_j grad_j y_j` is kept in [`LANES`](super::LANES) partial sums, as the other row
/// sums are, so that it vectorises: summed in column order it is a chain of dependent additions
/// the compiler may not reorder. (Only the attention calls this, so no model digest moves.)
pub(in crate::models::kernels) fn softmax_backward_rows(y: &[f32], grad: &mut [f32], cols: usize) {
    wide(
        #[inline(always)]
        || {
            for (d, y) in grad.chunks_exact_mut(cols).zip(y.chunks_exact(cols)) {
                let dot = lane_dot(d, y);
                d.iter_mut().zip(y).for_each(|(d, &y)| *d = y * (*d - dot));
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::{exp, gelu, gelu_backward, half_one_plus_tanh};
    use crate::models::kernels::ndarray::{tensor, values};
    use crate::models::kernels::{GELU_A, GELU_C};
    use burn::tensor::Shape;

    /// The GELU's loops under `wide` (16 floats at a time where the CPU has AVX-512) give the
    /// bits of the same arithmetic element by element in a plain loop (the build's width).
    #[test]
    fn the_wide_gelu_gives_the_bits_of_the_plain_loop() {
        let x: Vec<f32> = (-3000..3000).map(|i| i as f32 * 0.0031 + 1e-4).collect();
        let g: Vec<f32> = x.iter().map(|x| (x * 7.3).sin()).collect();
        let t = |v: &[f32]| tensor(v.to_vec(), Shape::new([v.len()]));
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let y = gelu(t(&x));
        let plain: Vec<f32> = x.iter().map(|&x| x * half_one_plus_tanh(x)).collect();
        assert_eq!(bits(&values(&y)), bits(&plain));
        let dx = gelu_backward(t(&x), t(&g));
        let plain: Vec<f32> = x
            .iter()
            .zip(&g)
            .map(|(&x, &g)| {
                let s = half_one_plus_tanh(x);
                let du = 2.0 * GELU_C * (1.0 + 3.0 * GELU_A * x * x);
                g * (s + x * s * (1.0 - s) * du)
            })
            .collect();
        assert_eq!(bits(&values(&dx)), bits(&plain));
    }

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
