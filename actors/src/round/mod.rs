//! One round as plain functions over plain data, so each step is unit-tested without actors:
//! build every participant's task ([`build_tasks`]), sort the clients' answers into updates and
//! failures ([`classify`]), open and check each update against its task ([`validate`]), fold the
//! accepted ones through the aggregation policy ([`fold`] for a round on one model version,
//! [`fold_buffered`] for a buffer trained from several, [`fold_changes`] for any updates as
//! weight-space changes, with differential privacy as a wrapper over the policy, [`Private`])
//! and sum it up ([`record`]).
//! The server's round engine only moves messages between these, whatever its schedule.

mod classify;
mod cosine;
mod fold;
mod private;
mod record;
pub(crate) mod sliced;
mod tasks;
#[cfg(test)]
pub(crate) mod tests;
mod validate;

pub use classify::{Classified, Expect, classify};
pub use cosine::update_cosine;
pub(crate) use fold::declined;
pub use fold::{
    Buffered, Change, FoldContext, Folded, fold, fold_blocks, fold_buffered, fold_changes,
    weight_change,
};
pub use private::{Private, Release, clipped_change};
pub use record::{RoundSummary, Tally, record};
#[cfg(test)]
pub(crate) use tasks::task_bits;
pub use tasks::{Tasks, build_tasks};
pub use validate::{Accepted, Validated, check, update_norm, validate};

use crate::client::ClientReply;
use fedshard_protocol::task::LayerShard;
use serde::{Deserialize, Serialize};

/// Why a selected client gave no update; the label is the `reason` of the failure counters in
/// `metrics.jsonl` and Prometheus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Local training returned an error.
    Error,
    /// Local training panicked (the client actor is restarted).
    Panic,
    /// No answer before the round's deadline.
    Timeout,
    /// The client could not be reached, or answered out of protocol.
    Unreachable,
}

impl FailureKind {
    pub const ALL: [FailureKind; 4] = [
        FailureKind::Error,
        FailureKind::Panic,
        FailureKind::Timeout,
        FailureKind::Unreachable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Error => "error",
            FailureKind::Panic => "panic",
            FailureKind::Timeout => "timeout",
            FailureKind::Unreachable => "unreachable",
        }
    }
}

/// A failed client: what kind of failure, and the text for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientFailure {
    pub kind: FailureKind,
    pub reason: String,
}

/// How one dispatched client ended its phase, as the transport saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Reply(ClientReply),
    Timeout,
    Unreachable(String),
}

/// The `j`-th term of a shard as trained (`got`) and as sent (`sent`), for a `rows × cols`
/// layer: `[u'_j, v'_j, ū'_j, v̄'_j]`, or `None` when a factor is too short to hold it.
pub(crate) fn term_factors<'a>(
    got: &'a LayerShard,
    sent: &'a LayerShard,
    j: usize,
    (rows, cols): (usize, usize),
) -> Option<[&'a [f32]; 4]> {
    Some([
        got.left.get(j * rows..(j + 1) * rows)?,
        got.right.get(j * cols..(j + 1) * cols)?,
        sent.left.get(j * rows..(j + 1) * rows)?,
        sent.right.get(j * cols..(j + 1) * cols)?,
    ])
}
