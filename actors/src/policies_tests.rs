//! The rules of `policies.rs`, each refusal by its reason.

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
        scaffold: false,
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

/// A width-sliced run takes synchronous, over-committed and buffered rounds, DP-FedAvg, a
/// secure sum and SignSGD's uplinks; a private secure sum and the other compressors are refused
/// by the policy that asks for them.
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
        Policies {
            secure: Some(SETTINGS),
            ..width.clone()
        },
        Policies {
            compressor: Compressor::Signsgd,
            ..width.clone()
        },
        Policies {
            compressor: Compressor::SignsgdKlms,
            ..width.clone()
        },
    ] {
        assert!(accepted.check().is_ok(), "{accepted:?}");
    }
    let private_secure = Policies {
        secure: Some(SecureSettings {
            clip_norm: None,
            ..SETTINGS
        }),
        privacy: Some(private()),
        selector: SelectorName::Poisson,
        aggregator: AggregatorName::Uniform,
        ..width.clone()
    };
    assert_eq!(refused(private_secure), Policy::Strategy);
    for compressor in [
        Compressor::Qsgd,
        Compressor::QsgdElias,
        Compressor::QsgdKlms,
        Compressor::Fedpm,
        Compressor::Sgld,
    ] {
        let policies = Policies {
            compressor,
            ..width.clone()
        };
        assert_eq!(refused(policies), Policy::Compressor, "{compressor}");
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

/// SCAFFOLD runs with plain dense rounds (over-committed too) and any aggregator that folds
/// every update; each thing it cannot combine with is refused by its policy.
#[test]
fn scaffold_refuses_what_would_make_its_variates_wrong_or_leak() {
    let plain = Policies {
        secure: None,
        scaffold: true,
        ..secure()
    };
    assert!(plain.check().is_ok());
    let over = Policies {
        schedule: Schedule::Rounds {
            over_commit: Some(1.5),
        },
        ..plain.clone()
    };
    assert!(over.check().is_ok());
    let policy = |p: Policies| match p.check() {
        Err(Error::Unsupported {
            policy, schedule, ..
        }) => {
            assert_eq!(schedule, SCAFFOLD);
            policy
        }
        other => panic!("{other:?}"),
    };
    let cases = [
        (
            Policies {
                width: Some(WidthStrategy::HeteroFl),
                ..plain.clone()
            },
            Policy::Strategy,
        ),
        (
            Policies {
                sharded_layers: vec!["fc0.weight".into()],
                ..plain.clone()
            },
            Policy::ShardedLayers,
        ),
        (
            Policies {
                schedule: Schedule::Buffered(AsyncConfig {
                    concurrency: 2,
                    buffer: 2,
                    staleness: Staleness::Constant,
                }),
                ..plain.clone()
            },
            Policy::Mode,
        ),
        (
            Policies {
                secure: Some(SETTINGS),
                ..plain.clone()
            },
            Policy::SecureAggregation,
        ),
        (
            Policies {
                privacy: Some(private()),
                aggregator: AggregatorName::Uniform,
                ..plain.clone()
            },
            Policy::Privacy,
        ),
        (
            Policies {
                compressor: Compressor::Qsgd,
                ..plain.clone()
            },
            Policy::Compressor,
        ),
        (
            Policies {
                aggregator: AggregatorName::Median,
                ..plain.clone()
            },
            Policy::Aggregator,
        ),
    ];
    for (policies, expected) in cases {
        assert_eq!(policy(policies), expected);
    }
}
