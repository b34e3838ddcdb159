//! What a round reports: one [`RoundRecord`] per round, the single source for `metrics.jsonl`,
//! the progress bar and the Prometheus metrics.

use crate::round::FailureKind;
use fedshard_protocol::payload::RejectionKind;
use fedshard_protocol::shard_plan::GroupStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub round: u64,
    /// Clients asked to train.
    pub participants: usize,
    /// Updates accepted into the aggregate.
    pub successes: usize,
    /// Clients that failed, by kind (`error`, `panic`, `timeout`, `unreachable`).
    pub failures: BTreeMap<FailureKind, usize>,
    /// Updates rejected by validation, by kind (`malformed`, `shape`, `non_finite`, `indices`,
    /// `stale`, `forged`), and `non_finite_aggregate` when the accepted updates summed past f32
    /// (model unchanged).
    pub rejected: BTreeMap<RejectionKind, usize>,
    /// Whether the global model changed (false when below the minimum of successful clients).
    pub model_updated: bool,
    pub accuracy: f64,
    pub loss: f64,
    /// Mean local training loss of the accepted clients.
    pub train_loss: f64,
    pub uplink_bits: u64,
    pub downlink_bits: u64,
    /// Uplink bits per model parameter per received update.
    pub bits_per_parameter: f64,
    pub anme: f64,
    pub groups: Vec<GroupStats>,
    pub learning_rate: f64,
    /// Seconds each accepted client spent training.
    pub client_train_seconds: Vec<f64>,
    pub seconds: f64,
}

impl RoundRecord {
    pub fn failures_total(&self) -> usize {
        self.failures.values().sum()
    }
}

/// `summary.json` of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub rounds_completed: u64,
    pub final_accuracy: f64,
    pub final_loss: f64,
    pub uplink_bits_total: u64,
    pub downlink_bits_total: u64,
    pub failures_total: usize,
    pub rejected_total: usize,
    pub seconds_total: f64,
    pub per_round: Vec<RoundRecord>,
}

impl Summary {
    pub fn from_history(history: &[RoundRecord]) -> Self {
        let last = history.last();
        Self {
            rounds_completed: last.map_or(0, |r| r.round),
            final_accuracy: last.map_or(f64::NAN, |r| r.accuracy),
            final_loss: last.map_or(f64::NAN, |r| r.loss),
            uplink_bits_total: history.iter().map(|r| r.uplink_bits).sum(),
            downlink_bits_total: history.iter().map(|r| r.downlink_bits).sum(),
            failures_total: history.iter().map(RoundRecord::failures_total).sum(),
            rejected_total: history
                .iter()
                .map(|r| r.rejected.values().sum::<usize>())
                .sum(),
            seconds_total: history.iter().map(|r| r.seconds).sum(),
            per_round: history.to_vec(),
        }
    }
}
