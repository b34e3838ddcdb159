//! What the round engine cannot combine, written once: the schedule against the aggregator and
//! the selector, secure aggregation against everything a sum cannot serve, and differential
//! privacy against what its accountant cannot bound (`PrivacySettings::checked_accountant`) and
//! the robust aggregators it would silently replace.
//!
//! [`Policies`] is the run's policies as plain names and settings, so that the rules can be
//! asked without starting anything: [`crate::engine::Engine::new`] asks them before a client
//! trains, and a program that reads a config asks them when it validates it, then names its own
//! field for each [`Error::Unsupported`] by its [`Policy`].

use crate::error::{Error, Policy, Result};
use crate::privacy::PrivacySettings;
use crate::round::Private;
use crate::schedule::{AsyncConfig, Schedule};
use crate::secure::SecureSettings;
use crate::server::RuntimeConfig;
use fedshard_protocol::shard_plan::Sharding;
use fedshard_protocol::uplink::Compressor;
use fedshard_secagg::UplinkCoding;
use fedshard_strategies::aggregation::{Aggregator, AggregatorName, SumWeight};
use fedshard_strategies::privacy::Accountant;
use fedshard_strategies::selection::SelectorName;
use fedshard_strategies::sharding::width::WidthStrategy;
use std::sync::Arc;

/// The policies of a run that must agree with one another.
#[derive(Debug, Clone, PartialEq)]
pub struct Policies {
    pub schedule: Schedule,
    pub aggregator: AggregatorName,
    pub selector: SelectorName,
    pub compressor: Compressor,
    /// The server's bound on each update's norm, if any.
    pub max_update_norm: Option<f64>,
    /// The layers sent as factor columns (none: the model is sent dense).
    pub sharded_layers: Vec<String>,
    /// The width strategy that slices the model, if one does (docs/algorithms.md §8).
    pub width: Option<WidthStrategy>,
    pub privacy: Option<PrivacySettings>,
    pub secure: Option<SecureSettings>,
}

/// What [`Policies::check`] settled: the run's aggregator, the accountant of a private run, and
/// how each client of a secure one premultiplies its change.
#[derive(Debug)]
pub struct Checked {
    pub aggregator: Arc<dyn Aggregator>,
    pub privacy: Option<(PrivacySettings, Accountant)>,
    pub secure: Option<(SecureSettings, SumWeight)>,
}

const WIDTH: &str = "width slicing (`federation.strategy` heterofl or fedrolex)";
const SECURE_NOT_YET: &str = "a secure sum over the union of the clients' kept units is not \
                              built yet: use a spectral strategy with `[secure_aggregation]`";
const FEDBUFF: &str = "buffered asynchronous aggregation (`mode = \"async\"`)";
const SECURE: &str = "secure aggregation (`[secure_aggregation]`)";
const PRIVATE: &str = "differential privacy (`[privacy]`)";
const ROBUST_PRIVATE: &str = "it is a robust statistic of the individual updates \
                              (docs/algorithms.md §9), and DP-FedAvg folds its own clipped, \
                              noised mean in its place, with noise that bounds one client's \
                              influence on a sum, not on a median or a Krum selection: use \
                              `uniform`";
const BUFFER_TOO_SMALL: &str = "it declines an aggregate of fewer results than its paper assumes \
                                (Krum: more than 2f + 2 and at least m; Bulyan: 4f + 3), and \
                                every aggregate holds `federation.buffer` updates, fewer than \
                                that, so no version would ever be applied: raise `buffer` or \
                                lower f";
const SECURE_PRIVATE: &str =
    "secure aggregation with differential privacy (`[secure_aggregation]` and `[privacy]`)";

impl Policies {
    /// The policies of `config`, whose clients a `selector` picks.
    pub fn of(config: &RuntimeConfig, selector: SelectorName) -> Self {
        Self {
            schedule: Schedule::of(config),
            aggregator: config.aggregator,
            selector,
            compressor: config.compressor,
            max_update_norm: config.max_update_norm,
            sharded_layers: config
                .sharding
                .as_ref()
                .map(|s| s.spectral_layers().to_vec())
                .unwrap_or_default(),
            width: match &config.sharding {
                Some(Sharding::Width(policy)) => Some(policy.strategy),
                _ => None,
            },
            privacy: config.privacy,
            secure: config.secure,
        }
    }

    /// Refuses a combination the engine cannot run, naming the policy
    /// ([`Error::Unsupported`]), a secure-aggregation setting out of its range, or privacy
    /// settings the accountant refuses.
    pub fn check(&self) -> Result<Checked> {
        let aggregator = self
            .aggregator
            .build()
            .map_err(|source| Error::Aggregator {
                name: self.aggregator.as_str(),
                source,
            })?;
        self.check_with(aggregator.into())
    }

    /// [`Policies::check`] with `aggregator` in place of the one [`Policies::aggregator`]
    /// names: a program's own [`Aggregator`] (`Federation::aggregator`) meets the same rules as
    /// a shipped one, and a refusal names it by [`Aggregator::name`].
    pub fn check_with(&self, aggregator: Arc<dyn Aggregator>) -> Result<Checked> {
        if let Some(width) = self.width {
            self.check_width(width)?;
        }
        if let Schedule::Buffered(_) = self.schedule {
            self.check_buffered(aggregator.as_ref())?;
        }
        let secure = match self.secure {
            Some(settings) => Some((settings, self.check_secure(&settings, aggregator.as_ref())?)),
            None => None,
        };
        let privacy = match self.privacy {
            Some(settings) => {
                let accountant = settings.checked_accountant(self.schedule, self.selector)?;
                let refuse = |why| Error::Unsupported {
                    policy: Policy::Aggregator,
                    name: aggregator.name().to_string(),
                    schedule: PRIVATE,
                    why,
                };
                // Named before the wrapper's own answer, which is about weights: a robust
                // aggregator has none to give.
                if aggregator.robust() {
                    return Err(refuse(ROBUST_PRIVATE));
                }
                Private::wraps(aggregator.as_ref()).map_err(refuse)?;
                Some((settings, accountant))
            }
            None => None,
        };
        Ok(Checked {
            aggregator,
            privacy,
            secure,
        })
    }

    /// A width-sliced round folds each update's values at the coordinates its slice kept, as
    /// blocks or as weight-space changes ([`crate::round::fold`], [`crate::round::weight_change`]);
    /// a secure sum over the union of the kept units, or a compressed message of a sliced
    /// model, is refused until it is built and tested.
    fn check_width(&self, width: WidthStrategy) -> Result<()> {
        let refuse = |policy, name: String, why| Error::Unsupported {
            policy,
            name,
            schedule: WIDTH,
            why,
        };
        if self.secure.is_some() {
            return Err(refuse(Policy::Strategy, width.to_string(), SECURE_NOT_YET));
        }
        if self.compressor != Compressor::Identity {
            return Err(refuse(
                Policy::Compressor,
                self.compressor.to_string(),
                "the compressors code a sliced model's message untested (their server-side \
                 memory assumes one shape per version): use `identity` (docs/algorithms.md §8.3)",
            ));
        }
        Ok(())
    }

    /// FedBuff: idle clients are drawn one at a time, and the buffer is folded with weights
    /// that can scale staleness-weighted changes, by an aggregator that folds a buffer of its
    /// size ([`Aggregator::min_results`]).
    fn check_buffered(&self, aggregator: &dyn Aggregator) -> Result<()> {
        let refuse = |policy, name: String, why| Error::Unsupported {
            policy,
            name,
            schedule: FEDBUFF,
            why,
        };
        if self.selector.build().needs_update_norms() {
            return Err(refuse(
                Policy::Selector,
                self.selector.to_string(),
                "it needs every client's update norm at once, and idle clients are drawn one at \
                 a time (as `uniform` draws them)",
            ));
        }
        if !aggregator.folds_changes() {
            return Err(refuse(
                Policy::Aggregator,
                aggregator.name().to_string(),
                "its weights cannot scale the staleness-weighted changes of updates trained from \
                 different model versions: use `fedavg` or `uniform`",
            ));
        }
        if let Schedule::Buffered(AsyncConfig { buffer, .. }) = self.schedule
            && buffer < aggregator.min_results()
        {
            return Err(refuse(
                Policy::Aggregator,
                aggregator.name().to_string(),
                BUFFER_TOO_SMALL,
            ));
        }
        Ok(())
    }

    /// A secure round folds one sum of one session: every policy that needs an update alone, a
    /// weight known only after the sum, or an uplink that does not add up is refused, and the
    /// settings are checked on their own ([`SecureSettings::validate`]).
    fn check_secure(
        &self,
        settings: &SecureSettings,
        aggregator: &dyn Aggregator,
    ) -> Result<SumWeight> {
        let refuse = |policy, name: String, why| Error::Unsupported {
            policy,
            name,
            schedule: SECURE,
            why,
        };
        match self.schedule {
            Schedule::Buffered(_) => {
                return Err(refuse(
                    Policy::Mode,
                    "async".into(),
                    "a buffer folds updates of several model versions one by one as they \
                     arrive; a secure sum needs one session of clients that trained the same \
                     version: use `sync`",
                ));
            }
            Schedule::Rounds {
                over_commit: Some(c),
            } => {
                return Err(refuse(
                    Policy::OverCommit,
                    c.to_string(),
                    "a session cannot close at its first m inputs (its dropouts are unmasked, \
                     not cut)",
                ));
            }
            Schedule::Rounds { over_commit: None } => {}
        }
        if self.selector.build().needs_update_norms() {
            return Err(refuse(
                Policy::Selector,
                self.selector.to_string(),
                "it picks who uploads from every client's update norm, which a secure round \
                 never reveals: use `uniform` or `poisson`",
            ));
        }
        let weighting = aggregator
            .sum_weight()
            .map_err(|why| refuse(Policy::Aggregator, aggregator.name().to_string(), why))?;
        if let Some(bound) = self.max_update_norm {
            return Err(refuse(
                Policy::MaxUpdateNorm,
                bound.to_string(),
                "the server never sees an update to measure; `secure_aggregation.clip_norm` \
                 bounds each client's contribution instead",
            ));
        }
        if let Err(why) = summable(self.compressor) {
            return Err(refuse(Policy::Compressor, self.compressor.to_string(), why));
        }
        let dp_clip = self.privacy.map(|p| p.clip_norm(&[]));
        settings.validate(dp_clip)?;
        if dp_clip.is_some() && !self.sharded_layers.is_empty() {
            return Err(Error::Unsupported {
                policy: Policy::ShardedLayers,
                name: format!("{:?}", self.sharded_layers),
                schedule: SECURE_PRIVATE,
                why: "DP-FedAvg bounds each change in weight space, and a secure sum of a \
                      sharded layer is over its factor columns",
            });
        }
        Ok(weighting)
    }
}

/// Whether a sum can carry `compressor`'s uplink, or why not: only the identity uplink (dense
/// f32 changes, encoded in fixed point) is wired, and KLMS's index coding and QSGD's Elias code
/// cannot be summed at all ([`UplinkCoding::check_summable`]).
fn summable(compressor: Compressor) -> std::result::Result<(), &'static str> {
    let coding = match compressor {
        Compressor::Identity => return Ok(()),
        Compressor::QsgdKlms
        | Compressor::SignsgdKlms
        | Compressor::FedpmKlms
        | Compressor::SgldKlms => UplinkCoding::KlmsIndex,
        Compressor::QsgdElias => UplinkCoding::QsgdElias,
        Compressor::Qsgd | Compressor::Signsgd | Compressor::Fedpm | Compressor::Sgld => {
            return Err(
                "its values would sum (docs/secagg.md, \"What composes\"), but only the \
                 identity uplink is wired to secure aggregation: use `identity`",
            );
        }
    };
    coding.check_summable().map_err(|e| match e {
        fedshard_secagg::Error::NotSummable { why, .. } => why,
        _ => "its coding cannot be summed",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::Clipping;
    use crate::schedule::{AsyncConfig, Staleness};
    use crate::secure::MIN_SCALE;
    use fedshard_strategies::privacy::Sampling;
    use fedshard_strategies::sharding::width::WidthStrategy;

    const SETTINGS: SecureSettings = SecureSettings {
        clip_norm: Some(10.0),
        scale: 65536.0,
        threshold: 0.6,
        degree: None,
    };

    /// A secure synchronous run that every rule accepts.
    fn secure() -> Policies {
        Policies {
            schedule: Schedule::Rounds { over_commit: None },
            aggregator: AggregatorName::Fedavg,
            selector: SelectorName::Uniform,
            compressor: Compressor::Identity,
            max_update_norm: None,
            sharded_layers: vec![],
            width: None,
            privacy: None,
            secure: Some(SETTINGS),
        }
    }

    fn private() -> PrivacySettings {
        PrivacySettings {
            noise_multiplier: 1.0,
            clipping: Clipping::Fixed { norm: 0.5 },
            delta: 1e-5,
            sampling: Sampling::Poisson { rate: 0.5 },
            expected_updates: 2.0,
            target_epsilon: None,
            domain: None,
        }
    }

    fn refused(policies: Policies) -> Policy {
        match policies.check() {
            Err(Error::Unsupported { policy, .. }) => policy,
            other => panic!("{other:?}"),
        }
    }

    /// A width-sliced run takes synchronous, over-committed and buffered rounds and DP-FedAvg;
    /// a secure sum or a compressed message is refused by the policy that asks for it.
    #[test]
    fn width_slicing_refuses_what_it_cannot_fold_yet() {
        let width = Policies {
            width: Some(WidthStrategy::FedRolex),
            secure: None,
            ..secure()
        };
        assert!(width.check().is_ok());
        let over_committed = Policies {
            schedule: Schedule::Rounds {
                over_commit: Some(1.5),
            },
            ..width.clone()
        };
        assert!(over_committed.check().is_ok());
        let buffered = Schedule::Buffered(AsyncConfig {
            concurrency: 2,
            buffer: 2,
            staleness: Staleness::Constant,
        });
        for accepted in [
            Policies {
                schedule: buffered,
                ..width.clone()
            },
            Policies {
                privacy: Some(private()),
                selector: SelectorName::Poisson,
                aggregator: AggregatorName::Uniform,
                ..width.clone()
            },
        ] {
            assert!(accepted.check().is_ok(), "{accepted:?}");
        }
        let cases = [
            (
                Policies {
                    secure: Some(SETTINGS),
                    ..width.clone()
                },
                Policy::Strategy,
            ),
            (
                Policies {
                    compressor: Compressor::Qsgd,
                    ..width.clone()
                },
                Policy::Compressor,
            ),
        ];
        for (policies, policy) in cases {
            assert_eq!(refused(policies), policy);
        }
    }

    /// Each thing a sum cannot serve is refused by its policy: an async buffer, an
    /// over-committed round (the engine used to ignore it), a two-phase selector, weights known
    /// only after the sum, a bound on each update's norm (ignored too), an uplink that does not
    /// add up, and DP-FedAvg's weight-space clip over factor columns.
    #[test]
    fn secure_aggregation_refuses_what_a_sum_cannot_serve() {
        assert!(secure().check().is_ok_and(|c| c.secure.is_some()));
        let buffered = Schedule::Buffered(AsyncConfig {
            concurrency: 2,
            buffer: 2,
            staleness: Staleness::Constant,
        });
        let cases = [
            (
                Policies {
                    schedule: buffered,
                    ..secure()
                },
                Policy::Mode,
            ),
            (
                Policies {
                    schedule: Schedule::Rounds {
                        over_commit: Some(1.5),
                    },
                    ..secure()
                },
                Policy::OverCommit,
            ),
            (
                Policies {
                    selector: SelectorName::OptimalPartial,
                    aggregator: AggregatorName::InverseProbability,
                    ..secure()
                },
                Policy::Selector,
            ),
            (
                Policies {
                    aggregator: AggregatorName::Fesc,
                    ..secure()
                },
                Policy::Aggregator,
            ),
            (
                Policies {
                    max_update_norm: Some(5.0),
                    ..secure()
                },
                Policy::MaxUpdateNorm,
            ),
            (
                Policies {
                    compressor: Compressor::SignsgdKlms,
                    ..secure()
                },
                Policy::Compressor,
            ),
            (
                Policies {
                    compressor: Compressor::Qsgd,
                    ..secure()
                },
                Policy::Compressor,
            ),
            (
                Policies {
                    aggregator: AggregatorName::Uniform,
                    sharded_layers: vec!["fc1.weight".into()],
                    width: None,
                    privacy: Some(private()),
                    secure: Some(SecureSettings {
                        clip_norm: None,
                        ..SETTINGS
                    }),
                    ..secure()
                },
                Policy::ShardedLayers,
            ),
        ];
        for (policies, policy) in cases {
            assert_eq!(refused(policies.clone()), policy, "{policies:?}");
        }
    }

    /// A robust aggregator (docs/algorithms.md §9) runs in rounds, over-committed or
    /// width-sliced, and on a buffer that holds as many updates as it folds; a secure sum,
    /// differential privacy and a smaller buffer are refused, each naming the aggregator and
    /// saying why.
    #[test]
    fn robust_aggregators_refuse_sums_privacy_and_small_buffers() {
        use fedshard_strategies::aggregation::{Bulyan, Krum, TrimFraction, TrimmedMean};
        use std::num::NonZeroUsize;
        let why = |policies: Policies| match policies.check() {
            Err(Error::Unsupported {
                policy: Policy::Aggregator,
                why,
                ..
            }) => why,
            other => panic!("{policies:?}: {other:?}"),
        };
        let buffered = |buffer| {
            Schedule::Buffered(AsyncConfig {
                concurrency: 2,
                buffer,
                staleness: Staleness::Constant,
            })
        };
        let krum = AggregatorName::Krum(Krum {
            f: 1,
            m: NonZeroUsize::new(2).unwrap(),
        });
        let robust = [
            AggregatorName::Median,
            AggregatorName::TrimmedMean(TrimmedMean {
                beta: TrimFraction::new(0.1).unwrap(),
            }),
            krum,
            AggregatorName::Bulyan(Bulyan { f: 1 }),
        ];
        for aggregator in robust {
            let plain = Policies {
                aggregator,
                secure: None,
                ..secure()
            };
            let accepted = [
                plain.clone(),
                Policies {
                    schedule: Schedule::Rounds {
                        over_commit: Some(1.5),
                    },
                    ..plain.clone()
                },
                Policies {
                    width: Some(WidthStrategy::HeteroFl),
                    ..plain.clone()
                },
                Policies {
                    // Bulyan with f = 1 folds 7 updates, Krum 5.
                    schedule: buffered(7),
                    ..plain.clone()
                },
            ];
            for policies in accepted {
                assert!(policies.check().is_ok(), "{policies:?}");
            }
            let secure = Policies {
                aggregator,
                ..secure()
            };
            assert!(why(secure).contains("only their sum"), "{aggregator}");
            let private = Policies {
                privacy: Some(private()),
                selector: SelectorName::Poisson,
                ..plain.clone()
            };
            assert_eq!(why(private), ROBUST_PRIVATE, "{aggregator}");
        }
        let small = |aggregator, buffer| Policies {
            aggregator,
            schedule: buffered(buffer),
            secure: None,
            ..secure()
        };
        assert_eq!(why(small(krum, 4)), BUFFER_TOO_SMALL);
        assert!(small(krum, 5).check().is_ok());
        assert_eq!(why(small(robust[3], 6)), BUFFER_TOO_SMALL);
    }

    /// The settings' own ranges: one clip norm given once, a scale at which the model moves,
    /// and secagg's threshold, degree and fixed point, each named.
    #[test]
    fn secure_settings_are_checked_on_their_own_ranges() {
        let field = |settings: SecureSettings, dp_clip| match settings.validate(dp_clip) {
            Err(Error::Invalid { field, .. }) => field.to_string(),
            Err(Error::SecureAggregation(fedshard_secagg::Error::OutOfRange { param, .. })) => {
                param.to_string()
            }
            other => panic!("{other:?}"),
        };
        assert!(SETTINGS.validate(None).is_ok());
        let unclipped = SecureSettings {
            clip_norm: None,
            ..SETTINGS
        };
        assert!(unclipped.validate(Some(0.5)).is_ok());
        let clip = "secure_aggregation.clip_norm";
        assert_eq!(field(unclipped, None), clip);
        assert_eq!(field(SETTINGS, Some(0.5)), clip);
        let negative = SecureSettings {
            clip_norm: Some(-1.0),
            ..SETTINGS
        };
        assert_eq!(field(negative, None), clip);
        for scale in [1e-30, 1.0, MIN_SCALE / 2.0, f64::INFINITY, f64::NAN] {
            let coarse = SecureSettings { scale, ..SETTINGS };
            assert_eq!(field(coarse, None), "secure_aggregation.scale", "{scale}");
        }
        let huge = SecureSettings {
            scale: 1e50,
            ..SETTINGS
        };
        assert_eq!(field(huge, None), "fixed-point range × scale");
        for threshold in [0.5, 0.2, 1.5] {
            let minority = SecureSettings {
                threshold,
                ..SETTINGS
            };
            assert_eq!(field(minority, None), "threshold", "{threshold}");
        }
        for degree in [5, 1_000_000] {
            let odd = SecureSettings {
                degree: Some(degree),
                ..SETTINGS
            };
            assert_eq!(field(odd, None), "graph degree", "{degree}");
        }
    }
}
