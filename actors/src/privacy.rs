//! Client-level differential privacy in the round engine (DP-FedAvg, McMahan et al. 2018;
//! docs/privacy.md): what a private run was configured with ([`PrivacySettings`]), what each
//! release spent ([`PrivacyRecord`]), and the run's total for `summary.json`
//! ([`PrivacySummary`]). The fold itself is [`crate::round::fold_private`]; the accountant and
//! the clipping arithmetic are `fedshard_strategies::privacy`.

use crate::error::{Error, Result};
use crate::record::RoundRecord;
use fedshard_strategies::privacy::{Accountant, AdaptiveClip, Sampling, update_noise_multiplier};
use serde::{Deserialize, Serialize};

/// How the clip norm is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Clipping {
    /// One clip norm for the whole run.
    Fixed { norm: f64 },
    /// Andrew et al. (2021): starts at `initial` and follows the rule's quantile.
    Adaptive { initial: f64, rule: AdaptiveClip },
}

/// `[privacy]`, resolved against the federation it protects.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrivacySettings {
    /// `z`: the noise of a release over its clip norm, as the accountant counts it (with
    /// adaptive clipping, the update sum's and the count's noise together).
    pub noise_multiplier: f64,
    pub clipping: Clipping,
    pub delta: f64,
    /// How the clients of one release are drawn; the accountant's mechanism.
    pub sampling: Sampling,
    /// DP-FedAvg's fixed denominator: the expected number of updates in a release (`qN` under
    /// Poisson sampling, the sample size without replacement, the buffer in async mode), so
    /// that one client's share of the average never depends on how many others answered.
    pub expected_updates: f64,
    /// Stop before a round whose release would take ε past this.
    pub target_epsilon: Option<f64>,
}

impl PrivacySettings {
    /// The accountant of the run's releases.
    pub fn accountant(&self) -> Result<Accountant> {
        Accountant::new(self.sampling, self.noise_multiplier).map_err(Error::Privacy)
    }

    /// The noise of the update sum over the clip norm: `z` with a fixed clip, `z_Δ` of
    /// [`update_noise_multiplier`] with an adaptive one.
    pub fn update_noise_multiplier(&self) -> Result<f64> {
        match self.clipping {
            Clipping::Fixed { .. } => Ok(self.noise_multiplier),
            Clipping::Adaptive { rule, .. } => {
                update_noise_multiplier(self.noise_multiplier, rule.count_stddev)
                    .map_err(Error::Privacy)
            }
        }
    }

    /// The clip norm of the release after `history`: the last private record's next norm, or
    /// the configured one. Read from the history, so a resumed run clips as the uninterrupted
    /// one would.
    pub fn clip_norm(&self, history: &[RoundRecord]) -> f64 {
        let configured = match self.clipping {
            Clipping::Fixed { norm } => norm,
            Clipping::Adaptive { initial, .. } => initial,
        };
        history
            .iter()
            .rev()
            .find_map(|r| r.privacy.map(|p| p.next_clip_norm))
            .unwrap_or(configured)
    }
}

/// What one private release spent and clipped: part of the round's record.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrivacyRecord {
    /// ε at the configured δ after every release so far, this one included.
    pub epsilon: f64,
    pub delta: f64,
    /// The clip norm of this release.
    pub clip_norm: f64,
    /// The clip norm of the next one (equal to `clip_norm` with a fixed clip).
    pub next_clip_norm: f64,
    /// Updates whose change was scaled down to the clip norm.
    pub clipped: usize,
    /// With adaptive clipping, the noised fraction of updates at most the clip norm, `b̃`.
    pub unclipped_fraction: Option<f64>,
}

/// The `privacy` block of `summary.json`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrivacySummary {
    pub epsilon: f64,
    pub delta: f64,
    pub noise_multiplier: f64,
    #[serde(flatten)]
    pub sampling: Sampling,
    /// Releases accounted for.
    pub rounds: u64,
}

impl PrivacySummary {
    /// The run's total after `history`, `None` for a run without privacy.
    pub fn of(settings: Option<&PrivacySettings>, history: &[RoundRecord]) -> Option<Self> {
        let settings = settings?;
        let last = history.iter().rev().find_map(|r| r.privacy);
        Some(Self {
            epsilon: last.map_or(0.0, |p| p.epsilon),
            delta: settings.delta,
            noise_multiplier: settings.noise_multiplier,
            sampling: settings.sampling,
            rounds: history.len() as u64,
        })
    }
}
