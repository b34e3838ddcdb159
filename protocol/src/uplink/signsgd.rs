//! SignSGD's client distribution `q_j(+1) = σ(v_j / M)` (docs/algorithms.md §4.8) under each
//! temperature rule of `[compression] temperature`.
//!
//! The temperature sets both the bits and the step. KLMS codes a value's sign against the fair
//! coin in about `KL(σ(v/M) ‖ ½)` bits, `(v/M)² / (8 ln 2)` for `|v| ≪ M`, while the mean decoded
//! sign is `tanh(v / 2M) ≈ v / 2M`. The reference's `M = max |v| / 20` over groups of 8 makes
//! `q` nearly deterministic (about 0.7 bits a value, so KLMS saves little); `M = c · rms(v)`
//! over the whole update spends about `1 / (8 c² ln 2)` bits a value (0.045 at `c = 2`) and
//! moves the model by `η_S v / (2M)` on average, so `η_S` must grow with `c`.

use super::codec::{Decoding, Drift, Encoding, Frame, HostCodec, Layout, update};
use super::klms::{KlmsHost, Picking, Regenerating, Selected};
use super::qsgd::draw_ternary;
use super::wire::{BitReader, BitWriter};
use super::{Temperature, Uplink, UplinkSide};
use crate::error::Error;
use fedshard_strategies::compression::{
    Bernoulli, FairSignEncoder, Partition, decode_fair_signs, kl_bits_per_coordinate,
};

/// `q` as `[P(−1), 0, P(+1)]` rows of the update `v` under `rule`; `group` is the group size of
/// [`Temperature::Group`], `scale` the `c` of [`Temperature::Rms`].
pub fn sign_probabilities(
    v: &[f64],
    rule: Temperature,
    group: usize,
    scale: f64,
) -> Result<Vec<[f64; 3]>, Error> {
    /// The reference's divisor: arguments of σ stay in `[−20, 20]`.
    const SIGN_RANGE: f64 = 20.0;
    let max_abs = |v: &[f64]| v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let rms = || (v.iter().map(|x| x * x).sum::<f64>() / v.len().max(1) as f64).sqrt();
    let group = match rule {
        Temperature::Group => group.max(1),
        Temperature::Vector | Temperature::Rms => v.len().max(1),
    };
    let mut q = Vec::with_capacity(v.len());
    for chunk in v.chunks(group) {
        let temperature = match rule {
            Temperature::Group | Temperature::Vector => max_abs(chunk) / SIGN_RANGE,
            Temperature::Rms => scale * rms(),
        }
        .max(1e-15);
        if !temperature.is_finite() {
            return Err(Error::SignTemperature);
        }
        for &x in chunk {
            let plus = 1.0 / (1.0 + (-x / temperature).exp());
            q.push([1.0 - plus, 0.0, plus]);
        }
    }
    Ok(q)
}

/// SignSGD's codec: the prior is the fair coin, implicit in its bit-candidate coder
/// ([`FairSignEncoder`]).
#[derive(Debug, Clone, Copy)]
pub struct Signsgd;

/// Signs, one bit each (`1` for `+1`).
#[derive(Debug, Clone, PartialEq)]
pub struct SignBits(pub Vec<i8>);

impl Frame for SignBits {
    fn write(&self, w: &mut BitWriter) {
        for &s in &self.0 {
            w.bits(u32::from(s > 0), 1);
        }
    }

    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error> {
        (0..layout.len)
            .map(|_| r.bits(1).map(|b| if b == 1 { 1 } else { -1 }))
            .collect::<Result<_, _>>()
            .map(SignBits)
            .map_err(Error::from)
    }
}

/// `P(+1)` at every value.
fn plus(q: &[[f64; 3]]) -> Vec<f64> {
    q.iter().map(|row| row[2]).collect()
}

impl HostCodec for Signsgd {
    type Symbol = i8;
    type Header = ();
    /// `[P(−1), 0, P(+1)]` at every value.
    type Message = Vec<[f64; 3]>;
    /// The fair coin.
    type Prior = ();
    type Frame = SignBits;

    fn message(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        out: &[f32],
    ) -> Result<((), Vec<[f64; 3]>), Error> {
        let v = update(sent, out);
        let q = sign_probabilities(
            &v,
            uplink.temperature,
            uplink.temperature_group,
            uplink.temperature_scale,
        )?;
        Ok(((), q))
    }

    fn prior(&self, _: &Uplink, _: &[f32], _: &()) -> Result<(), Error> {
        Ok(())
    }

    fn encode_symbols(
        &self,
        cx: &mut Encoding,
        q: &Vec<[f64; 3]>,
        _: &(),
    ) -> Result<(SignBits, Vec<i8>), Error> {
        let symbols: Vec<i8> = q
            .iter()
            .map(|row| draw_ternary(row, &mut cx.selection))
            .collect();
        Ok((SignBits(symbols.clone()), symbols))
    }

    fn decode_symbols(
        &self,
        _: &Decoding,
        frame: SignBits,
        _: &(),
        _: &mut UplinkSide,
    ) -> Result<Vec<i8>, Error> {
        Ok(frame.0)
    }

    fn prior_mean(&self, _: &(), len: usize) -> Result<Vec<f64>, Error> {
        Ok(vec![0.0; len])
    }

    /// `sent + η_S y`.
    fn value(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        _: &(),
        symbols: &[i8],
        drift: &Drift,
    ) -> Result<Vec<f32>, Error> {
        let eta = uplink.server_lr;
        Ok(sent
            .iter()
            .zip(symbols)
            .enumerate()
            .map(|(j, (s, &y))| (f64::from(*s) + eta * drift.of(j, f64::from(y))) as f32)
            .collect())
    }
}

impl KlmsHost for Signsgd {
    fn kl_bits(&self, q: &Vec<[f64; 3]>, _: &()) -> Result<Vec<f64>, Error> {
        let plus = plus(q);
        let half = vec![0.5; plus.len()];
        Ok(kl_bits_per_coordinate(
            &Bernoulli::new(&plus)?,
            &Bernoulli::new(&half)?,
        )?)
    }

    fn select(
        &self,
        q: &Vec<[f64; 3]>,
        _: &(),
        partition: &Partition,
        picking: &mut Picking,
    ) -> Result<Selected<i8>, Error> {
        let message = FairSignEncoder::new()
            .with_selection(picking.klms.selection)
            .encode(
                &plus(q),
                partition,
                picking.klms.candidates,
                picking.shared,
                picking.selection,
                picking.track_drift,
            )?;
        Ok(Selected {
            symbols: message.signs,
            indices: message.indices,
            drift_ratio: message.drift_ratio,
        })
    }

    fn regenerate(&self, _: &(), regenerating: &Regenerating, out: &mut [i8]) -> Result<(), Error> {
        Ok(decode_fair_signs(
            regenerating.partition,
            regenerating.candidates,
            regenerating.indices,
            regenerating.shared,
            out,
        )?)
    }
}
