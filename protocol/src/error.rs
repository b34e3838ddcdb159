//! The one error type of the protocol crate.
//!
//! Most variants describe a peer's bytes that do not decode, or a client's output that its
//! compressor cannot code; the server counts the former as malformed updates
//! ([`crate::payload::Rejection::Malformed`]), the client fails on the latter as on a training
//! error. Each message names the field and the form it should have had.

use crate::task::ClientId;
use crate::uplink::Compressor;
use crate::uplink::wire::WireError;
use fedshard_strategies::error::StrategyError;
use std::ops::Range;

/// Why the protocol crate refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A payload's bits end early, run on, or hold an impossible code.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A computation of the mathematics crate refused its input.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// An identity payload that is not bincode of the trained tensors.
    #[error("{0}")]
    Bincode(String),

    /// A compressed coder asked to code the identity encoding, which has no host method.
    #[error("the identity encoding has no host method")]
    NoHost,
    /// A `-klms` coder asked to code an uplink without KLMS settings.
    #[error("`{0}` needs the KLMS settings of the round in the task")]
    NoKlms(Compressor),
    /// The client's output and its task do not hold the same number of values.
    #[error("the output has {output} values, the task {task}")]
    OutputLength { output: usize, task: usize },
    /// `rescale_drift` with a compressor that cannot divide its drift by `ρ`.
    #[error(
        "`{0}` cannot rescale its drift (rescale_drift): only KLMS with QSGD, SignSGD or SGLD does, \
         FedPM's decoded masks would leave [0, 1]"
    )]
    Rescale(Compressor),
    /// `report_drift` without KLMS.
    #[error("`{0}` sends no drift ratio (report_drift): only KLMS reports one")]
    ReportDrift(Compressor),

    /// FedPM: a mask probability outside `[0, 1]` (`what` is `sent` or `trained`).
    #[error("FedPM needs mask probabilities in [0, 1]; {what} value {index} is {value}")]
    MaskProbability {
        what: &'static str,
        index: usize,
        value: f32,
    },
    /// QSGD: the client's update has a non-finite norm.
    #[error("QSGD: the update's norm is {0}; expected a finite norm")]
    UpdateNorm(f64),
    /// QSGD: the norm a payload carries.
    #[error("QSGD norm {0}; expected a finite norm ≥ 0")]
    QsgdNorm(f32),
    /// QSGD-KLMS: a client's tensor means that are not probabilities.
    #[error("QSGD tensor {tensor} means ({minus}, {plus}) are not probabilities")]
    TensorMeans {
        tensor: usize,
        minus: f64,
        plus: f64,
    },
    /// QSGD-KLMS's prior: the tensor frequencies do not match the tensors.
    #[error("QSGD prior: {frequencies} tensor frequencies for {tensors} tensors")]
    PriorFrequencies { frequencies: usize, tensors: usize },
    /// QSGD-KLMS's prior: the tensors do not cover the message.
    #[error("QSGD prior: tensors of {values} values for a message of {len}")]
    PriorTensors { values: usize, len: usize },
    /// QSGD-KLMS's prior: last round's counts do not cover the message.
    #[error("QSGD prior: {counts} counts for a message of {len}")]
    PriorCounts { counts: usize, len: usize },
    /// QSGD-KLMS's prior: `β` is not a positive number.
    #[error("QSGD prior: weight β = {0}; expected a finite β > 0")]
    PriorWeight(f64),
    /// QSGD-KLMS's prior: a tensor frequency that is not a distribution.
    #[error("QSGD prior: tensor {tensor} frequencies {row:?} are not a distribution")]
    PriorRow { tensor: usize, row: [f64; 3] },
    /// QSGD: the server's counts do not reach a value the task holds.
    #[error("QSGD counts cover {counts} values, the task needs {needs:?}")]
    QsgdCounts { counts: usize, needs: Range<usize> },
    /// SignSGD: an update whose temperature is not finite.
    #[error("SignSGD: the update is not finite")]
    SignTemperature,
    /// SGLD without the round's step and cohort.
    #[error("SGLD needs the round's step and cohort in the task")]
    NoCohort,
    /// SGLD: the noise scale the task implies.
    #[error("SGLD: the message's σ is {0}; expected a finite σ > 0")]
    SgldNoise(f64),
    /// SGLD: a non-finite gradient in the client's output.
    #[error("SGLD: gradient value {index} is {value}; expected a finite value")]
    SgldGradient { index: usize, value: f64 },
    /// SGLD: a sampled value too large for the f32 it travels as.
    #[error("SGLD: sample value {index} ({value}) overflows an f32")]
    SgldSample { index: usize, value: f64 },
    /// SGLD: a non-finite value in a payload.
    #[error("SGLD value {index} is {value}; expected a finite value")]
    SgldValue { index: usize, value: f32 },

    /// KLMS: a client's block count that is zero or exceeds its message.
    #[error("{blocks} blocks for a message of {len} values; expected 1 to {len}")]
    BlockCount { blocks: usize, len: usize },
    /// KLMS: a client's block sizes that do not form a partition.
    #[error("block boundaries: {0}")]
    BlockBoundaries(StrategyError),
    /// KLMS: a client's blocks that do not cover its message.
    #[error("block boundaries cover {covered} values of {len}")]
    BlockCoverage { covered: usize, len: usize },
    /// KLMS: a mean-KL report that is not a number of bits.
    #[error("mean-KL report {0}; expected a finite number of bits ≥ 0")]
    MeanKlReport(f32),
    /// KLMS: a drift ratio outside [`crate::uplink::DRIFT_RATIO_RANGE`].
    #[error("drift ratio {rho}; expected {low} ≤ ρ ≤ {high}")]
    DriftRatio { rho: f64, low: f64, high: f64 },

    /// Sharding: a layer the policy names that the model does not have.
    #[error("sharded layer `{0}` is not a tensor of the model")]
    UnknownLayer(String),
    /// Sharding: a layer whose factorisation failed.
    #[error("layer `{layer}`: {source}")]
    Factorize {
        layer: String,
        source: StrategyError,
    },
    /// Sharding: a layer whose strategy refused a keep ratio.
    #[error("layer `{layer}`, keep ratio {keep_ratio}: {source}")]
    Plan {
        layer: String,
        keep_ratio: f64,
        source: StrategyError,
    },
    /// Width slicing: a model's width description that does not fit its tensors, or a slice
    /// that does not fit the description.
    #[error("width slicing: {0}")]
    Width(String),
    /// Sharding: a participant the plan has no random stream for.
    #[error("participant {0} without a stream")]
    NoStream(ClientId),
}

/// A field the bit reader could not read is a wire error like any other code's.
impl From<fedshard_bits::BitsError> for Error {
    fn from(e: fedshard_bits::BitsError) -> Self {
        Error::Wire(e.into())
    }
}
