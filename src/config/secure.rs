//! `[secure_aggregation]`: the server folds each round from the sum of its updates alone
//! (SecAgg+; docs/secagg.md). The section is checked on its own ranges, then against the
//! federation: what a sum cannot serve (a non-linear uplink coding, weights known only after
//! the sum, a per-update check on the server) is refused here, before anything starts. With
//! `[privacy]` the clients clip to DP-FedAvg's clip norm and the server noises the sum.

use super::{Config, Schedule, check};
use anyhow::bail;
use fedshard_actors::secure::SecureSettings;
use fedshard_protocol::uplink::Compressor;
use fedshard_secagg::UplinkCoding;
use fedshard_strategies::selection::SelectorName;
use serde::{Deserialize, Serialize};

/// `[secure_aggregation]` as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecureSection {
    /// Each client scales its change down to this L2 norm before encoding (the fixed-point
    /// range is `[−clip_norm, clip_norm]`). Omitted with `[privacy]`, whose clip it is then.
    pub clip_norm: Option<f64>,
    /// Fixed-point steps per unit (default 2¹⁶).
    pub scale: Option<f64>,
    /// `t` as a fraction of the holders of each secret, in (0.5, 1] (default 0.6).
    pub threshold: Option<f64>,
    /// SecAgg+'s graph degree (even, at least 2); omit for the complete graph of SecAgg.
    pub degree: Option<usize>,
}

const DEFAULT_SCALE: f64 = 65536.0;
const DEFAULT_THRESHOLD: f64 = 0.6;

impl SecureSection {
    /// The section's ranges, then what it needs of the federation.
    pub fn validate(&self, config: &Config) -> anyhow::Result<()> {
        let positive = |name: &str, value: f64| {
            check(
                name,
                value.is_finite() && value > 0.0,
                "a positive number",
                value.to_string(),
            )
        };
        // The clip the clients apply: this section's, or with [privacy] DP's (its first).
        let clip = match (self.clip_norm, &config.privacy) {
            (Some(clip), None) => {
                positive("secure_aggregation.clip_norm", clip)?;
                clip
            }
            (None, None) => bail!(
                "field `secure_aggregation.clip_norm`: expected a positive number (each \
                 client's change is scaled down to it before encoding), found none"
            ),
            (Some(_), Some(_)) => bail!(
                "field `secure_aggregation.clip_norm`: expected it omitted with [privacy], \
                 whose `clip_norm` the clients clip to"
            ),
            (None, Some(privacy)) => {
                let sharded = config.model.resolved_sharded_layers();
                if !sharded.is_empty() {
                    bail!(
                        "field `model.sharded_layers`: expected none with [privacy] and \
                         [secure_aggregation], found {sharded:?}: DP-FedAvg bounds each change \
                         in weight space, and a secure sum of a sharded layer is over its \
                         factor columns"
                    );
                }
                privacy.clip_norm
            }
        };
        positive("secure_aggregation.scale", self.scale())?;
        let threshold = self.threshold.unwrap_or(DEFAULT_THRESHOLD);
        check(
            "secure_aggregation.threshold",
            threshold > 0.5 && threshold <= 1.0,
            "a fraction in (0.5, 1] of the holders of each secret (more than half, so that the \
             server cannot split the clients into two sessions)",
            threshold.to_string(),
        )?;
        if let Some(degree) = self.degree {
            check(
                "secure_aggregation.degree",
                degree >= 2 && degree % 2 == 0,
                "an even number of neighbours, at least 2",
                degree.to_string(),
            )?;
        }
        if let Err(e) = self.settings().fixed_point(clip) {
            bail!(
                "fields `secure_aggregation.clip_norm` and `scale`: expected clip_norm × scale \
                 at most 2⁵² ({e})"
            );
        }
        let f = &config.federation;
        if f.selector == SelectorName::OptimalPartial {
            bail!(
                "field `federation.selector`: expected `uniform` or `poisson` with \
                 [secure_aggregation], found `optimal-partial`: it picks who uploads from each \
                 client's update norm, which a secure round never reveals"
            );
        }
        let sum_weight = match f.aggregator.build() {
            Ok(aggregator) => aggregator.sum_weight().map(|_| ()),
            Err(_) => Err("it cannot be built from its name alone"),
        };
        if let Err(why) = sum_weight {
            bail!(
                "field `federation.aggregator`: expected `fedavg` or `uniform` with \
                 [secure_aggregation], found `{}`: {why}",
                f.aggregator
            );
        }
        summable(f.compressor)?;
        match f.schedule {
            Schedule::Async { .. } => bail!(
                "field `federation.mode`: expected `sync` with [secure_aggregation], found \
                 `async`: a buffer takes updates of several model versions one at a time, a \
                 secure sum needs one session of clients that trained the same version"
            ),
            Schedule::Sync {
                over_commit: Some(_),
            } => bail!(
                "field `federation.over_commit`: expected none with [secure_aggregation]: a \
                 session cannot close at its first m inputs (its dropouts are unmasked, not cut)"
            ),
            Schedule::Sync { over_commit: None } => {}
        }
        if f.max_update_norm.is_some() {
            bail!(
                "field `federation.max_update_norm`: expected none with [secure_aggregation]: \
                 the server never sees an update to measure; `secure_aggregation.clip_norm` \
                 bounds each client's contribution instead"
            );
        }
        Ok(())
    }

    fn scale(&self) -> f64 {
        self.scale.unwrap_or(DEFAULT_SCALE)
    }

    /// The settings a run with this section uses.
    pub fn settings(&self) -> SecureSettings {
        SecureSettings {
            clip_norm: self.clip_norm,
            scale: self.scale(),
            threshold: self.threshold.unwrap_or(DEFAULT_THRESHOLD),
            degree: self.degree,
        }
    }
}

/// Refuses an uplink a sum cannot carry: only the identity uplink (dense f32 changes, encoded
/// in fixed point) is wired; KLMS's index coding and QSGD's Elias code cannot be summed at all.
fn summable(compressor: Compressor) -> anyhow::Result<()> {
    let coding = match compressor {
        Compressor::Identity => return Ok(()),
        Compressor::QsgdKlms
        | Compressor::SignsgdKlms
        | Compressor::FedpmKlms
        | Compressor::SgldKlms => UplinkCoding::KlmsIndex,
        Compressor::QsgdElias => UplinkCoding::QsgdElias,
        Compressor::Qsgd | Compressor::Signsgd | Compressor::Fedpm | Compressor::Sgld => bail!(
            "field `federation.compressor`: expected `identity` with [secure_aggregation], \
             found `{compressor}`: its values would sum (docs/secagg.md, \"What composes\"), \
             but only the identity uplink is wired to secure aggregation"
        ),
    };
    match coding.check_summable() {
        Ok(()) => Ok(()),
        Err(e) => bail!(
            "field `federation.compressor`: expected `identity` with [secure_aggregation], \
             found `{compressor}`: {e}"
        ),
    }
}
