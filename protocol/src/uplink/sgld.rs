//! SGLD (docs/algorithms.md §4.9): the client sends a Gaussian sample `y_c ~ N(H_c, σ² I)` of its
//! share `H_c = sent − out` of the potential's gradient, an f32 per value; with KLMS, candidates
//! of the prior `N(0, σ² I)`. The server's value is `sent − η κ C y_c`
//! ([`LangevinScaling::decoded_scale`]).

use super::codec::{Decoding, Drift, Encoding, Frame, HostCodec, Layout};
use super::klms::{KlmsHost, Picking, Regenerating, Selected, regenerate_product, select_product};
use super::wire::{BitReader, BitWriter};
use super::{Uplink, UplinkSide};
use crate::error::Error;
use fedshard_strategies::compression::{
    Gaussian, LangevinScaling, Partition, ProductDistribution, kl_bits_per_coordinate,
};

/// SGLD's codec.
#[derive(Debug, Clone, Copy)]
pub struct Sgld;

/// SGLD's prior `N(0, σ² I)`.
#[derive(Debug, Clone, PartialEq)]
pub struct GaussianPrior {
    zero: Vec<f64>,
    std: Vec<f64>,
}

/// The sample, an f32 per value (the values are f32 already, so nothing is rounded).
#[derive(Debug, Clone, PartialEq)]
pub struct F32Values(pub Vec<f64>);

impl Frame for F32Values {
    fn write(&self, w: &mut BitWriter) {
        for &v in &self.0 {
            w.f32(v as f32);
        }
    }

    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error> {
        (0..layout.len)
            .map(|index| match r.f32()? {
                value if value.is_finite() => Ok(f64::from(value)),
                value => Err(Error::SgldValue { index, value }),
            })
            .collect::<Result<_, _>>()
            .map(F32Values)
    }
}

/// SGLD's step and cohort, checked (they come with the task, so over the wire on a client).
fn langevin_of(uplink: &Uplink) -> Result<LangevinScaling, Error> {
    let scaling = uplink.langevin.ok_or(Error::NoCohort)?;
    scaling.check()?;
    Ok(scaling)
}

impl HostCodec for Sgld {
    type Symbol = f64;
    type Header = ();
    /// `H_c`, the mean of `q = N(H_c, σ² I)`.
    type Message = Vec<f64>;
    type Prior = GaussianPrior;
    type Frame = F32Values;

    fn message(&self, _: &Uplink, sent: &[f32], out: &[f32]) -> Result<((), Vec<f64>), Error> {
        // The SGLD client's output is `θ − H_c` (one unit step on its potential).
        let mean: Vec<f64> = sent
            .iter()
            .zip(out)
            .map(|(s, o)| f64::from(*s) - f64::from(*o))
            .collect();
        if let Some(index) = mean.iter().position(|m| !m.is_finite()) {
            return Err(Error::SgldGradient {
                index,
                value: mean[index],
            });
        }
        Ok(((), mean))
    }

    fn prior(&self, uplink: &Uplink, sent: &[f32], _: &()) -> Result<GaussianPrior, Error> {
        let std = langevin_of(uplink)?.noise_variance().sqrt();
        if !(std > 0.0 && std.is_finite()) {
            return Err(Error::SgldNoise(std));
        }
        Ok(GaussianPrior {
            zero: vec![0.0; sent.len()],
            std: vec![std; sent.len()],
        })
    }

    /// Without KLMS: a private sample of `q`, each value as an f32.
    fn encode_symbols(
        &self,
        cx: &mut Encoding,
        mean: &Vec<f64>,
        prior: &GaussianPrior,
    ) -> Result<(F32Values, Vec<f64>), Error> {
        let q = Gaussian::new(mean, &prior.std)?;
        let mut y = vec![0.0; q.len()];
        q.sample_block(0..q.len(), &mut cx.selection, &mut y);
        let mut values = Vec::with_capacity(y.len());
        for (index, v) in y.into_iter().enumerate() {
            let value = v as f32;
            if !value.is_finite() {
                return Err(Error::SgldSample { index, value: v });
            }
            values.push(f64::from(value));
        }
        Ok((F32Values(values.clone()), values))
    }

    fn decode_symbols(
        &self,
        _: &Decoding,
        frame: F32Values,
        _: &GaussianPrior,
        _: &mut UplinkSide,
    ) -> Result<Vec<f64>, Error> {
        Ok(frame.0)
    }

    fn prior_mean(&self, prior: &GaussianPrior, _: usize) -> Result<Vec<f64>, Error> {
        Ok(prior.zero.clone())
    }

    /// `sent − η κ C y_c`: the equal-weight mean over the C participants is the SGLD step
    /// `θ − η κ Σ_c y_c` (`uniform` aggregator, enforced by the config).
    fn value(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        _: &(),
        y: &[f64],
        drift: &Drift,
    ) -> Result<Vec<f32>, Error> {
        let scale = langevin_of(uplink)?.decoded_scale();
        Ok(sent
            .iter()
            .zip(y)
            .enumerate()
            .map(|(j, (s, &y))| (f64::from(*s) - scale * drift.of(j, y)) as f32)
            .collect())
    }
}

impl KlmsHost for Sgld {
    fn kl_bits(&self, mean: &Vec<f64>, prior: &GaussianPrior) -> Result<Vec<f64>, Error> {
        Ok(kl_bits_per_coordinate(
            &Gaussian::new(mean, &prior.std)?,
            &Gaussian::new(&prior.zero, &prior.std)?,
        )?)
    }

    fn select(
        &self,
        mean: &Vec<f64>,
        prior: &GaussianPrior,
        partition: &Partition,
        picking: &mut Picking,
    ) -> Result<Selected<f64>, Error> {
        select_product(
            &Gaussian::new(mean, &prior.std)?,
            &Gaussian::new(&prior.zero, &prior.std)?,
            partition,
            picking,
        )
    }

    fn regenerate(
        &self,
        prior: &GaussianPrior,
        regenerating: &Regenerating,
        out: &mut [f64],
    ) -> Result<(), Error> {
        regenerate_product(&Gaussian::new(&prior.zero, &prior.std)?, regenerating, out)
    }
}
