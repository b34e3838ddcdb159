//! KLMS over any host codec (docs/algorithms.md §4.1–§4.5): the host's `q` and `p` as they are,
//! its symbols replaced by one candidate index per block.
//!
//! A KLMS payload is the host's header, then a [`KlmsFrame`]: the blocks (nothing for fixed
//! blocks; the client's own block sizes in an `UPDATE` round of the location protocol, §4.4;
//! else its mean KL per block against the broadcast ends), one index per block (`⌈log2 K⌉` bits,
//! or the exp-Golomb code of [`index_code_order`]) and, with `rescale_drift` or `report_drift`,
//! the drift ratio `ρ` of its candidates as an f32.

use super::codec::{Decoding, Drift, Encoding, Frame, HostCodec, Layout};
use super::wire::{BitReader, BitWriter, read_exp_golomb, write_exp_golomb};
use super::{DRIFT_RATIO_RANGE, KlmsTask, TaskBlocks, Uplink, UplinkSide, index_code_order};
use crate::error::Error;
use fedshard_strategies::compression::{
    KlmsEncoder, Partition, ProductDistribution, SharedSeed, boundary_bits, decode, drift_ratio,
    index_bits,
};
use fedshard_strategies::rng::ChaCha20Rng;

/// KLMS over the host `H`.
#[derive(Debug, Clone, Copy)]
pub struct Klms<H>(pub H);

/// What KLMS needs of a host beyond [`HostCodec`]: how to pick and regenerate candidates of its
/// distributions.
pub trait KlmsHost: HostCodec {
    /// Whether the server may divide the decoded drift by `ρ` (`rescale_drift`).
    const RESCALES: bool = true;

    /// The KL of `q` from `p` at each value, in bits, which adaptive blocks are cut by.
    fn kl_bits(&self, message: &Self::Message, prior: &Self::Prior) -> Result<Vec<f64>, Error>;

    /// Picks one candidate per block of `partition`.
    fn select(
        &self,
        message: &Self::Message,
        prior: &Self::Prior,
        partition: &Partition,
        picking: &mut Picking,
    ) -> Result<Selected<Self::Symbol>, Error>;

    /// Regenerates the candidates `indices` of `p` into `out`.
    fn regenerate(
        &self,
        prior: &Self::Prior,
        regenerating: &Regenerating,
        out: &mut [Self::Symbol],
    ) -> Result<(), Error>;
}

/// The client's settings and randomness for [`KlmsHost::select`].
pub struct Picking<'a> {
    pub klms: &'a KlmsTask,
    pub shared: &'a SharedSeed,
    pub selection: &'a mut ChaCha20Rng,
    /// Whether to measure the drift ratio `ρ` (`rescale_drift` or `report_drift`).
    pub track_drift: bool,
}

/// What the server regenerates candidates from.
pub struct Regenerating<'a> {
    pub partition: &'a Partition,
    /// `K`.
    pub candidates: usize,
    pub indices: &'a [u32],
    pub shared: &'a SharedSeed,
}

/// What a client picked: the symbols the server will decode, one index per block and, when
/// measured, the drift ratio `ρ` (`None`: no drift to carry).
pub struct Selected<S> {
    pub symbols: Vec<S>,
    pub indices: Vec<u32>,
    pub drift_ratio: Option<f64>,
}

/// [`KlmsHost::select`] for a host whose `q` and `p` are product distributions of the
/// mathematics crate.
pub fn select_product<D: ProductDistribution>(
    q: &D,
    p: &D,
    partition: &Partition,
    picking: &mut Picking,
) -> Result<Selected<D::Symbol>, Error> {
    let mut symbols = vec![D::Symbol::default(); q.len()];
    let mut encoder = if picking.track_drift {
        KlmsEncoder::tracking_means()
    } else {
        KlmsEncoder::new()
    }
    .with_selection(picking.klms.selection);
    let indices = encoder.encode(
        q,
        p,
        partition,
        picking.klms.candidates,
        picking.shared,
        picking.selection,
        &mut symbols,
    )?;
    let rho = picking.track_drift.then(|| {
        let means = |d: &D| (0..d.len()).map(|j| d.mean(j)).collect::<Vec<_>>();
        drift_ratio(encoder.conditional_means(), &means(q), &means(p))
    });
    Ok(Selected {
        symbols,
        indices,
        drift_ratio: rho.flatten(),
    })
}

/// [`KlmsHost::regenerate`] for a product distribution `p`.
pub fn regenerate_product<D: ProductDistribution>(
    p: &D,
    regenerating: &Regenerating,
    out: &mut [D::Symbol],
) -> Result<(), Error> {
    Ok(decode(
        p,
        regenerating.partition,
        regenerating.candidates,
        regenerating.indices,
        regenerating.shared,
        out,
    )?)
}

fn klms_of(uplink: &Uplink) -> Result<&KlmsTask, Error> {
    uplink.klms.as_ref().ok_or(Error::NoKlms(uplink.compressor))
}

impl<H: KlmsHost> HostCodec for Klms<H> {
    type Symbol = H::Symbol;
    type Header = H::Header;
    type Message = H::Message;
    type Prior = H::Prior;
    type Frame = KlmsFrame;

    fn check(&self, uplink: &Uplink) -> Result<(), Error> {
        klms_of(uplink)?;
        if uplink.rescale_drift && !H::RESCALES {
            return Err(Error::Rescale(uplink.compressor));
        }
        Ok(())
    }

    fn message(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        out: &[f32],
    ) -> Result<(Self::Header, Self::Message), Error> {
        self.0.message(uplink, sent, out)
    }

    fn prior(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        header: &Self::Header,
    ) -> Result<Self::Prior, Error> {
        self.0.prior(uplink, sent, header)
    }

    /// Cuts the blocks, picks one candidate per block, and frames the indices.
    fn encode_symbols(
        &self,
        cx: &mut Encoding,
        message: &Self::Message,
        prior: &Self::Prior,
    ) -> Result<(KlmsFrame, Vec<Self::Symbol>), Error> {
        let klms = klms_of(cx.uplink)?;
        let blocks = match &klms.blocks {
            TaskBlocks::Fixed { size } => BlockFrame::Fixed(Partition::fixed(cx.len, *size)?),
            TaskBlocks::Adaptive {
                d_target,
                max_block_size,
                ends,
            } => {
                let kl = self.0.kl_bits(message, prior)?;
                match ends {
                    None => BlockFrame::Own {
                        partition: Partition::adaptive(&kl, f64::from(*d_target), *max_block_size)?,
                        width: boundary_bits(*max_block_size)? as u32,
                    },
                    Some(ends) => {
                        let partition = Partition::from_ends(ends.clone())?;
                        BlockFrame::Report {
                            mean_kl_bits: partition.mean_block_kl_bits(&kl)? as f32,
                            partition,
                        }
                    }
                }
            }
        };
        let sends_drift = cx.uplink.sends_drift();
        let selected = self.0.select(
            message,
            prior,
            blocks.partition(),
            &mut Picking {
                klms,
                shared: &cx.shared,
                selection: &mut cx.selection,
                track_drift: sends_drift,
            },
        )?;
        // `None`: no drift to carry, sent as 1.
        let drift_ratio = sends_drift.then(|| {
            let (low, high) = DRIFT_RATIO_RANGE;
            selected.drift_ratio.unwrap_or(1.0).clamp(low, high) as f32
        });
        let frame = KlmsFrame {
            blocks,
            index_code: IndexCode::of(klms)?,
            indices: selected.indices,
            drift_ratio,
        };
        Ok((frame, selected.symbols))
    }

    /// Regenerates the selected candidates, recording the client's blocks, its KL report and
    /// its drift ratio in `side`.
    fn decode_symbols(
        &self,
        cx: &Decoding,
        frame: KlmsFrame,
        prior: &Self::Prior,
        side: &mut UplinkSide,
    ) -> Result<Vec<Self::Symbol>, Error> {
        let klms = klms_of(cx.uplink)?;
        let mut out = vec![H::Symbol::default(); cx.len];
        self.0.regenerate(
            prior,
            &Regenerating {
                partition: frame.blocks.partition(),
                candidates: klms.candidates,
                indices: &frame.indices,
                shared: &cx.shared,
            },
            &mut out,
        )?;
        match frame.blocks {
            BlockFrame::Own { partition, .. } => side.ends = Some(partition.ends().to_vec()),
            BlockFrame::Report { mean_kl_bits, .. } => {
                side.mean_kl_bits = Some(f64::from(mean_kl_bits))
            }
            BlockFrame::Fixed(_) => {}
        }
        side.drift_ratio = frame.drift_ratio.map(f64::from);
        Ok(out)
    }

    fn prior_mean(&self, prior: &Self::Prior, len: usize) -> Result<Vec<f64>, Error> {
        self.0.prior_mean(prior, len)
    }

    fn value(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        header: &Self::Header,
        symbols: &[Self::Symbol],
        drift: &Drift,
    ) -> Result<Vec<f32>, Error> {
        self.0.value(uplink, sent, header, symbols, drift)
    }

    fn record(&self, symbols: &[Self::Symbol], side: &mut UplinkSide) {
        self.0.record(symbols, side)
    }
}

/// The blocks of one KLMS message, as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockFrame {
    /// Fixed blocks (§4.3): nothing is sent.
    Fixed(Partition),
    /// The client's own adaptive blocks (`UPDATE`, §4.4): their count, then each size less one
    /// in `width = ⌈log2 MAX_BLOCK_SIZE⌉` bits.
    Own { partition: Partition, width: u32 },
    /// The broadcast ends: the client's mean KL per block in bits, as an f32.
    Report {
        mean_kl_bits: f32,
        partition: Partition,
    },
}

impl BlockFrame {
    /// The blocks the indices are for.
    pub fn partition(&self) -> &Partition {
        match self {
            BlockFrame::Fixed(partition)
            | BlockFrame::Own { partition, .. }
            | BlockFrame::Report { partition, .. } => partition,
        }
    }
}

/// What KLMS sends after the host's header.
#[derive(Debug, Clone, PartialEq)]
pub struct KlmsFrame {
    pub blocks: BlockFrame,
    /// How each index is written.
    pub index_code: IndexCode,
    /// `k*` of every block.
    pub indices: Vec<u32>,
    /// `ρ`, with `rescale_drift` or `report_drift`.
    pub drift_ratio: Option<f32>,
}

/// How an index is written: in the exp-Golomb code of its order (ordered selection), or in
/// `⌈log2 K⌉` bits (importance sampling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexCode {
    ExpGolomb(u32),
    Width(u32),
}

impl IndexCode {
    /// The code of a task's indices.
    pub fn of(klms: &KlmsTask) -> Result<Self, Error> {
        Ok(match index_code_order(klms)? {
            Some(order) => IndexCode::ExpGolomb(order),
            None => IndexCode::Width(index_bits(klms.candidates)? as u32),
        })
    }
}

impl Frame for KlmsFrame {
    fn write(&self, w: &mut BitWriter) {
        match &self.blocks {
            BlockFrame::Fixed(_) => {}
            BlockFrame::Own { partition, width } => {
                w.u32(partition.num_blocks() as u32);
                for size in partition.sizes() {
                    w.bits((size - 1) as u32, *width);
                }
            }
            BlockFrame::Report { mean_kl_bits, .. } => w.f32(*mean_kl_bits),
        }
        for &index in &self.indices {
            match self.index_code {
                IndexCode::ExpGolomb(order) => write_exp_golomb(w, index, order),
                IndexCode::Width(width) => w.bits(index, width),
            }
        }
        if let Some(rho) = self.drift_ratio {
            w.f32(rho);
        }
    }

    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error> {
        let d = layout.len;
        let klms = klms_of(layout.uplink)?;
        let blocks = match &klms.blocks {
            TaskBlocks::Fixed { size } => BlockFrame::Fixed(Partition::fixed(d, *size)?),
            TaskBlocks::Adaptive {
                max_block_size,
                ends: None,
                ..
            } => {
                let blocks = r.u32()? as usize;
                if blocks == 0 || blocks > d {
                    return Err(Error::BlockCount { blocks, len: d });
                }
                let width = boundary_bits(*max_block_size)? as u32;
                let sizes = (0..blocks)
                    .map(|_| r.bits(width).map(|s| s as usize + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                let own = Partition::from_sizes(&sizes, *max_block_size)
                    .map_err(Error::BlockBoundaries)?;
                if own.len() != d {
                    return Err(Error::BlockCoverage {
                        covered: own.len(),
                        len: d,
                    });
                }
                BlockFrame::Own {
                    partition: own,
                    width,
                }
            }
            TaskBlocks::Adaptive {
                ends: Some(ends), ..
            } => {
                let mean = r.f32()?;
                if !(mean.is_finite() && mean >= 0.0) {
                    return Err(Error::MeanKlReport(mean));
                }
                BlockFrame::Report {
                    mean_kl_bits: mean,
                    partition: Partition::from_ends(ends.clone())?,
                }
            }
        };
        let count = blocks.partition().num_blocks();
        let index_code = IndexCode::of(klms)?;
        let indices = match index_code {
            IndexCode::ExpGolomb(order) => (0..count)
                .map(|_| read_exp_golomb(r, order))
                .collect::<Result<Vec<_>, _>>()?,
            IndexCode::Width(width) => (0..count)
                .map(|_| r.bits(width))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let drift_ratio = if layout.uplink.sends_drift() {
            let rho = r.f32()?;
            let (low, high) = DRIFT_RATIO_RANGE;
            if !(low as f32 as f64..=high).contains(&f64::from(rho)) {
                return Err(Error::DriftRatio {
                    rho: f64::from(rho),
                    low,
                    high,
                });
            }
            Some(rho)
        } else {
            None
        };
        Ok(KlmsFrame {
            blocks,
            index_code,
            indices,
            drift_ratio,
        })
    }
}
