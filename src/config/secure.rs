//! `[secure_aggregation]`: the server folds each round from the sum of its updates alone
//! (SecAgg+; docs/secagg.md). The section's ranges and what a sum cannot serve (a non-linear
//! uplink coding, weights known only after the sum, a per-update check on the server) are the
//! rules of [`SecureSettings::validate`], secagg's parameters and the engine, asked by
//! `super::rules` before anything starts. With `[privacy]` the clients clip to DP-FedAvg's clip
//! norm and the server noises the sum.

use fedshard_actors::secure::SecureSettings;
use serde::{Deserialize, Serialize};

/// `[secure_aggregation]` as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecureSection {
    /// Each client scales its change down to this L2 norm before encoding (the fixed-point
    /// range is `[−clip_norm, clip_norm]`). Omitted with `[privacy]`, whose clip it is then.
    pub clip_norm: Option<f64>,
    /// Fixed-point steps per unit (default 2¹⁶, at least 2¹⁰).
    pub scale: Option<f64>,
    /// `t` as a fraction of the holders of each secret, in (0.5, 1] (default 0.6).
    pub threshold: Option<f64>,
    /// SecAgg+'s graph degree (even, in 2..=1024); omit for the complete graph of SecAgg.
    pub degree: Option<usize>,
}

const DEFAULT_SCALE: f64 = 65536.0;
const DEFAULT_THRESHOLD: f64 = 0.6;

impl SecureSection {
    /// The settings a run with this section uses.
    pub fn settings(&self) -> SecureSettings {
        SecureSettings {
            clip_norm: self.clip_norm,
            scale: self.scale.unwrap_or(DEFAULT_SCALE),
            threshold: self.threshold.unwrap_or(DEFAULT_THRESHOLD),
            degree: self.degree,
        }
    }
}
