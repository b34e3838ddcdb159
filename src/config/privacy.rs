//! `[privacy]`: client-level differential privacy (DP-FedAvg with its accountant;
//! docs/privacy.md). The section is checked on its own ranges, then against the federation it
//! protects: a run whose client sampling the accountant cannot bound is refused here, before
//! anything starts, never run with a wrong ε.

use super::{Config, ModelSection, Schedule, check};
use anyhow::bail;
use fedshard_actors::privacy::{Clipping, PrivacySettings};
use fedshard_protocol::uplink::fedpm::{MASK_HIGH, MASK_LOW};
use fedshard_strategies::aggregation::AggregatorName;
use fedshard_strategies::privacy::{AdaptiveClip, Sampling, update_noise_multiplier};
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
    /// The section's ranges, then what it needs of the federation.
    pub fn validate(&self, config: &Config) -> anyhow::Result<()> {
        positive("privacy.noise_multiplier", self.noise_multiplier)?;
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
        accountable(config)?;
        let settings = self.settings(config);
        if let Clipping::Adaptive { rule, .. } = settings.clipping {
            positive("privacy.clipped_count_stddev", rule.count_stddev)?;
            if update_noise_multiplier(self.noise_multiplier, rule.count_stddev).is_err() {
                bail!(
                    "field `privacy.clipped_count_stddev`: expected more than half of \
                     noise_multiplier ({}) so that the count leaves noise for the updates \
                     (Andrew et al. 2021: z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)), found {}",
                    self.noise_multiplier / 2.0,
                    rule.count_stddev
                );
            }
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

/// Refuses a federation whose releases the accountant cannot bound: it knows uniform samples
/// of fixed size (`uniform`), Poisson samples of one rate (`poisson`) and async buffers counted
/// without amplification, and DP-FedAvg's equal weights over a fixed denominator (`uniform`
/// aggregator).
fn accountable(config: &Config) -> anyhow::Result<()> {
    let f = &config.federation;
    if f.selector == SelectorName::OptimalPartial {
        bail!(
            "field `federation.selector`: expected `uniform` or `poisson` with [privacy], found \
             `optimal-partial`: its inclusion probabilities are computed from the clients' \
             update norms (data the guarantee protects) and differ from client to client, so no \
             accountant here can bound the privacy of its rounds"
        );
    }
    if f.aggregator != AggregatorName::Uniform {
        bail!(
            "field `federation.aggregator`: expected `uniform` with [privacy] (DP-FedAvg weighs \
             every clipped update equally over the expected number of updates, so one client's \
             influence is bounded), found `{}`",
            f.aggregator
        );
    }
    if let Schedule::Sync {
        over_commit: Some(c),
    } = f.schedule
    {
        bail!(
            "field `federation.over_commit`: expected none with [privacy], found {c}: the first \
             updates to arrive are not the uniform sample the accountant bounds"
        );
    }
    if let Schedule::Async { .. } = f.schedule
        && f.selector != SelectorName::Uniform
    {
        bail!(
            "field `federation.selector`: expected `uniform` in async mode with [privacy] (idle \
             clients are handed work one at a time and buffers are accounted without \
             sampling), found `{}`",
            f.selector
        );
    }
    Ok(())
}
