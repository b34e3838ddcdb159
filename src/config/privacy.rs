//! `[privacy]`: client-level differential privacy (DP-FedAvg with its accountant;
//! docs/privacy.md). The section is checked here on the ranges no other type owns; what the
//! accountant cannot bound (the noise, the sampling, the federation it protects) is its own
//! rule ([`PrivacySettings`]' checked accountant, asked through `super::rules`), so a run is
//! refused before anything starts, never run with a wrong ε.

use super::{Config, ModelSection, Schedule, check};
use anyhow::bail;
use fedshard_actors::privacy::{Clipping, PrivacySettings};
use fedshard_protocol::uplink::fedpm::{MASK_HIGH, MASK_LOW};
use fedshard_strategies::privacy::{AdaptiveClip, Sampling};
use fedshard_strategies::selection::SelectorName;
use serde::{Deserialize, Serialize};

/// `[privacy]` as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivacySection {
    /// `z`: the Gaussian noise of each release in clip norms.
    pub noise_multiplier: f64,
    /// The clip norm `C` of each client's weight-space change (the starting norm with
    /// `adaptive_quantile`).
    pub clip_norm: f64,
    /// The δ at which ε is reported.
    pub delta: f64,
    /// Adaptive clipping's target quantile γ of the update norms (omit for a fixed clip).
    pub adaptive_quantile: Option<f64>,
    /// Adaptive clipping's step η_C (default 0.2, Andrew et al. 2021).
    pub clip_learning_rate: Option<f64>,
    /// Adaptive clipping's count noise σ_b (default: the expected updates per release / 20,
    /// Andrew et al. 2021).
    pub clipped_count_stddev: Option<f64>,
    /// Stop before the round that would take ε past this.
    pub target_epsilon: Option<f64>,
}

/// Andrew et al.'s η_C.
const DEFAULT_CLIP_LEARNING_RATE: f64 = 0.2;

fn positive(name: &str, value: f64) -> anyhow::Result<()> {
    check(
        name,
        value.is_finite() && value > 0.0,
        "a positive number",
        value.to_string(),
    )
}

impl PrivacySection {
    /// The section's ranges that no other type owns.
    pub fn validate(&self, config: &Config) -> anyhow::Result<()> {
        positive("privacy.clip_norm", self.clip_norm)?;
        check(
            "privacy.delta",
            self.delta > 0.0 && self.delta < 1.0,
            "a probability in (0, 1), such as 1e-5",
            self.delta.to_string(),
        )?;
        if let Some(target) = self.target_epsilon {
            positive("privacy.target_epsilon", target)?;
        }
        match self.adaptive_quantile {
            Some(q) => check(
                "privacy.adaptive_quantile",
                q > 0.0 && q < 1.0,
                "a quantile in (0, 1), such as 0.5",
                q.to_string(),
            )?,
            None => {
                for (name, set) in [
                    ("clip_learning_rate", self.clip_learning_rate.is_some()),
                    ("clipped_count_stddev", self.clipped_count_stddev.is_some()),
                ] {
                    if set {
                        bail!(
                            "field `privacy.{name}`: expected it only with \
                             `privacy.adaptive_quantile` (adaptive clipping), found it with a \
                             fixed clip norm"
                        );
                    }
                }
            }
        }
        if let Some(eta) = self.clip_learning_rate {
            positive("privacy.clip_learning_rate", eta)?;
        }
        if let Clipping::Adaptive { rule, .. } = self.settings(config).clipping {
            positive("privacy.clipped_count_stddev", rule.count_stddev)?;
        }
        Ok(())
    }

    /// The settings a run with this section and `config`'s federation uses.
    pub fn settings(&self, config: &Config) -> PrivacySettings {
        let f = &config.federation;
        let population = config.data.clients();
        let (sampling, expected_updates) = match f.schedule {
            Schedule::Async { buffer, .. } => (Sampling::None, buffer as f64),
            Schedule::Sync { .. } if f.selector == SelectorName::Poisson => {
                let rate = (f.clients_per_round / population as f64).min(1.0);
                (Sampling::Poisson { rate }, rate * population as f64)
            }
            Schedule::Sync { .. } => {
                let m = (f.clients_per_round.round().max(1.0) as usize).min(population);
                let sampling = Sampling::WithoutReplacement {
                    population,
                    sample_size: m,
                };
                (sampling, m as f64)
            }
        };
        let clipping = match self.adaptive_quantile {
            None => Clipping::Fixed {
                norm: self.clip_norm,
            },
            Some(quantile) => Clipping::Adaptive {
                initial: self.clip_norm,
                rule: AdaptiveClip {
                    quantile,
                    learning_rate: self
                        .clip_learning_rate
                        .unwrap_or(DEFAULT_CLIP_LEARNING_RATE),
                    count_stddev: self.clipped_count_stddev.unwrap_or(expected_updates / 20.0),
                },
            },
        };
        PrivacySettings {
            noise_multiplier: self.noise_multiplier,
            clipping,
            delta: self.delta,
            sampling,
            expected_updates,
            target_epsilon: self.target_epsilon,
            // FedPM's global model is mask probabilities, which its own decoding keeps in
            // [MASK_LOW, MASK_HIGH] (KLMS's KL against them would be infinite at 0 or 1).
            domain: matches!(config.model, ModelSection::Fedpm { .. })
                .then_some((MASK_LOW, MASK_HIGH)),
        }
    }
}
