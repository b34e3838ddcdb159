//! Client-level differential privacy in the round engine (DP-FedAvg, McMahan et al. 2018;
//! docs/privacy.md): what a private run was configured with ([`PrivacySettings`]), what each
//! release spent ([`PrivacyRecord`]), and the run's total for `summary.json`
//! ([`PrivacySummary`]). The fold itself is [`crate::round::Private`], a wrapper over the run's
//! aggregator; the accountant and the clipping arithmetic are `fedshard_strategies::privacy`.

use crate::error::{Error, Policy, Result};
use crate::record::RoundRecord;
use crate::schedule::Schedule;
use fedshard_strategies::privacy::{Accountant, AdaptiveClip, Sampling, update_noise_multiplier};
use fedshard_strategies::selection::SelectorName;
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
    /// The range every value of the model must stay in (FedPM's mask probabilities: `[0, 1]`),
    /// or `None`. The noised model is projected back into it, a post-processing of the release
    /// that costs no privacy.
    pub domain: Option<(f32, f32)>,
}

impl PrivacySettings {
    /// The accountant of the run's releases.
    pub fn accountant(&self) -> Result<Accountant> {
        Accountant::new(self.sampling, self.noise_multiplier).map_err(Error::Privacy)
    }

    /// The accountant of a private run, after checking that the rest of the run is what it
    /// accounts for: a sample drawn the way the settings say, by a selector whose probabilities
    /// do not depend on the clients' data. The one place these rules are written: the engine
    /// asks it when it is built, the config when it is validated
    /// ([`crate::policies::Policies::check`], which also asks [`crate::round::Private::wraps`]
    /// whether the aggregator weighs updates as DP-FedAvg does).
    pub(crate) fn checked_accountant(
        &self,
        schedule: Schedule,
        selector: SelectorName,
    ) -> Result<Accountant> {
        let settings = self;
        const PRIVACY: &str = "differential privacy (`[privacy]`)";
        let refuse = |policy, name: String, why| Error::Unsupported {
            policy,
            name,
            schedule: PRIVACY,
            why,
        };
        match (schedule, settings.sampling) {
            (
                Schedule::Rounds {
                    over_commit: Some(c),
                },
                _,
            ) => {
                return Err(refuse(
                    Policy::OverCommit,
                    c.to_string(),
                    "the first updates to arrive are not a uniform sample the accountant can bound",
                ));
            }
            (Schedule::Buffered(_), Sampling::None) | (Schedule::Rounds { .. }, _) => {}
            (Schedule::Buffered(_), _) => {
                return Err(refuse(
                    Policy::Sampling,
                    format!("{:?}", settings.sampling),
                    "an async buffer holds whoever answered first: it is accounted without sampling",
                ));
            }
        }
        if let Schedule::Buffered(_) = schedule
            && selector != SelectorName::Uniform
        {
            return Err(refuse(
                Policy::Selector,
                selector.to_string(),
                "in async mode idle clients are handed work one at a time and buffers are \
                 accounted without sampling: use `uniform`",
            ));
        }
        if selector.build().needs_update_norms() {
            return Err(refuse(
                Policy::Selector,
                selector.to_string(),
                "its inclusion probabilities depend on the clients' update norms (data the \
                 guarantee protects) and differ from client to client, so the accountant cannot \
                 bound its rounds",
            ));
        }
        settings.update_noise_multiplier()?;
        settings.accountant()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{AsyncConfig, Staleness};

    /// The engine refuses, by policy, what the accountant cannot bound even when the settings
    /// did not come through the config: over-commitment, a sampled async buffer, an async
    /// selector other than `uniform`, a selector whose probabilities depend on update norms, and
    /// a count noise that leaves none for the updates.
    #[test]
    fn the_engine_refuses_what_the_accountant_cannot_bound() {
        let settings = PrivacySettings {
            noise_multiplier: 1.0,
            clipping: Clipping::Fixed { norm: 1.0 },
            delta: 1e-5,
            sampling: Sampling::Poisson { rate: 0.5 },
            expected_updates: 1.0,
            target_epsilon: None,
            domain: None,
        };
        let uniform = SelectorName::Uniform;
        let rounds = Schedule::Rounds { over_commit: None };
        assert!(settings.checked_accountant(rounds, uniform).is_ok());
        let policy = |r: Result<Accountant>| match r {
            Err(Error::Unsupported { policy, .. }) => policy,
            other => panic!("{other:?}"),
        };
        let over = Schedule::Rounds {
            over_commit: Some(1.5),
        };
        assert_eq!(
            policy(settings.checked_accountant(over, uniform)),
            Policy::OverCommit
        );
        let buffered = Schedule::Buffered(AsyncConfig {
            concurrency: 2,
            buffer: 1,
            staleness: Staleness::Constant,
        });
        assert_eq!(
            policy(settings.checked_accountant(buffered, uniform)),
            Policy::Sampling
        );
        let unsampled = PrivacySettings {
            sampling: Sampling::None,
            ..settings
        };
        assert!(unsampled.checked_accountant(buffered, uniform).is_ok());
        assert_eq!(
            policy(unsampled.checked_accountant(buffered, SelectorName::Poisson)),
            Policy::Selector
        );
        assert_eq!(
            policy(settings.checked_accountant(rounds, SelectorName::OptimalPartial)),
            Policy::Selector
        );
        let adaptive = PrivacySettings {
            clipping: Clipping::Adaptive {
                initial: 1.0,
                rule: AdaptiveClip {
                    quantile: 0.5,
                    learning_rate: 0.2,
                    count_stddev: 0.4,
                },
            },
            ..settings
        };
        assert!(matches!(
            adaptive.checked_accountant(rounds, uniform),
            Err(Error::Privacy(_))
        ));
    }
}
