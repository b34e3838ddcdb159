//! The codec seam: one type per host method ([`super::fedpm`], [`super::qsgd`],
//! [`super::signsgd`], [`super::sgld`], and [`super::identity`]), and KLMS one generic wrapper
//! over any of them ([`super::klms::Klms`]).
//!
//! A payload is a [`HostCodec::Header`] followed by a [`HostCodec::Frame`]; each is one type
//! whose [`Frame::write`] and [`Frame::read`] sit side by side over the same fields, as
//! bincode's `Encode`/`Decode` pair does, so the client's encoder and the server's decoder
//! cannot drift apart. [`HostCodec`] says what a host method computes around them: the client's
//! message, the prior the server rebuilds, the symbols drawn, and the server's value of each
//! decoded symbol; one generic driver ([`Codec`] for every [`HostCodec`]) runs them in the same
//! order on both ends.

use super::wire::{BitReader, BitWriter};
use super::{Uplink, UplinkSide, flatten};
use crate::error::Error;
use crate::model::ModelState;
use crate::task::{LayerShard, TrainOutput, TrainTask};
use fedshard_strategies::compression::SharedSeed;
use fedshard_strategies::rng::ChaCha20Rng;

/// A part of a payload that one type both writes and reads.
pub trait Frame: Sized {
    /// Appends the fields, in order.
    fn write(&self, w: &mut BitWriter);
    /// Reads the fields [`Frame::write`] wrote, checking each; `layout` says what the task
    /// fixes (how many values, which settings).
    fn read(r: &mut BitReader, layout: &Layout) -> Result<Self, Error>;
}

/// What a reader knows besides the bytes: the task's uplink and the length of its message.
#[derive(Debug, Clone, Copy)]
pub struct Layout<'a> {
    pub uplink: &'a Uplink,
    pub len: usize,
}

/// Nothing: the header of the hosts that send none.
impl Frame for () {
    fn write(&self, _: &mut BitWriter) {}

    fn read(_: &mut BitReader, _: &Layout) -> Result<Self, Error> {
        Ok(())
    }
}

/// What a client chose and the server decodes, whatever the host.
#[derive(Debug, Clone, PartialEq)]
pub enum Symbols {
    /// Mask bits as 0/1, signs as ±1, QSGD's `{−1, 0, +1}`.
    Discrete(Vec<i8>),
    /// SGLD's sample `y_c`; the identity encoding's values.
    Real(Vec<f64>),
}

/// One value's symbol.
pub trait Symbol: Copy + Default {
    /// The symbols of a message, whatever their host.
    fn erase(symbols: Vec<Self>) -> Symbols;
}

impl Symbol for i8 {
    fn erase(symbols: Vec<Self>) -> Symbols {
        Symbols::Discrete(symbols)
    }
}

impl Symbol for f64 {
    fn erase(symbols: Vec<Self>) -> Symbols {
        Symbols::Real(symbols)
    }
}

/// What the server learns from a payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// The identity encoding: the tensors as the client sent them, still to be checked against
    /// the task.
    Tensors {
        dense: ModelState,
        shards: Vec<LayerShard>,
    },
    /// A compressed message: the server's value at each value of the task's message
    /// ([`flatten`]) and what it learnt besides.
    Message { values: Vec<f32>, side: UplinkSide },
}

/// A compressor's coder, as [`crate::payload`] calls it ([`super::Compressor::codec`]).
pub trait Codec {
    /// The client's payload for its training output, and the symbols it chose.
    fn encode(&self, task: &TrainTask, output: &TrainOutput) -> Result<(Vec<u8>, Symbols), Error>;
    /// The server's reading of a payload, and the symbols it decoded. Every malformed field is
    /// an error, never a panic.
    fn decode(&self, task: &TrainTask, bytes: &[u8]) -> Result<(Update, Symbols), Error>;
}

/// The client's side of a message being coded: the task's uplink, the randomness it shares
/// with the server, and its private selection stream.
pub struct Encoding<'a> {
    pub uplink: &'a Uplink,
    /// The length of the message.
    pub len: usize,
    pub shared: SharedSeed,
    /// Draws the client's symbols (and KLMS's `k*`); the server never sees it.
    pub selection: ChaCha20Rng,
}

/// The server's side of a message being decoded.
pub struct Decoding<'a> {
    pub uplink: &'a Uplink,
    pub shared: SharedSeed,
    pub len: usize,
}

/// How the server maps a decoded symbol `y` back to a drift: `μ_p + (y − μ_p)/ρ` with
/// [`rescale_drift`](super::CompressionConfig::rescale_drift), `y` otherwise.
#[derive(Debug, Clone, Default)]
pub struct Drift {
    rho: Option<f64>,
    /// `E_p[y_j]` when the drift is rescaled, else empty.
    prior_mean: Vec<f64>,
}

impl Drift {
    /// The drift of value `j` whose decoded symbol is `y`.
    pub fn of(&self, j: usize, y: f64) -> f64 {
        match self.rho {
            Some(rho) => {
                let mu = self.prior_mean.get(j).copied().unwrap_or(0.0);
                mu + (y - mu) / rho
            }
            None => y,
        }
    }
}

/// One host method of docs/algorithms.md §4 (the table in [`super`]), with its own code for its
/// symbols; [`super::klms::Klms`] keeps everything but that code.
pub trait HostCodec {
    /// One value's symbol.
    type Symbol: Symbol;
    /// What the client sends before its symbols (QSGD's norm), `()` for the others.
    type Header: Frame;
    /// The client's distribution `q` over its symbols.
    type Message;
    /// The global distribution `p`, which the server rebuilds from the task and the header.
    type Prior;
    /// The symbols as they travel.
    type Frame: Frame;

    /// Refuses drift settings the code cannot honour: without KLMS there is no drift ratio to
    /// send, report or divide by.
    fn check(&self, uplink: &Uplink) -> Result<(), Error> {
        if uplink.rescale_drift {
            return Err(Error::Rescale(uplink.compressor));
        }
        if uplink.report_drift {
            return Err(Error::ReportDrift(uplink.compressor));
        }
        Ok(())
    }

    /// The client's view of its message: what it sends first, and `q`; `sent` is the task's
    /// message, `out` the client's trained values (both [`flatten`]ed).
    fn message(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        out: &[f32],
    ) -> Result<(Self::Header, Self::Message), Error>;

    /// `p`, from the task and what the client sent first (the same on both ends).
    fn prior(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        header: &Self::Header,
    ) -> Result<Self::Prior, Error>;

    /// The client's symbols, drawn from `q`, and the frame that carries them.
    fn encode_symbols(
        &self,
        cx: &mut Encoding,
        message: &Self::Message,
        prior: &Self::Prior,
    ) -> Result<(Self::Frame, Vec<Self::Symbol>), Error>;

    /// The symbols a frame carries, recording what else it tells the server in `side`.
    fn decode_symbols(
        &self,
        cx: &Decoding,
        frame: Self::Frame,
        prior: &Self::Prior,
        side: &mut UplinkSide,
    ) -> Result<Vec<Self::Symbol>, Error>;

    /// `E_p[y_j]` at every value, from which a rescaled drift is measured.
    fn prior_mean(&self, prior: &Self::Prior, len: usize) -> Result<Vec<f64>, Error>;

    /// The server's value at every value of the message, from the decoded symbols.
    fn value(
        &self,
        uplink: &Uplink,
        sent: &[f32],
        header: &Self::Header,
        symbols: &[Self::Symbol],
        drift: &Drift,
    ) -> Result<Vec<f32>, Error>;

    /// Records the decoded symbols in `side` where the server learns from them (QSGD's counts).
    fn record(&self, _symbols: &[Self::Symbol], _side: &mut UplinkSide) {}
}

/// The client's update `v = out − sent`, which QSGD and SignSGD quantise.
pub fn update(sent: &[f32], out: &[f32]) -> Vec<f64> {
    out.iter()
        .zip(sent)
        .map(|(o, s)| f64::from(*o) - f64::from(*s))
        .collect()
}

fn shared_seed(task: &TrainTask) -> SharedSeed {
    SharedSeed {
        seed: task.seed,
        round: task.round,
        client: task.client,
    }
}

/// The driver both ends run: the client writes the header then the frame, the server reads
/// them in the same order, rebuilds the same prior, and decodes.
impl<H: HostCodec> Codec for H {
    fn encode(&self, task: &TrainTask, output: &TrainOutput) -> Result<(Vec<u8>, Symbols), Error> {
        let uplink = &task.uplink;
        self.check(uplink)?;
        let sent = flatten(&task.dense, &task.shards);
        let out = flatten(&output.dense, &output.shards);
        if sent.len() != out.len() {
            return Err(Error::OutputLength {
                output: out.len(),
                task: sent.len(),
            });
        }
        let (header, message) = self.message(uplink, &sent, &out)?;
        let prior = self.prior(uplink, &sent, &header)?;
        let shared = shared_seed(task);
        let mut cx = Encoding {
            uplink,
            len: sent.len(),
            selection: shared.selection_stream(),
            shared,
        };
        let (frame, symbols) = self.encode_symbols(&mut cx, &message, &prior)?;
        let mut w = BitWriter::new();
        header.write(&mut w);
        frame.write(&mut w);
        Ok((w.finish(), H::Symbol::erase(symbols)))
    }

    fn decode(&self, task: &TrainTask, bytes: &[u8]) -> Result<(Update, Symbols), Error> {
        let uplink = &task.uplink;
        let sent = flatten(&task.dense, &task.shards);
        let layout = Layout {
            uplink,
            len: sent.len(),
        };
        let mut r = BitReader::new(bytes);
        let header = H::Header::read(&mut r, &layout)?;
        self.check(uplink)?;
        let prior = self.prior(uplink, &sent, &header)?;
        let frame = H::Frame::read(&mut r, &layout)?;
        r.finish()?;
        let mut side = UplinkSide {
            len: sent.len(),
            ..UplinkSide::default()
        };
        let cx = Decoding {
            uplink,
            shared: shared_seed(task),
            len: sent.len(),
        };
        let symbols = self.decode_symbols(&cx, frame, &prior, &mut side)?;
        let drift = match side.drift_ratio.filter(|_| uplink.rescale_drift) {
            Some(rho) => Drift {
                rho: Some(rho),
                prior_mean: self.prior_mean(&prior, sent.len())?,
            },
            None => Drift::default(),
        };
        let values = self.value(uplink, &sent, &header, &symbols, &drift)?;
        self.record(&symbols, &mut side);
        Ok((Update::Message { values, side }, H::Symbol::erase(symbols)))
    }
}
