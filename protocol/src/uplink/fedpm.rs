//! FedPM (docs/algorithms.md §4.6): the model is mask probabilities; the client sends a mask
//! drawn from its trained probabilities `θ_local`, one bit per value, and the server's value of a
//! decoded bit is [`MASK_HIGH`] or [`MASK_LOW`] (the reference's clamping), so FedAvg of the
//! decoded masks is BayesAgg with `λ₀ = 1` reset every round. With KLMS the prior is the global
//! mask `θ_global`.

use super::Uplink;
use super::UplinkSide;
use super::codec::{Decoding, Drift, Encoding, Frame, HostCodec, Layout};
use super::klms::{KlmsHost, Picking, Regenerating, Selected, regenerate_product, select_product};
use super::wire::{BitReader, BitWriter};
use crate::error::Error;
use fedshard_strategies::compression::{Bernoulli, Partition, kl_bits_per_coordinate};
use fedshard_strategies::rng::uniform;

/// FedPM's decoded probabilities for a mask bit (the reference's clamping, §4.6).
pub const MASK_LOW: f32 = 0.01;
pub const MASK_HIGH: f32 = 0.99;

/// FedPM's codec.
#[derive(Debug, Clone, Copy)]
pub struct Fedpm;

/// Mask bits, one bit each (`1` for a kept weight).
#[derive(Debug, Clone, PartialEq)]
pub struct MaskBits(pub Vec<i8>);

impl Frame for MaskBits {
    fn write(&self, w: &mut BitWriter) {
        for &s in &self.0 {
            w.bits(s as u32, 1);
        }
    }

    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error> {
        (0..layout.len)
            .map(|_| r.bits(1).map(|b| b as i8))
            .collect::<Result<_, _>>()
            .map(MaskBits)
            .map_err(Error::from)
    }
}

/// The values as probabilities, each checked to lie in `[0, 1]`; `what` names them.
fn mask_probabilities(values: &[f32], what: &'static str) -> Result<Vec<f64>, Error> {
    values
        .iter()
        .enumerate()
        .map(|(index, &value)| {
            if (0.0..=1.0).contains(&value) {
                Ok(f64::from(value))
            } else {
                Err(Error::MaskProbability { what, index, value })
            }
        })
        .collect()
}

impl HostCodec for Fedpm {
    type Symbol = i8;
    type Header = ();
    /// `θ_local`.
    type Message = Vec<f64>;
    /// `θ_global`.
    type Prior = Vec<f64>;
    type Frame = MaskBits;

    fn message(&self, _: &Uplink, _: &[f32], out: &[f32]) -> Result<((), Vec<f64>), Error> {
        Ok(((), mask_probabilities(out, "trained")?))
    }

    fn prior(&self, _: &Uplink, sent: &[f32], _: &()) -> Result<Vec<f64>, Error> {
        mask_probabilities(sent, "sent")
    }

    fn encode_symbols(
        &self,
        cx: &mut Encoding,
        q: &Vec<f64>,
        _: &Vec<f64>,
    ) -> Result<(MaskBits, Vec<i8>), Error> {
        let symbols: Vec<i8> = q
            .iter()
            .map(|&p| i8::from(uniform(&mut cx.selection) < p))
            .collect();
        Ok((MaskBits(symbols.clone()), symbols))
    }

    fn decode_symbols(
        &self,
        _: &Decoding,
        frame: MaskBits,
        _: &Vec<f64>,
        _: &mut UplinkSide,
    ) -> Result<Vec<i8>, Error> {
        Ok(frame.0)
    }

    fn prior_mean(&self, p: &Vec<f64>, _: usize) -> Result<Vec<f64>, Error> {
        Ok(p.clone())
    }

    fn value(
        &self,
        _: &Uplink,
        _: &[f32],
        _: &(),
        symbols: &[i8],
        _: &Drift,
    ) -> Result<Vec<f32>, Error> {
        Ok(symbols
            .iter()
            .map(|&m| if m > 0 { MASK_HIGH } else { MASK_LOW })
            .collect())
    }
}

impl KlmsHost for Fedpm {
    /// A decoded mask divided by `ρ` would leave `[0, 1]`.
    const RESCALES: bool = false;

    fn kl_bits(&self, q: &Vec<f64>, p: &Vec<f64>) -> Result<Vec<f64>, Error> {
        Ok(kl_bits_per_coordinate(
            &Bernoulli::new(q)?,
            &Bernoulli::new(p)?,
        )?)
    }

    fn select(
        &self,
        q: &Vec<f64>,
        p: &Vec<f64>,
        partition: &Partition,
        picking: &mut Picking,
    ) -> Result<Selected<i8>, Error> {
        let selected =
            select_product(&Bernoulli::new(q)?, &Bernoulli::new(p)?, partition, picking)?;
        Ok(Selected {
            symbols: selected.symbols.into_iter().map(i8::from).collect(),
            indices: selected.indices,
            drift_ratio: selected.drift_ratio,
        })
    }

    fn regenerate(
        &self,
        p: &Vec<f64>,
        regenerating: &Regenerating,
        out: &mut [i8],
    ) -> Result<(), Error> {
        let mut bits = vec![false; out.len()];
        regenerate_product(&Bernoulli::new(p)?, regenerating, &mut bits)?;
        for (o, b) in out.iter_mut().zip(bits) {
            *o = i8::from(b);
        }
        Ok(())
    }
}
