//! The one error type of the mathematics crate.

/// Why a computation refused its input or could not finish.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StrategyError {
    /// An argument is outside the domain of the formula. `what` names the argument.
    #[error("invalid {what}: {reason}")]
    InvalidInput { what: &'static str, reason: String },
    /// A policy name that the registry does not know.
    #[error("unknown {kind} `{name}`; valid names: {valid}")]
    UnknownName {
        kind: &'static str,
        name: String,
        valid: String,
    },
    /// An iterative solver stopped before reaching its tolerance.
    #[error("{what} did not converge within {iterations} iterations (residual {residual:e})")]
    NotConverged {
        what: &'static str,
        iterations: usize,
        residual: f64,
    },
}

impl StrategyError {
    /// Shorthand for [`StrategyError::InvalidInput`].
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            what,
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = StrategyError> = std::result::Result<T, E>;
