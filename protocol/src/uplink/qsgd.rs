//! QSGD-KLMS's global distribution `p` (docs/algorithms.md §4.7) from side information both ends
//! really have.
//!
//! The paper's `p` is the previous round's per-value frequency of the decoded symbols. With
//! `C = 10` clients a count is a multiple of 1/10, while a client's `q_j(±1) = |v_j| / ‖v‖` is
//! about `1/√d`; any smoothing of the counts towards uniform (`(n + 1)/(C + 3)`) floors
//! `p(±1)` at 1/13, and a block's KL is then spent on zeros (about 0.24 bits a value). Here a
//! count is smoothed towards its tensor's symbol frequency `f_t` in that round instead:
//!
//! `p_j(s) = (n_j(s) + β f_t(s)) / (n_j + β)`, `f_t(s) = (N_t(s) + 1) / (N_t + 3)`,
//!
//! with `N_t(s)` the number of decoded `s` in tensor `t` (over its values and the clients) and
//! `n_j = Σ_s n_j(s)` (the clients that held value `j`; `p_j = f_t` where none did). Both come from
//! last round's decoded symbols, which the server holds and broadcasts: nothing is sent for
//! them. Before any round decoded a symbol, the client sends its own tensor means of `q`,
//! `(mean_j q_j(−1), mean_j q_j(+1))` as two f32 per tensor, counted in its bits, and both ends use
//! `p_j = (m₋, 1 − m₋ − m₊, m₊)`. The reference code does this every round without counting
//! the floats (docs/algorithms.md §4.12).

use super::codec::{Decoding, Drift, Encoding, Frame, HostCodec, Layout, update};
use super::klms::{KlmsHost, Picking, Regenerating, Selected, regenerate_product, select_product};
use super::wire::{
    BitReader, BitWriter, read_elias_symbols, read_trits, write_elias_symbols, write_trits,
};
use super::{Uplink, UplinkSide};
use crate::error::Error;
use fedshard_strategies::compression::{
    Categorical, Partition, ProductDistribution, kl_bits_per_coordinate,
};
use fedshard_strategies::rng::{ChaCha20Rng, uniform};
use std::marker::PhantomData;
use std::ops::Range;

/// Each tensor's symbol frequency from per-value counts in the global layout, Laplace-smoothed
/// at the tensor level: `(N_t(s) + 1) / (N_t + 3)`.
pub fn tensor_frequencies(counts: &[[u16; 3]], tensors: &[Range<usize>]) -> Vec<[f64; 3]> {
    tensors
        .iter()
        .map(|range| {
            let mut n = [0.0f64; 3];
            for c in counts.get(range.clone()).unwrap_or_default() {
                for (total, &x) in n.iter_mut().zip(c) {
                    *total += f64::from(x);
                }
            }
            let total = n.iter().sum::<f64>() + 3.0;
            n.map(|x| (x + 1.0) / total)
        })
        .collect()
}

/// `p` over a message of `len` values whose tensors have the lengths `tensors`:
/// `(n_j(s) + β f_t(s)) / (n_j + β)` with `counts`, `f_t` alone without. Every `means` row must
/// be a distribution (it may come over the wire).
pub fn global_distribution(
    tensors: &[usize],
    means: &[[f64; 3]],
    counts: Option<&[[u16; 3]]>,
    weight: f64,
    len: usize,
) -> Result<Vec<[f64; 3]>, Error> {
    if tensors.len() != means.len() {
        return Err(Error::PriorFrequencies {
            frequencies: means.len(),
            tensors: tensors.len(),
        });
    }
    if tensors.iter().sum::<usize>() != len {
        return Err(Error::PriorTensors {
            values: tensors.iter().sum::<usize>(),
            len,
        });
    }
    if let Some(c) = counts
        && c.len() != len
    {
        return Err(Error::PriorCounts {
            counts: c.len(),
            len,
        });
    }
    if !(weight > 0.0 && weight.is_finite()) {
        return Err(Error::PriorWeight(weight));
    }
    for (tensor, row) in means.iter().enumerate() {
        let sum: f64 = row.iter().sum();
        if row.iter().any(|x| !(0.0..=1.0).contains(x)) || (sum - 1.0).abs() > 1e-9 {
            return Err(Error::PriorRow { tensor, row: *row });
        }
    }
    let mut p = Vec::with_capacity(len);
    let mut at = 0;
    for (&size, f) in tensors.iter().zip(means) {
        for j in at..at + size {
            p.push(match counts {
                Some(c) => {
                    let n = c[j].map(f64::from);
                    let total = n.iter().sum::<f64>() + weight;
                    [0, 1, 2].map(|s| (n[s] + weight * f[s]) / total)
                }
                None => *f,
            });
        }
        at += size;
    }
    Ok(p)
}

/// The client's tensor means of `q`, `(m₋, m₊)` per tensor, as the f32 it sends; a positive
/// mean never rounds to zero (then `p` would miss a symbol `q` can draw).
pub fn own_tensor_means(q: &[[f64; 3]], tensors: &[usize]) -> Vec<[f32; 2]> {
    let up = |x: f64| match x as f32 {
        0.0 if x > 0.0 => f32::MIN_POSITIVE,
        f => f,
    };
    let mut at = 0;
    tensors
        .iter()
        .map(|&size| {
            let rows = q.get(at..at + size).unwrap_or_default();
            at += size;
            let n = rows.len().max(1) as f64;
            let minus = rows.iter().map(|r| r[0]).sum::<f64>() / n;
            let plus = rows.iter().map(|r| r[2]).sum::<f64>() / n;
            [up(minus), up(plus)]
        })
        .collect()
}

/// Tensor means as read from a payload, checked (`m₋, m₊ ≥ 0`, `m₋ + m₊ ≤ 1` up to f32
/// rounding), as distributions `(m₋, 1 − m₋ − m₊, m₊)`.
pub fn means_from_wire(means: &[[f32; 2]]) -> Result<Vec<[f64; 3]>, Error> {
    means
        .iter()
        .enumerate()
        .map(|(tensor, &[minus, plus])| {
            let (minus, plus) = (f64::from(minus), f64::from(plus));
            let zero = 1.0 - minus - plus;
            if !(minus >= 0.0 && plus >= 0.0 && zero > -1e-6) {
                return Err(Error::TensorMeans {
                    tensor,
                    minus,
                    plus,
                });
            }
            if zero < 0.0 {
                let sum = minus + plus;
                return Ok([minus / sum, 0.0, plus / sum]);
            }
            Ok([minus, zero, plus])
        })
        .collect()
}

/// QSGD's bits as the KLMS paper counts them for its baselines: not a code's length but the bound of
/// the QSGD paper (Alistarh et al. 2017, Theorem 3.2) on the expected length of its Elias code
/// for one vector of `values` values at `levels` levels,
/// `(3 + 1.5 log₂(2(s² + n) / (s(s + √n)))) · s(s + √n) + 32`, which assumes `s(s + √n)`
/// non-zero symbols. The reference code (FrancescoPase/Federated-KLMS,
/// `compressors/qsgd.py`) reports this formula per tensor as QSGD's bitrate, and the paper's
/// "×10 lower than QSGD" is against it. An update whose non-zeros are far fewer than `√n` (as
/// QSGD with one level on a softmax regression's update is) takes far fewer bits in the real
/// code (`qsgd-elias`), so both figures are reported.
pub fn reference_bound_bits(values: usize, levels: u32) -> f64 {
    let (n, s) = (values as f64, f64::from(levels));
    let nonzeros = s * (s + n.sqrt());
    (3.0 + 1.5 * (2.0 * (s * s + n) / nonzeros).log2()) * nonzeros + 32.0
}

/// QSGD-KLMS's `p` over a message of `len` values from the tensor frequencies `means` (the
/// server's, or the client's own as sent) and the task's counts and `β`.
fn prior_of(uplink: &Uplink, means: &[[f64; 3]], len: usize) -> Result<Vec<[f64; 3]>, Error> {
    global_distribution(
        &uplink.prior_tensors,
        means,
        uplink.prior_counts.as_deref(),
        uplink.prior_weight,
        len,
    )
}

/// Whether the client sends its own tensor means: with KLMS, before any round decoded a
/// symbol.
fn sends_tensor_means(uplink: &Uplink) -> bool {
    uplink.klms.is_some() && uplink.prior_means.is_none()
}

/// A draw from `[P(−1), P(0), P(+1)]` by inverse CDF in that order.
pub(super) fn draw_ternary(row: &[f64; 3], rng: &mut ChaCha20Rng) -> i8 {
    let u = uniform(rng);
    if u < row[0] {
        -1
    } else if u < row[0] + row[1] {
        0
    } else {
        1
    }
}

/// QSGD with one level (s = 1, docs/algorithms.md §4.7), its symbols written by the frame `F`:
/// [`Trits`] (`qsgd`) or [`EliasSymbols`] (`qsgd-elias`).
#[derive(Debug, Clone, Copy)]
pub struct Qsgd<F>(PhantomData<F>);

impl<F> Qsgd<F> {
    pub const NEW: Self = Qsgd(PhantomData);
}

/// What QSGD sends before its symbols.
#[derive(Debug, Clone, PartialEq)]
pub struct QsgdHeader {
    /// `‖v‖` as an f32; `q` uses the value the server reads.
    pub norm: f32,
    /// With KLMS before the first counts, the client's own tensor means ([`own_tensor_means`]).
    pub tensor_means: Option<Vec<[f32; 2]>>,
}

impl Frame for QsgdHeader {
    fn write(&self, w: &mut BitWriter) {
        w.f32(self.norm);
        for [minus, plus] in self.tensor_means.iter().flatten() {
            w.f32(*minus);
            w.f32(*plus);
        }
    }

    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error> {
        let norm = r.f32()?;
        if !(norm.is_finite() && norm >= 0.0) {
            return Err(Error::QsgdNorm(norm));
        }
        let tensor_means = if sends_tensor_means(layout.uplink) {
            Some(
                (0..layout.uplink.prior_tensors.len())
                    .map(|_| Ok([r.f32()?, r.f32()?]))
                    .collect::<Result<Vec<_>, Error>>()?,
            )
        } else {
            None
        };
        Ok(QsgdHeader { norm, tensor_means })
    }
}

/// A frame of QSGD symbols `{−1, 0, +1}`.
pub trait TernaryFrame: Frame {
    fn new(symbols: Vec<i8>) -> Self;
    fn into_symbols(self) -> Vec<i8>;
}

/// Five symbols to a byte ([`write_trits`]): 1.6 bits per symbol.
#[derive(Debug, Clone, PartialEq)]
pub struct Trits(pub Vec<i8>);

impl Frame for Trits {
    fn write(&self, w: &mut BitWriter) {
        write_trits(w, &self.0);
    }

    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error> {
        Ok(Trits(read_trits(r, layout.len)?))
    }
}

impl TernaryFrame for Trits {
    fn new(symbols: Vec<i8>) -> Self {
        Trits(symbols)
    }

    fn into_symbols(self) -> Vec<i8> {
        self.0
    }
}

/// The QSGD paper's Elias code of the non-zero symbols ([`write_elias_symbols`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EliasSymbols(pub Vec<i8>);

impl Frame for EliasSymbols {
    fn write(&self, w: &mut BitWriter) {
        write_elias_symbols(w, &self.0);
    }

    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error> {
        Ok(EliasSymbols(read_elias_symbols(r, layout.len)?))
    }
}

impl TernaryFrame for EliasSymbols {
    fn new(symbols: Vec<i8>) -> Self {
        EliasSymbols(symbols)
    }

    fn into_symbols(self) -> Vec<i8> {
        self.0
    }
}

impl<F: TernaryFrame> HostCodec for Qsgd<F> {
    type Symbol = i8;
    type Header = QsgdHeader;
    /// `q_j = |v_j|/‖v‖` on `sign v_j`, as `[P(−1), P(0), P(+1)]` rows.
    type Message = Vec<[f64; 3]>;
    /// `p` with KLMS (module doc), empty without.
    type Prior = Vec<[f64; 3]>;
    type Frame = F;

    fn message(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        out: &[f32],
    ) -> Result<(QsgdHeader, Vec<[f64; 3]>), Error> {
        let v = update(sent, out);
        let full = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if !full.is_finite() {
            return Err(Error::UpdateNorm(full));
        }
        // The norm travels as f32; q uses the value the server reads.
        let norm = full as f32;
        let n = f64::from(norm);
        let q: Vec<[f64; 3]> = v
            .iter()
            .map(|&x| {
                if n == 0.0 {
                    return [0.0, 1.0, 0.0];
                }
                let a = (x.abs() / n).min(1.0);
                if x >= 0.0 {
                    [0.0, 1.0 - a, a]
                } else {
                    [a, 1.0 - a, 0.0]
                }
            })
            .collect();
        let tensor_means =
            sends_tensor_means(uplink).then(|| own_tensor_means(&q, &uplink.prior_tensors));
        Ok((QsgdHeader { norm, tensor_means }, q))
    }

    /// Plain QSGD needs no `p`; QSGD-KLMS without tensor frequencies from the server gets it
    /// from the client's own tensor means, as sent.
    fn prior(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        header: &QsgdHeader,
    ) -> Result<Vec<[f64; 3]>, Error> {
        match (&uplink.prior_means, &uplink.klms) {
            (_, None) => Ok(Vec::new()),
            (Some(means), Some(_)) => prior_of(uplink, means, sent.len()),
            (None, Some(_)) => {
                let own = header.tensor_means.as_deref().unwrap_or_default();
                prior_of(uplink, &means_from_wire(own)?, sent.len())
            }
        }
    }

    fn encode_symbols(
        &self,
        cx: &mut Encoding,
        q: &Vec<[f64; 3]>,
        _: &Vec<[f64; 3]>,
    ) -> Result<(F, Vec<i8>), Error> {
        let symbols: Vec<i8> = q
            .iter()
            .map(|row| draw_ternary(row, &mut cx.selection))
            .collect();
        Ok((F::new(symbols.clone()), symbols))
    }

    fn decode_symbols(
        &self,
        _: &Decoding,
        frame: F,
        _: &Vec<[f64; 3]>,
        _: &mut UplinkSide,
    ) -> Result<Vec<i8>, Error> {
        Ok(frame.into_symbols())
    }

    fn prior_mean(&self, p: &Vec<[f64; 3]>, _: usize) -> Result<Vec<f64>, Error> {
        let p = Categorical::new(p)?;
        Ok((0..p.len()).map(|j| p.mean(j)).collect())
    }

    /// `sent + η_S ‖v‖ y`.
    fn value(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        header: &QsgdHeader,
        symbols: &[i8],
        drift: &Drift,
    ) -> Result<Vec<f32>, Error> {
        let step = uplink.server_lr * f64::from(header.norm);
        Ok(sent
            .iter()
            .zip(symbols)
            .enumerate()
            .map(|(j, (s, &y))| (f64::from(*s) + step * drift.of(j, f64::from(y))) as f32)
            .collect())
    }

    /// The server counts each value's symbols for next round's prior.
    fn record(&self, symbols: &[i8], side: &mut UplinkSide) {
        side.symbols = Some(symbols.to_vec());
    }
}

impl<F: TernaryFrame> KlmsHost for Qsgd<F> {
    fn kl_bits(&self, q: &Vec<[f64; 3]>, p: &Vec<[f64; 3]>) -> Result<Vec<f64>, Error> {
        Ok(kl_bits_per_coordinate(
            &Categorical::new(q)?,
            &Categorical::new(p)?,
        )?)
    }

    fn select(
        &self,
        q: &Vec<[f64; 3]>,
        p: &Vec<[f64; 3]>,
        partition: &Partition,
        picking: &mut Picking,
    ) -> Result<Selected<i8>, Error> {
        select_product(
            &Categorical::new(q)?,
            &Categorical::new(p)?,
            partition,
            picking,
        )
    }

    fn regenerate(
        &self,
        p: &Vec<[f64; 3]>,
        regenerating: &Regenerating,
        out: &mut [i8],
    ) -> Result<(), Error> {
        regenerate_product(&Categorical::new(p)?, regenerating, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_bound_is_the_qsgd_papers_formula() {
        // By hand for the MNIST softmax update (n = 7 850, s = 1): s(s + √n) = 89.600,
        // 2(1 + 7 850)/89.600 = 175.25, log₂ = 7.4533, (3 + 11.180) · 89.600 + 32 = 1 302.5.
        let bits = reference_bound_bits(7850, 1);
        assert!((bits - 1302.517).abs() < 1e-2, "{bits}");
        // n = 100, s = 2: s(s + √n) = 24, 2(4 + 100)/24 = 8.6667, log₂ = 3.1155,
        // (3 + 4.6732) · 24 + 32 = 216.16.
        let bits = reference_bound_bits(100, 2);
        assert!((bits - 216.157).abs() < 1e-2, "{bits}");
    }
}
