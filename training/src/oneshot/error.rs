//! Why a one-shot experiment could not run.

use fedshard_strategies::StrategyError;
use thiserror::Error;

/// An invalid experiment configuration, or a step of one run that failed.
#[derive(Debug, Error)]
pub enum OneshotError {
    #[error("unknown ridge form `{0}`; valid forms: mean, sum")]
    UnknownForm(String),
    #[error("{option} must be at least 1")]
    TooFew { option: &'static str },
    #[error("--gammas must list at least one value")]
    NoGammas,
    #[error("gamma {0} is outside [0, 3] (mean node size m^γ)")]
    GammaOutOfRange(f64),
    #[error("log-normal size law with μ = {mu}: {cause}")]
    SizeLaw { mu: f64, cause: String },
    /// `XᵀX + κI` has no Cholesky factor; `cause` is faer's report.
    #[error("ridge system XᵀX + κI is not positive definite: {cause}")]
    NotPositiveDefinite { cause: String },
    /// An aggregator's weights (FedAvg, FESC, the oracle).
    #[error(transparent)]
    Weights(#[from] StrategyError),
    #[error("run {run} at gamma {gamma}")]
    Run {
        run: usize,
        gamma: f64,
        source: Box<OneshotError>,
    },
}
