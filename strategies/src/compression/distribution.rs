//! Product distributions over the coordinates of a message (docs/algorithms.md §4.1, §4.4, §4.6–4.9):
//! Bernoulli masks (FedPM), categoricals over `{−1, 0, +1}` (QSGD, SignSGD) and Gaussians
//! (SGLD). Each is a validated view over the caller's parameter slices, so building one per round
//! copies nothing.
//!
//! Sampling follows the fixed draw order of §4.2 so that client and server, running the same
//! code on the same ChaCha stream, draw identical candidates: a candidate consumes a fixed
//! number of 32-bit words of the stream ([`ProductDistribution::words_per_candidate`]), which
//! also lets the decoder jump straight to the chosen candidate.
//!
//! Discrete coordinates use one 32-bit word each, `U = W · 2⁻³²` (exact in `f64`): the
//! probabilities are resolved to 2.3·10⁻¹⁰, far below any effect on training, and the encoder,
//! whose floor is `K · S` draws per block, reads half the keystream a 53-bit uniform would need.
//! Gaussians use two 53-bit uniforms per pair of coordinates (Box–Muller).

use std::f64::consts::{LN_2, TAU};
use std::fmt::Debug;
use std::ops::Range;

use crate::error::{Result, StrategyError};
use rand::Rng;

use crate::rng::{ChaCha20Rng, uniform};

/// A distribution that is a product over coordinates `j = 0..len`, with the closed forms KLMS
/// needs: log-likelihoods, the per-coordinate log importance ratio `ln q_j(y) − ln p_j(y)`
/// (§4.1 step 2) and `KL(q_j ‖ p_j)` in bits (§4.4).
pub trait ProductDistribution {
    /// The value of one coordinate of a sample.
    type Symbol: Copy + PartialEq + Default + Debug + Send + Sync;
    /// `ln q_j(·) − ln p_j(·)` for one coordinate, prepared once so that a candidate costs one
    /// table look-up or a few multiplications per coordinate, no logarithm.
    type LogRatio: Copy + Debug + Send + Sync;

    /// The number of coordinates.
    fn len(&self) -> usize;
    /// Whether there are no coordinates.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `ln d_j(x)`; `−∞` where `d_j(x) = 0`.
    fn log_likelihood(&self, j: usize, x: Self::Symbol) -> f64;
    /// `KL(q_j ‖ p_j)` in bits, the closed form of §4.4; `+∞` where `q_j` puts mass where `p_j`
    /// puts none.
    fn kl_bits(q: &Self, p: &Self, j: usize) -> f64;
    /// The prepared log ratio `ln q_j − ln p_j` of coordinate `j`.
    fn log_ratio(q: &Self, p: &Self, j: usize) -> Self::LogRatio;
    /// Evaluates a prepared log ratio at `x`: `−∞` where `q_j(x) = 0`, `+∞` where only
    /// `p_j(x) = 0`.
    fn eval_log_ratio(ratio: &Self::LogRatio, x: Self::Symbol) -> f64;
    /// Draws one candidate's coordinates `block` from `self` into `out` (`out.len()` equals
    /// `block.len()`), consuming exactly [`Self::words_per_candidate`] words of `rng`.
    fn sample_block(&self, block: Range<usize>, rng: &mut ChaCha20Rng, out: &mut [Self::Symbol]);
    /// The 32-bit words of the stream one candidate over `block_len` coordinates consumes.
    fn words_per_candidate(block_len: usize) -> u64;
    /// A symbol as a number: 0/1 for a mask bit, `−1, 0, +1` for a ternary symbol, the value of
    /// a Gaussian coordinate. Means of samples (the drift KLMS transmits) are taken over these.
    fn value(x: Self::Symbol) -> f64;
    /// `E_{d_j}[value]`, the mean of coordinate `j`.
    fn mean(&self, j: usize) -> f64;
    /// Draws one candidate like [`Self::sample_block`] and returns its log-weight
    /// `l = Σ_j ln q_j(y_j) − ln p_j(y_j)` from the prepared `ratios` of the block (§4.1 step 2).
    /// Implementations may fuse the two passes; the values drawn are the same.
    fn sample_and_weigh(
        &self,
        block: Range<usize>,
        rng: &mut ChaCha20Rng,
        ratios: &[Self::LogRatio],
        out: &mut [Self::Symbol],
    ) -> f64 {
        self.sample_block(block, rng, out);
        ratios
            .iter()
            .zip(out.iter())
            .map(|(r, &x)| Self::eval_log_ratio(r, x))
            .sum()
    }
}

/// Checks that the client-only `q` and the global `p` describe the same coordinates.
pub fn check_same_len<D: ProductDistribution>(q: &D, p: &D) -> Result<()> {
    if q.len() != p.len() {
        return Err(StrategyError::invalid(
            "distributions",
            format!(
                "q has {} coordinates but p has {}; they must describe the same vector",
                q.len(),
                p.len()
            ),
        ));
    }
    Ok(())
}

/// `KL(q ‖ p)` in bits of every coordinate (the `D_j` of §4.4).
pub fn kl_bits_per_coordinate<D: ProductDistribution>(q: &D, p: &D) -> Result<Vec<f64>> {
    check_same_len(q, p)?;
    Ok((0..q.len()).map(|j| D::kl_bits(q, p, j)).collect())
}

/// `KL(q_I ‖ p_I) = Σ_{j ∈ I} KL(q_j ‖ p_j)` in bits over one block `I` (§4.4; the KL of a
/// product is the sum of the coordinates' KLs).
pub fn block_kl_bits<D: ProductDistribution>(q: &D, p: &D, block: Range<usize>) -> Result<f64> {
    check_same_len(q, p)?;
    check_block(&block, q.len())?;
    Ok(block.map(|j| D::kl_bits(q, p, j)).sum())
}

/// `ln d(x) = Σ_{j ∈ block} ln d_j(x_j)` of a sample `x` of the coordinates `block`.
pub fn block_log_likelihood<D: ProductDistribution>(
    d: &D,
    block: Range<usize>,
    x: &[D::Symbol],
) -> Result<f64> {
    check_block(&block, d.len())?;
    if x.len() != block.len() {
        return Err(StrategyError::invalid(
            "sample",
            format!(
                "{} values for a block of {} coordinates",
                x.len(),
                block.len()
            ),
        ));
    }
    Ok(block.zip(x).map(|(j, &v)| d.log_likelihood(j, v)).sum())
}

/// Checks that `block` is a non-empty range inside `0..len`.
pub(crate) fn check_block(block: &Range<usize>, len: usize) -> Result<()> {
    if block.start >= block.end || block.end > len {
        return Err(StrategyError::invalid(
            "block",
            format!(
                "{}..{} must be a non-empty range inside 0..{len}",
                block.start, block.end
            ),
        ));
    }
    Ok(())
}

/// `x ln(x / y)` with the conventions `0 ln(0/y) = 0`, `x ln(x/0) = +∞` for `x > 0`.
fn x_ln_x_over_y(x: f64, y: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else if y == 0.0 {
        f64::INFINITY
    } else {
        x * (x / y).ln()
    }
}

/// `ln q − ln p` with the conventions of [`ProductDistribution::eval_log_ratio`].
fn ln_ratio(q: f64, p: f64) -> f64 {
    if q == 0.0 {
        f64::NEG_INFINITY
    } else if p == 0.0 {
        f64::INFINITY
    } else {
        (q / p).ln()
    }
}

fn check_probability(what: &'static str, j: usize, value: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&value) {
        return Err(StrategyError::invalid(
            what,
            format!("coordinate {j} has probability {value}, outside [0, 1]"),
        ));
    }
    Ok(())
}

/// Calls `f(j, U_j)` for `j = 0..n` with `U_j = W_j · 2⁻³²`, `W_j` the stream's next 32-bit
/// words, read in bulk: the same words, in the same order, as `n` calls of `next_u32` (ChaCha's
/// `fill_bytes` yields its words little-endian), only faster.
#[inline]
fn for_each_uniform32(rng: &mut ChaCha20Rng, n: usize, mut f: impl FnMut(usize, f64)) {
    const CHUNK: usize = 128;
    const SCALE: f64 = 1.0 / (1u64 << 32) as f64;
    let mut bytes = [0u8; 4 * CHUNK];
    for start in (0..n).step_by(CHUNK) {
        let len = CHUNK.min(n - start);
        let bytes = &mut bytes[..4 * len];
        rng.fill_bytes(bytes);
        for (i, word) in bytes.chunks_exact(4).enumerate() {
            let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            f(start + i, f64::from(word) * SCALE);
        }
    }
}

/// Independent Bernoulli coordinates, `d_j(1) = probs[j]`: FedPM's masks (§4.6).
#[derive(Debug, Clone, Copy)]
pub struct Bernoulli<'a> {
    probs: &'a [f64],
}

impl<'a> Bernoulli<'a> {
    /// Validates that every probability is in `[0, 1]` (NaN is rejected).
    pub fn new(probs: &'a [f64]) -> Result<Self> {
        for (j, &p) in probs.iter().enumerate() {
            check_probability("Bernoulli probabilities", j, p)?;
        }
        Ok(Self { probs })
    }

    /// `d_j(1)` of every coordinate.
    pub fn probabilities(&self) -> &'a [f64] {
        self.probs
    }
}

impl ProductDistribution for Bernoulli<'_> {
    type Symbol = bool;

    fn value(x: bool) -> f64 {
        f64::from(u8::from(x))
    }

    fn mean(&self, j: usize) -> f64 {
        self.probs[j]
    }
    /// `[ln q(0) − ln p(0), ln q(1) − ln p(1)]`.
    type LogRatio = [f64; 2];

    fn len(&self) -> usize {
        self.probs.len()
    }

    fn log_likelihood(&self, j: usize, x: bool) -> f64 {
        let p = self.probs[j];
        if x { p.ln() } else { (1.0 - p).ln() }
    }

    /// `q log2(q/p) + (1−q) log2((1−q)/(1−p))` (§4.4).
    fn kl_bits(q: &Self, p: &Self, j: usize) -> f64 {
        let (q, p) = (q.probs[j], p.probs[j]);
        (x_ln_x_over_y(q, p) + x_ln_x_over_y(1.0 - q, 1.0 - p)) / LN_2
    }

    fn log_ratio(q: &Self, p: &Self, j: usize) -> [f64; 2] {
        let (q, p) = (q.probs[j], p.probs[j]);
        [ln_ratio(1.0 - q, 1.0 - p), ln_ratio(q, p)]
    }

    #[inline]
    fn eval_log_ratio(ratio: &[f64; 2], x: bool) -> f64 {
        ratio[x as usize]
    }

    /// `y_j = 1{U_j < p_j}` with `U_j = W_j · 2⁻³²`, one 32-bit word per coordinate (§4.2).
    #[inline]
    fn sample_block(&self, block: Range<usize>, rng: &mut ChaCha20Rng, out: &mut [bool]) {
        let probs = &self.probs[block];
        for_each_uniform32(rng, out.len(), |j, u| out[j] = u < probs[j]);
    }

    fn words_per_candidate(block_len: usize) -> u64 {
        block_len as u64
    }

    #[inline]
    fn sample_and_weigh(
        &self,
        block: Range<usize>,
        rng: &mut ChaCha20Rng,
        ratios: &[[f64; 2]],
        out: &mut [bool],
    ) -> f64 {
        let probs = &self.probs[block];
        let mut l = 0.0;
        for_each_uniform32(rng, out.len(), |j, u| {
            let y = u < probs[j];
            out[j] = y;
            l += ratios[j][y as usize];
        });
        l
    }
}

/// The support of a [`Categorical`] coordinate, in the fixed order of the inverse CDF (§4.2).
pub const TERNARY_SUPPORT: [i8; 3] = [-1, 0, 1];

/// Independent categorical coordinates over `{−1, 0, +1}`, `probs[j] = [d_j(−1), d_j(0),
/// d_j(+1)]`: QSGD's and SignSGD's symbols (§4.7–4.8; SignSGD puts no mass on 0).
#[derive(Debug, Clone, Copy)]
pub struct Categorical<'a> {
    probs: &'a [[f64; 3]],
}

impl<'a> Categorical<'a> {
    /// How far from 1 a coordinate's probabilities may sum.
    pub const SUM_TOLERANCE: f64 = 1e-9;

    /// Validates that each coordinate's probabilities are in `[0, 1]` and sum to 1 within
    /// [`Self::SUM_TOLERANCE`].
    pub fn new(probs: &'a [[f64; 3]]) -> Result<Self> {
        for (j, row) in probs.iter().enumerate() {
            for &v in row {
                check_probability("categorical probabilities", j, v)?;
            }
            let sum: f64 = row.iter().sum();
            if (sum - 1.0).abs() > Self::SUM_TOLERANCE {
                return Err(StrategyError::invalid(
                    "categorical probabilities",
                    format!("coordinate {j} sums to {sum}, expected 1 (order −1, 0, +1)"),
                ));
            }
        }
        Ok(Self { probs })
    }

    /// `[d_j(−1), d_j(0), d_j(+1)]` of every coordinate.
    pub fn probabilities(&self) -> &'a [[f64; 3]] {
        self.probs
    }
}

/// The slot of a ternary symbol in `[−1, 0, +1]` order; anything positive counts as `+1`.
#[inline]
fn ternary_slot(x: i8) -> usize {
    (x.signum() + 1) as usize
}

impl ProductDistribution for Categorical<'_> {
    type Symbol = i8;

    fn value(x: i8) -> f64 {
        f64::from(x.signum())
    }

    fn mean(&self, j: usize) -> f64 {
        self.probs[j][2] - self.probs[j][0]
    }
    /// `ln q(v) − ln p(v)` for `v = −1, 0, +1`.
    type LogRatio = [f64; 3];

    fn len(&self) -> usize {
        self.probs.len()
    }

    fn log_likelihood(&self, j: usize, x: i8) -> f64 {
        self.probs[j][ternary_slot(x)].ln()
    }

    /// `Σ_v q(v) log2(q(v)/p(v))` (§4.4).
    fn kl_bits(q: &Self, p: &Self, j: usize) -> f64 {
        let (q, p) = (&q.probs[j], &p.probs[j]);
        (0..3).map(|v| x_ln_x_over_y(q[v], p[v])).sum::<f64>() / LN_2
    }

    fn log_ratio(q: &Self, p: &Self, j: usize) -> [f64; 3] {
        let (q, p) = (&q.probs[j], &p.probs[j]);
        [0, 1, 2].map(|v| ln_ratio(q[v], p[v]))
    }

    #[inline]
    fn eval_log_ratio(ratio: &[f64; 3], x: i8) -> f64 {
        ratio[ternary_slot(x)]
    }

    fn words_per_candidate(block_len: usize) -> u64 {
        block_len as u64
    }

    /// Inverse CDF over the order `−1, 0, +1` with one 32-bit word per coordinate,
    /// `U = W · 2⁻³²` (§4.2).
    /// A uniform beyond the last cumulative sum (rounding) yields the last symbol of positive
    /// probability, so a zero-probability symbol is never drawn.
    #[inline]
    fn sample_block(&self, block: Range<usize>, rng: &mut ChaCha20Rng, out: &mut [i8]) {
        let probs = &self.probs[block];
        for_each_uniform32(rng, out.len(), |j, u| {
            let row = &probs[j];
            let (minus, zero) = (row[0], row[0] + row[1]);
            out[j] = if u < minus {
                -1
            } else if u < zero {
                0
            } else if row[2] > 0.0 {
                1
            } else if row[1] > 0.0 {
                0
            } else {
                -1
            };
        });
    }
}

/// Independent Gaussian coordinates `N(means[j], std_devs[j]²)`: SGLD's messages (§4.9) and the
/// toy of Appendix F.1.
///
/// Sampling uses Box–Muller on pairs of coordinates within one candidate: the uniforms
/// `(u₁, u₂)` give `z₁ = √(−2 ln(1 − u₁)) cos(2π u₂)`, `z₂ = … sin(2π u₂)`; a block of odd length
/// uses the cosine of its last pair and drops the sine, so a candidate always consumes an even
/// number of words.
#[derive(Debug, Clone, Copy)]
pub struct Gaussian<'a> {
    means: &'a [f64],
    std_devs: &'a [f64],
}

impl<'a> Gaussian<'a> {
    /// Validates equal lengths, finite means and finite positive standard deviations.
    pub fn new(means: &'a [f64], std_devs: &'a [f64]) -> Result<Self> {
        if means.len() != std_devs.len() {
            return Err(StrategyError::invalid(
                "Gaussian parameters",
                format!(
                    "{} means but {} standard deviations",
                    means.len(),
                    std_devs.len()
                ),
            ));
        }
        if let Some(j) = means.iter().position(|m| !m.is_finite()) {
            return Err(StrategyError::invalid(
                "Gaussian means",
                format!(
                    "coordinate {j} has mean {}, expected a finite number",
                    means[j]
                ),
            ));
        }
        if let Some(j) = std_devs.iter().position(|&s| !(s > 0.0 && s.is_finite())) {
            return Err(StrategyError::invalid(
                "Gaussian standard deviations",
                format!(
                    "coordinate {j} has σ = {}, expected a finite σ > 0",
                    std_devs[j]
                ),
            ));
        }
        Ok(Self { means, std_devs })
    }

    /// The means `μ_j`.
    pub fn means(&self) -> &'a [f64] {
        self.means
    }

    /// The standard deviations `σ_j`.
    pub fn std_devs(&self) -> &'a [f64] {
        self.std_devs
    }
}

/// The prepared Gaussian log ratio: `ln q(x) − ln p(x) = offset − (x − μ_q)² · half_prec_q +
/// (x − μ_p)² · half_prec_p`, with `half_prec = 1/(2σ²)` and `offset = ln(σ_p/σ_q)`.
#[derive(Debug, Clone, Copy)]
pub struct GaussianLogRatio {
    offset: f64,
    mean_q: f64,
    half_precision_q: f64,
    mean_p: f64,
    half_precision_p: f64,
}

impl ProductDistribution for Gaussian<'_> {
    type Symbol = f64;

    fn value(x: f64) -> f64 {
        x
    }

    fn mean(&self, j: usize) -> f64 {
        self.means[j]
    }
    type LogRatio = GaussianLogRatio;

    fn len(&self) -> usize {
        self.means.len()
    }

    fn log_likelihood(&self, j: usize, x: f64) -> f64 {
        let (mu, sigma) = (self.means[j], self.std_devs[j]);
        let z = (x - mu) / sigma;
        -0.5 * z * z - sigma.ln() - 0.5 * TAU.ln()
    }

    /// `ln(σ_p/σ_q) + (σ_q² + (μ_q − μ_p)²)/(2σ_p²) − 1/2`, in bits; with equal variances the
    /// `(μ_q − μ_p)² / (2σ² ln 2)` of §4.4.
    fn kl_bits(q: &Self, p: &Self, j: usize) -> f64 {
        let (mq, sq, mp, sp) = (q.means[j], q.std_devs[j], p.means[j], p.std_devs[j]);
        let d = mq - mp;
        ((sp / sq).ln() + (sq * sq + d * d) / (2.0 * sp * sp) - 0.5) / LN_2
    }

    fn log_ratio(q: &Self, p: &Self, j: usize) -> GaussianLogRatio {
        let (sq, sp) = (q.std_devs[j], p.std_devs[j]);
        GaussianLogRatio {
            offset: (sp / sq).ln(),
            mean_q: q.means[j],
            half_precision_q: 0.5 / (sq * sq),
            mean_p: p.means[j],
            half_precision_p: 0.5 / (sp * sp),
        }
    }

    #[inline]
    fn eval_log_ratio(r: &GaussianLogRatio, x: f64) -> f64 {
        let (dq, dp) = (x - r.mean_q, x - r.mean_p);
        r.offset - dq * dq * r.half_precision_q + dp * dp * r.half_precision_p
    }

    fn sample_block(&self, block: Range<usize>, rng: &mut ChaCha20Rng, out: &mut [f64]) {
        let means = &self.means[block.clone()];
        let sigmas = &self.std_devs[block];
        for (pair, (mu, sigma)) in out.chunks_mut(2).zip(means.chunks(2).zip(sigmas.chunks(2))) {
            let radius = (-2.0 * (1.0 - uniform(rng)).ln()).sqrt();
            let (sin, cos) = (TAU * uniform(rng)).sin_cos();
            pair[0] = mu[0] + sigma[0] * radius * cos;
            if pair.len() == 2 {
                pair[1] = mu[1] + sigma[1] * radius * sin;
            }
        }
    }

    /// Two `u64` (four words) per pair of coordinates.
    fn words_per_candidate(block_len: usize) -> u64 {
        2 * block_len.next_multiple_of(2) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    /// The bulk reading of the stream draws exactly what one `uniform` per coordinate would.
    #[test]
    fn bulk_uniforms_equal_sequential_draws() {
        let probs: Vec<f64> = (0..150).map(|j| (j % 10) as f64 / 10.0 + 0.05).collect();
        let b = Bernoulli::new(&probs).unwrap();
        let mut bulk = stream(5, 1, 2, Purpose::Experiment);
        let mut seq = bulk.clone();
        let _ = uniform(&mut bulk);
        let _ = uniform(&mut seq);
        let mut y = vec![false; 150];
        b.sample_block(0..150, &mut bulk, &mut y);
        let want: Vec<bool> = probs
            .iter()
            .map(|&p| f64::from(seq.next_u32()) / 2f64.powi(32) < p)
            .collect();
        assert_eq!(y, want);
        assert_eq!(uniform(&mut bulk), uniform(&mut seq));
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Bernoulli::new(&[0.5, 1.2]).is_err());
        assert!(Bernoulli::new(&[f64::NAN]).is_err());
        assert!(Categorical::new(&[[0.5, 0.5, 0.1]]).is_err());
        assert!(Categorical::new(&[[-0.1, 0.6, 0.5]]).is_err());
        assert!(Gaussian::new(&[0.0], &[0.0]).is_err());
        assert!(Gaussian::new(&[0.0], &[-1.0]).is_err());
        assert!(Gaussian::new(&[0.0, 1.0], &[1.0]).is_err());
        assert!(Gaussian::new(&[f64::INFINITY], &[1.0]).is_err());
    }

    /// §4.11: `q = (.9, .2, .6)`, `p = (.5, .5, .5)` → KL bits `(.531004, .278072, .029049)`.
    #[test]
    fn bernoulli_kl_oracle() {
        let (q, p) = ([0.9, 0.2, 0.6], [0.5; 3]);
        let kl = kl_bits_per_coordinate(&Bernoulli::new(&q).unwrap(), &Bernoulli::new(&p).unwrap())
            .unwrap();
        for (got, want) in kl.iter().zip([0.531004, 0.278072, 0.029049]) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    /// §4.7 example, coordinate 1: `q = (0, .769231, .230769)`, smoothed `p = (3, 8, 2)/13`
    /// → `.382628` bits.
    #[test]
    fn categorical_kl_oracle() {
        let q = [[0.0, 1.0 / 1.3, 0.3 / 1.3]];
        let p = [[3.0 / 13.0, 8.0 / 13.0, 2.0 / 13.0]];
        let kl = Categorical::kl_bits(
            &Categorical::new(&q).unwrap(),
            &Categorical::new(&p).unwrap(),
            0,
        );
        assert!((kl - 0.382628).abs() < 1e-6, "{kl}");
    }

    /// Same variance: `(μ_q − μ_p)² / (2σ² ln 2)`; the toy's 0.32 nats.
    #[test]
    fn gaussian_kl_closed_form() {
        let q = Gaussian::new(&[0.8], &[1.0]).unwrap();
        let p = Gaussian::new(&[0.0], &[1.0]).unwrap();
        assert!((Gaussian::kl_bits(&q, &p, 0) * LN_2 - 0.32).abs() < 1e-12);
    }

    /// The prepared log ratio equals the difference of the log-likelihoods.
    #[test]
    fn log_ratios_match_log_likelihoods() {
        let q = Gaussian::new(&[0.3], &[0.7]).unwrap();
        let p = Gaussian::new(&[-0.2], &[1.3]).unwrap();
        let r = Gaussian::log_ratio(&q, &p, 0);
        for x in [-2.0, 0.0, 0.4, 3.0] {
            let want = q.log_likelihood(0, x) - p.log_likelihood(0, x);
            assert!((Gaussian::eval_log_ratio(&r, x) - want).abs() < 1e-12);
        }
        let (qs, ps) = ([[0.2, 0.3, 0.5]], [[0.1, 0.6, 0.3]]);
        let (q, p) = (
            Categorical::new(&qs).unwrap(),
            Categorical::new(&ps).unwrap(),
        );
        let r = Categorical::log_ratio(&q, &p, 0);
        for x in TERNARY_SUPPORT {
            let want = q.log_likelihood(0, x) - p.log_likelihood(0, x);
            assert!((Categorical::eval_log_ratio(&r, x) - want).abs() < 1e-12);
        }
    }

    /// Zero-probability symbols are never drawn, and frequencies match within 5σ.
    #[test]
    fn categorical_sampling_frequencies() {
        let probs = [[0.25, 0.0, 0.75]; 1];
        let d = Categorical::new(&probs).unwrap();
        let mut rng = stream(3, 0, 0, Purpose::Experiment);
        let mut counts = [0usize; 3];
        let mut y = [0i8];
        let n = 40_000;
        for _ in 0..n {
            d.sample_block(0..1, &mut rng, &mut y);
            counts[ternary_slot(y[0])] += 1;
        }
        assert_eq!(counts[1], 0);
        let sd = (0.25f64 * 0.75 / n as f64).sqrt();
        assert!((counts[0] as f64 / n as f64 - 0.25).abs() < 5.0 * sd);
    }

    /// Sample mean and variance of the Box–Muller draws within 5 standard errors.
    #[test]
    fn gaussian_sampling_moments() {
        let n = 20_001;
        let (means, sigmas) = (vec![1.5; n], vec![2.0; n]);
        let d = Gaussian::new(&means, &sigmas).unwrap();
        let mut rng = stream(4, 0, 0, Purpose::Experiment);
        let mut y = vec![0.0; n];
        d.sample_block(0..n, &mut rng, &mut y);
        let mean = y.iter().sum::<f64>() / n as f64;
        let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        assert!((mean - 1.5).abs() < 5.0 * 2.0 / (n as f64).sqrt(), "{mean}");
        assert!(
            (var - 4.0).abs() < 5.0 * 4.0 * (2.0 / n as f64).sqrt(),
            "{var}"
        );
    }
}
