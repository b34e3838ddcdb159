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
use fedshard_protocol::uplink::{Compressor, Host};
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
    /// SCAFFOLD's control variates (docs/algorithms.md §12).
    pub scaffold: bool,
}

/// What [`Policies::check`] settled: the run's aggregator, the accountant of a private run, and
/// how each client of a secure one premultiplies its change.
#[derive(Debug)]
pub struct Checked {
    pub aggregator: Arc<dyn Aggregator>,
    pub privacy: Option<(PrivacySettings, Accountant)>,
    pub secure: Option<(SecureSettings, SumWeight)>,
}

const WIDTH: &str = "width slicing (`federation.strategy` heterofl, fedrolex or fjord)";
const SECURE_PRIVATE_WIDTH: &str = "a private secure round releases a weight-space sum, and a \
                                    width round's secure sum runs over the union of the kept \
                                    units, not built as a release: use `[privacy]` without \
                                    `[secure_aggregation]`, or secure aggregation alone";
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
const SCAFFOLD: &str = "SCAFFOLD (`federation.scaffold`)";
const SCAFFOLD_WHOLE: &str = "SCAFFOLD's (x − y)/(K η) estimates the gradient of every weight, \
                              and a sharded or width-sliced client moves only its sub-model's \
                              coordinates, so its variate would be wrong outside them \
                              (docs/algorithms.md §12)";
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
            scaffold: config.scaffold,
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
        if self.scaffold {
            self.check_scaffold(aggregator.as_ref())?;
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
    /// blocks or as weight-space changes ([`crate::round::fold`], [`crate::round::weight_change`]),
    /// or sums them securely over the union of the kept units ([`crate::secure::fold_sum`]), and
    /// its message may be SignSGD's signs (with KLMS or without); a private secure sum and the
    /// compressors whose memory or model a slice does not fit are refused with the reason.
    fn check_width(&self, width: WidthStrategy) -> Result<()> {
        let refuse = |policy, name: String, why| Error::Unsupported {
            policy,
            name,
            schedule: WIDTH,
            why,
        };
        if self.secure.is_some() && self.privacy.is_some() {
            return Err(refuse(
                Policy::Strategy,
                width.to_string(),
                SECURE_PRIVATE_WIDTH,
            ));
        }
        let why = match self.compressor.host() {
            // The message is the task's sliced tensors, decoded against them; SignSGD's prior
            // is a fair coin and KLMS's adaptive block ends are kept per message length.
            None | Some(Host::Signsgd) => return Ok(()),
            Some(Host::Qsgd) => {
                "QSGD keeps each value's symbol counts (its KLMS prior) at the value's place in \
                 the whole model's layout, and a sliced task's message is not laid out so: use \
                 `identity`, `signsgd` or `signsgd-klms` (docs/algorithms.md §8.3)"
            }
            Some(Host::Fedpm | Host::Sgld) => {
                "FedPM trains mask probabilities and SGLD takes a step of the whole model's \
                 gradient, neither a sliced sub-model: use `identity`, `signsgd` or \
                 `signsgd-klms` (docs/algorithms.md §8.3)"
            }
        };
        Err(refuse(Policy::Compressor, self.compressor.to_string(), why))
    }

    /// SCAFFOLD needs clients that train the whole dense model, one round's fresh changes, an
    /// aggregator that folds every accepted update, and variates that travel in the clear
    /// beside an uncompressed update; everything else is refused with the reason.
    fn check_scaffold(&self, aggregator: &dyn Aggregator) -> Result<()> {
        let refuse = |policy, name: String, why| Error::Unsupported {
            policy,
            name,
            schedule: SCAFFOLD,
            why,
        };
        if let Some(width) = self.width {
            return Err(refuse(Policy::Strategy, width.to_string(), SCAFFOLD_WHOLE));
        }
        if let Some(layer) = self.sharded_layers.first() {
            return Err(refuse(Policy::ShardedLayers, layer.clone(), SCAFFOLD_WHOLE));
        }
        if let Schedule::Buffered(_) = self.schedule {
            return Err(refuse(
                Policy::Mode,
                "async".into(),
                "the server variate moves by the mean Δc_i of clients that trained from it; a \
                 buffer's stale updates were corrected by older variates: use `sync`",
            ));
        }
        if self.secure.is_some() {
            return Err(refuse(
                Policy::SecureAggregation,
                "secure_aggregation".into(),
                "each client's Δc_i (its mean corrected gradient) would travel in the clear \
                 beside its masked update; a secure sum of both is not built",
            ));
        }
        if self.privacy.is_some() {
            return Err(refuse(
                Policy::Privacy,
                "privacy".into(),
                "each client's Δc_i is its mean gradient, neither clipped nor noised, which the \
                 accountant's ε does not bound",
            ));
        }
        if self.compressor != Compressor::Identity {
            return Err(refuse(
                Policy::Compressor,
                self.compressor.to_string(),
                "the compressors code the update alone and their composition with SCAFFOLD's \
                 variates is not built: use `identity`",
            ));
        }
        if aggregator.robust() {
            return Err(refuse(
                Policy::Aggregator,
                aggregator.name().to_string(),
                "it discards or down-weights the updates it suspects, while the server variate \
                 would still move by every client's Δc_i: use `fedavg`",
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
#[path = "policies_tests.rs"]
mod tests;
