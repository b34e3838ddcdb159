//! Integer and fixed-point encodings whose sums secure aggregation computes exactly.
//!
//! Secure aggregation adds vectors in `Z_{2^bits}`; it can only serve an uplink whose server
//! step needs the *sum* of the clients' values. [`IntegerRange`] maps integers in `[min, max]`
//! to `[0, max − min]` and back from a sum; [`FixedPoint`] maps reals to such integers by
//! clipping to `[−R, R]`, scaling and **deterministic** rounding to nearest (exact, so tests can
//! check sums bit for bit; stochastic rounding would make the rounding error unbiased at the
//! same bound but needs a per-client stream). [`UplinkCoding`] says which of fedshard's uplink
//! codings compose with the sum.

use crate::error::Error;
use crate::params::Param;

/// Integers in `[min, max]`, shifted to `[0, max − min]` so that `n` of them sum without a
/// sign: the sum of `n` encodings is at most `n · (max − min)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IntegerRange {
    pub min: i64,
    pub max: i64,
}

impl IntegerRange {
    /// The width `max − min`, or an error for an empty range.
    fn width(&self) -> Result<u64, Error> {
        (self.max >= self.min)
            .then(|| self.max.abs_diff(self.min))
            .ok_or_else(|| {
                Error::Params(format!("empty integer range [{}, {}]", self.min, self.max))
            })
    }

    /// The fewest bits such that the sum of `clients` encodings cannot wrap:
    /// `bits = ⌈log2(clients · (max − min) + 1)⌉` (at least 1).
    pub fn bits_for(&self, clients: usize) -> Result<u32, Error> {
        let largest = u128::from(self.width()?) * clients as u128;
        let bits = (u128::BITS - largest.leading_zeros()).max(1);
        if bits > 64 {
            return Err(Error::Params(format!(
                "{clients} clients × width {} need {bits} bits, more than 64",
                self.width()?
            )));
        }
        Ok(bits)
    }

    /// `value − min` for every value, or an error naming the first out of range.
    pub fn encode(&self, values: &[i64]) -> Result<Vec<u64>, Error> {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if (self.min..=self.max).contains(&v) {
                    Ok(v.abs_diff(self.min))
                } else {
                    Err(Error::Input {
                        what: format!("value {v} at {i} outside [{}, {}]", self.min, self.max),
                    })
                }
            })
            .collect()
    }

    /// The sum of the original integers from the sum of `count` encodings: `Σ − count · min`,
    /// exact while the sum did not wrap (it cannot with [`Self::bits_for`]`(count)` bits).
    pub fn decode_sum(&self, sum: &[u64], count: usize) -> Vec<i128> {
        let shift = i128::from(self.min) * count as i128;
        sum.iter().map(|&s| i128::from(s) + shift).collect()
    }
}

/// Reals clipped to `[−range, range]`, scaled by `scale` and rounded to the nearest integer
/// (docs/algorithms.md §7, "Fixed point").
///
/// With `h = ⌈range · scale⌉`, a value `x` is encoded as `round(clip(x) · scale) + h ∈ [0, 2h]`
/// (an [`IntegerRange`] `[−h, h]`). The decoded sum of `n` clients differs from the sum of their
/// clipped values by at most `n / (2 · scale)` per coordinate (each rounding moves a value by at
/// most half a step), plus the f64 rounding of the decode, `≤ n · range · 2⁻⁵²`
/// ([`Self::error_bound`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FixedPoint {
    /// `R`: values are clipped to `[−R, R]` before scaling.
    pub range: f64,
    /// Steps per unit: the quantisation step is `1 / scale`.
    pub scale: f64,
}

impl FixedPoint {
    /// A fixed-point encoding, refusing non-finite or non-positive parameters and a half-width
    /// `range · scale` above 2⁵², where f64 stops representing every integer.
    pub fn new(range: f64, scale: f64) -> Result<FixedPoint, Error> {
        let half = range * scale;
        let finite = range.is_finite() && scale.is_finite() && range > 0.0 && scale > 0.0;
        if !finite || half > (1u64 << 52) as f64 {
            return Err(Error::OutOfRange {
                param: Param::FixedPoint,
                expected: "a positive range and scale whose product is at most 2⁵², where f64 \
                           stops representing every integer"
                    .into(),
                found: format!("range {range} × scale {scale}"),
            });
        }
        Ok(FixedPoint { range, scale })
    }

    /// `h = ⌈range · scale⌉`, the largest magnitude of an encoded level.
    pub fn half_width(&self) -> i64 {
        (self.range * self.scale).ceil() as i64
    }

    /// The integer levels `[−h, h]` this encoding produces.
    pub fn levels(&self) -> IntegerRange {
        let h = self.half_width();
        IntegerRange { min: -h, max: h }
    }

    /// See [`IntegerRange::bits_for`]: `⌈log2(n · 2h + 1)⌉`.
    pub fn bits_for(&self, clients: usize) -> Result<u32, Error> {
        self.levels().bits_for(clients)
    }

    /// The encodings of `values`; a NaN or infinite value is an error (clipping an infinity
    /// would hide a diverged client).
    pub fn encode(&self, values: &[f32]) -> Result<Vec<u64>, Error> {
        let h = self.half_width();
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if !v.is_finite() {
                    return Err(Error::Input {
                        what: format!("value {v} at {i} is not finite"),
                    });
                }
                let clipped = f64::from(v).clamp(-self.range, self.range);
                // |clipped · scale| ≤ range · scale ≤ h, so the level is in [−h, h].
                let level = (clipped * self.scale).round() as i64;
                Ok(level.clamp(-h, h).abs_diff(-h))
            })
            .collect()
    }

    /// The sum of the clipped reals from the sum of `count` encodings, within
    /// [`Self::error_bound`]`(count)` per coordinate.
    pub fn decode_sum(&self, sum: &[u64], count: usize) -> Vec<f64> {
        self.levels()
            .decode_sum(sum, count)
            .into_iter()
            .map(|level| level as f64 / self.scale)
            .collect()
    }

    /// The largest distance between a decoded sum of `count` clients and the sum of their
    /// clipped values: `count / (2 · scale)` of rounding plus the f64 error of the decode.
    pub fn error_bound(&self, count: usize) -> f64 {
        let n = count as f64;
        n / (2.0 * self.scale) + n * self.range * f64::EPSILON * 2.0
    }
}

/// An uplink coding of fedshard (the `[compression]` compressors), by whether the server step
/// that consumes it needs only the sum of the clients' values.
///
/// Secure aggregation reveals `Σ_u x_u mod 2^bits` and nothing else, so a coding composes with
/// it when the server's aggregate is a linear function of integer vectors with a bounded range
/// and a scale every client shares:
/// - dense real updates (identity, SGLD samples) in [`FixedPoint`], and FedAvg's weights
///   premultiplied by the clients;
/// - QSGD levels `{−s..s}` when the scale (norm) is common to all clients or sent in the clear
///   (each client's own norm times its levels must be re-encoded as fixed point otherwise);
/// - SignSGD signs as `±1` (the sum is the majority vote's tally);
/// - FedPM mask bits (BayesAgg's Beta posterior needs only how many clients set each bit).
///
/// KLMS's index coding does not compose: a client sends the index of one of `K` shared
/// candidates, and the server must decode each index separately (a sum of indices names no
/// candidate). Neither does any entropy coding whose lengths depend on the values (QSGD's Elias
/// code): the server must see each message to parse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UplinkCoding {
    /// f32 values: identity uplink, SGLD's Gaussian samples.
    DenseReal,
    /// QSGD's integer levels with a common scale.
    QsgdLevels,
    /// QSGD's levels Elias-coded (variable-length per client).
    QsgdElias,
    /// SignSGD's signs as ±1.
    Signs,
    /// FedPM's mask bits as 0/1.
    MaskBits,
    /// Any KLMS coding: the index of a shared candidate per block.
    KlmsIndex,
}

impl UplinkCoding {
    /// Every coding, in declaration order (for tests and config listings).
    pub const ALL: [UplinkCoding; 6] = [
        UplinkCoding::DenseReal,
        UplinkCoding::QsgdLevels,
        UplinkCoding::QsgdElias,
        UplinkCoding::Signs,
        UplinkCoding::MaskBits,
        UplinkCoding::KlmsIndex,
    ];

    /// Ok when the coding's server step is a sum secure aggregation can compute, else
    /// [`Error::NotSummable`] with the reason (for the config check that refuses it).
    pub fn check_summable(self) -> Result<(), Error> {
        match self {
            UplinkCoding::DenseReal
            | UplinkCoding::QsgdLevels
            | UplinkCoding::Signs
            | UplinkCoding::MaskBits => Ok(()),
            UplinkCoding::QsgdElias => Err(Error::NotSummable {
                coding: "qsgd-elias",
                why: "a variable-length code must be parsed per client before any sum",
            }),
            UplinkCoding::KlmsIndex => Err(Error::NotSummable {
                coding: "klms",
                why: "a sum of candidate indices names no candidate; each index is decoded alone",
            }),
        }
    }

    /// The integer range a client's coordinate takes for the summable integer codings (`None`
    /// for dense reals, which go through [`FixedPoint`], and for codings that do not compose).
    pub fn integer_range(self, qsgd_levels: i64) -> Option<IntegerRange> {
        match self {
            UplinkCoding::QsgdLevels => Some(IntegerRange {
                min: -qsgd_levels,
                max: qsgd_levels,
            }),
            UplinkCoding::Signs => Some(IntegerRange { min: -1, max: 1 }),
            UplinkCoding::MaskBits => Some(IntegerRange { min: 0, max: 1 }),
            UplinkCoding::DenseReal | UplinkCoding::QsgdElias | UplinkCoding::KlmsIndex => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_cover_the_largest_sum_exactly() {
        // 3 clients × width 2 = 6 < 2³: 3 bits; 4 clients × 2 = 8 needs 4 bits.
        let signs = IntegerRange { min: -1, max: 1 };
        assert_eq!(signs.bits_for(3), Ok(3));
        assert_eq!(signs.bits_for(4), Ok(4));
        assert!(
            IntegerRange {
                min: 0,
                max: i64::MAX
            }
            .bits_for(4)
            .is_err()
        );
    }

    #[test]
    fn signs_sum_to_their_tally() {
        let signs = IntegerRange { min: -1, max: 1 };
        let a = signs.encode(&[1, -1, 1]).unwrap();
        let b = signs.encode(&[1, -1, -1]).unwrap();
        let sum: Vec<u64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(signs.decode_sum(&sum, 2), vec![2, -2, 0]);
        assert!(signs.encode(&[2]).is_err());
    }

    #[test]
    fn klms_is_refused_and_dense_composes() {
        assert!(UplinkCoding::DenseReal.check_summable().is_ok());
        assert!(matches!(
            UplinkCoding::KlmsIndex.check_summable(),
            Err(Error::NotSummable { coding: "klms", .. })
        ));
    }
}
