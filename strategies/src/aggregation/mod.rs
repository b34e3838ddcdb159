//! Aggregation (Flower's `aggregate_fit` seam, see STYLE.md): an [`Aggregator`] receives the
//! round's successful results, with the blocks of the model each one trained, and its failures,
//! and folds them into the global blocks, or declines ([`Fit::NoUpdate`]). The server never
//! looks inside: a new aggregator is a new type here and a name in [`AggregatorName`].
//!
//! The aggregators of the papers are [`Weighting`]s: one weight per result, in results order,
//! checked by [`validate_weights`], then the shared [`fold_weighted`] (every block moves to its
//! holders' weighted mean, or sum for inverse probability; a block nobody trained stays, which
//! is the per-singular-vector average of §1.1 step 5 when a block is one singular vector):
//! * [`FedAvg`] (`fedavg`): `n_c / Σ_results n`.
//! * [`UniformWeights`] (`uniform`): `1/|results|`.
//! * [`InverseProbability`] (`inverse-probability`): `n_c / (p_c Σ_population n)`, the unbiased
//!   weights of client sampling (docs/algorithms.md §2.4). They do **not** sum to 1.
//! * [`Fesc`] (`fesc`): FESC weights from the sample sizes (§3.2).
//! * [`FescOracle`] (`fesc-oracle`): water-filling with caller-given variances and biases
//!   (§3.2, oracle version).
//!
//! The robust aggregators are statistics of the individual updates, not weightings (module
//! [`robust`], docs/algorithms.md §9): they take every update as its whole weight-space change
//! ([`Aggregator::folds_blocks`] is false) and move the model by a robust statistic of them.
//! * [`Median`] (`median`): the coordinate-wise median.
//! * [`TrimmedMean`] (`{ kind = "trimmed-mean", beta }`): the coordinate-wise mean without
//!   `⌊β n⌋` values at each end.
//! * [`Krum`] (`{ kind = "krum", f, m }`): the m updates of the smallest Krum scores, averaged
//!   by sample count (m = 1: Krum).
//! * [`Bulyan`] (`{ kind = "bulyan", f }`): repeated Krum, then a coordinate-wise mean around
//!   the median.
//!
//! A buffered asynchronous aggregate (FedBuff) goes through the same trait
//! ([`Aggregator::aggregate_changes`], see [`fold_changes`]): the aggregator's weights, times each
//! update's staleness weight, scale the changes the updates ask for. An aggregator says whether
//! it can ([`Aggregator::folds_changes`]); a runtime checks that before it starts.
//!
//! A secure aggregate goes through the same trait too ([`Aggregator::aggregate_sum`], see
//! [`fold_sum`]): an aggregator whose weights each client can apply to its own update says how
//! ([`Aggregator::sum_weight`]); the others say why not, and a runtime refuses them before it
//! starts. A policy that wraps another (differential privacy's clip and noise) is an
//! `Aggregator` over the one it wraps, so every fold of every schedule goes through this seam.
//!
//! Failed clients get no weight: the weights are computed over the results alone, so a failure
//! acts like a client that was not selected. For the normalised aggregators that is the usual
//! renormalisation; for inverse-probability it biases the estimate by the failed clients' share.

mod changes;
mod fedavg;
mod fesc;
mod fit;
mod inverse_probability;
pub mod robust;
mod summed;
mod uniform;

pub use changes::{ChangeRound, WeightChange, fold_changes};
pub use fedavg::FedAvg;
pub use fesc::{Fesc, FescOracle};
pub use fit::{BlockUpdate, Fit, FitRound, Scale, fold_weighted};
pub use inverse_probability::InverseProbability;
pub use robust::{AggregatorSpec, Bulyan, Krum, Median, TrimFraction, TrimmedMean};
pub use summed::{SumRound, SumWeight, SummedBlock, check_sum, fold_sum};
pub use uniform::UniformWeights;

use crate::{Result, StrategyError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A successful result of the round, as the aggregator sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contribution {
    /// The client that produced it.
    pub client: u64,
    /// `n_c`, its number of local samples.
    pub samples: f64,
    /// `p_c`, the probability with which it was selected this round (1 under full
    /// participation).
    pub inclusion_probability: f64,
}

/// A client that was selected but returned no usable result.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The client.
    pub client: u64,
    /// Why (timeout, error message, …), for the log.
    pub reason: String,
}

/// Everything an aggregator needs to know about a finished round.
#[derive(Debug, Clone, Copy)]
pub struct RoundOutcome<'a> {
    /// The successful results; weights are returned in this order.
    pub results: &'a [Contribution],
    /// The failures, next to the results (partial rounds are ordinary).
    pub failures: &'a [Failure],
    /// `Σ n` over all registered clients, selected or not: the denominator of the
    /// inverse-probability weights.
    pub population_samples: f64,
}

/// An aggregation policy: Flower's `aggregate_fit(results, failures)`.
pub trait Aggregator: Send + Sync + fmt::Debug {
    /// The registry name.
    fn name(&self) -> &'static str;
    /// Folds the round into the global blocks (`global[b]` is block `b`), or declines with
    /// [`Fit::NoUpdate`] and leaves them untouched. On `Err` the blocks are untouched too.
    fn aggregate_fit(&self, global: &mut [&mut [f32]], round: &FitRound) -> Result<Fit>;
    /// Whether [`Aggregator::aggregate_changes`] folds a buffer (see [`fold_changes`]); a runtime
    /// refuses to start a buffered asynchronous run with an aggregator that says no. No by
    /// default.
    fn folds_changes(&self) -> bool {
        false
    }
    /// Folds a buffer of updates trained from different model versions,
    /// `W ← W + Σ_c w_c s(τ_c) ΔW_c`, or declines. Only called when
    /// [`Aggregator::folds_changes`] says yes; otherwise it is an error. On `Err` the blocks
    /// are untouched.
    fn aggregate_changes(&self, _global: &mut [&mut [f32]], _round: &ChangeRound) -> Result<Fit> {
        Err(StrategyError::invalid(
            "aggregator",
            format!(
                "{} cannot fold a buffered asynchronous aggregate",
                self.name()
            ),
        ))
    }
    /// Whether a synchronous round's updates reach [`Aggregator::aggregate_fit`] as blocks
    /// (yes by default); a policy that must see each update's weight-space change (differential
    /// privacy clips it) says no and gets them through [`Aggregator::aggregate_changes`].
    fn folds_blocks(&self) -> bool {
        true
    }
    /// How a client weighs its own update before a secure sum, or why this aggregator's weights
    /// cannot be applied that way (a runtime refuses secure aggregation with it, saying why).
    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Err("its weights are not wired to a secure sum")
    }
    /// Folds a sum of the clients' changes, each premultiplied by its [`SumWeight`]: every block
    /// moves by its sum over its holders' total weight ([`fold_sum`]). On `Err` the blocks are
    /// untouched.
    fn aggregate_sum(&self, global: &mut [&mut [f32]], round: &SumRound) -> Result<Fit> {
        self.sum_weight().map_err(|why| {
            StrategyError::invalid("aggregator", format!("{}: {why}", self.name()))
        })?;
        fold_sum(global, round)
    }
    /// Whether this aggregator is a robust statistic of the individual updates (a median, a
    /// trimmed mean, a Krum selection: docs/algorithms.md §9): a policy that folds the updates
    /// its own way instead (differential privacy's clipped, noised mean) refuses it rather than
    /// silently replace it. No by default.
    fn robust(&self) -> bool {
        false
    }
    /// The fewest results this aggregator folds; it declines a smaller round
    /// ([`Fit::NoUpdate`]), so a runtime refuses a schedule whose every aggregate is smaller (a
    /// FedBuff buffer). 1 by default; Krum needs more than 2f + 2, Bulyan 4f + 3.
    fn min_results(&self) -> usize {
        1
    }
}

/// A policy that weighs each result and folds with [`fold_weighted`]; every `Weighting` is an
/// [`Aggregator`].
pub trait Weighting: Send + Sync + fmt::Debug {
    /// The registry name.
    fn name(&self) -> &'static str;
    /// The weight of every result, in `round.results` order, validated by
    /// [`validate_weights`].
    fn weights(&self, round: &RoundOutcome) -> Result<Vec<f64>>;
    /// Whether the weights are a mean ([`Scale::Mean`], the default) or an unbiased sum.
    fn scale(&self) -> Scale {
        Scale::Mean
    }
    /// Whether the weights may scale a buffer's changes (see [`fold_changes`]): normalised weights
    /// that depend on nothing but the results themselves. No by default.
    fn folds_changes(&self) -> bool {
        false
    }
    /// How a client applies its weight before a secure sum ([`Aggregator::sum_weight`]); none
    /// by default.
    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Err("its weights are not wired to a secure sum")
    }
}

impl<W: Weighting> Aggregator for W {
    fn name(&self) -> &'static str {
        Weighting::name(self)
    }

    /// A round without results does not move the model; otherwise the weights of
    /// [`Weighting::weights`] go through [`fold_weighted`].
    fn aggregate_fit(&self, global: &mut [&mut [f32]], round: &FitRound) -> Result<Fit> {
        if round.outcome.results.is_empty() {
            return Ok(Fit::NoUpdate(format!(
                "no successful results ({} failures)",
                round.outcome.failures.len()
            )));
        }
        if round.updates.len() != round.outcome.results.len() {
            return Err(StrategyError::invalid(
                "round",
                format!(
                    "{} updates for {} results",
                    round.updates.len(),
                    round.outcome.results.len()
                ),
            ));
        }
        let weights = self.weights(&round.outcome)?;
        fold_weighted(global, round.updates, &weights, self.scale())?;
        Ok(Fit::Updated)
    }

    fn folds_changes(&self) -> bool {
        Weighting::folds_changes(self)
    }

    fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
        Weighting::sum_weight(self)
    }

    /// An empty buffer does not move the model; otherwise the weights of
    /// [`Weighting::weights`] over the buffer, times the staleness weights, scale the changes
    /// ([`fold_changes`]).
    fn aggregate_changes(&self, global: &mut [&mut [f32]], round: &ChangeRound) -> Result<Fit> {
        if !Weighting::folds_changes(self) {
            return Err(StrategyError::invalid(
                "aggregator",
                format!(
                    "{} cannot fold a buffered asynchronous aggregate",
                    Weighting::name(self)
                ),
            ));
        }
        if round.outcome.results.is_empty() {
            return Ok(Fit::NoUpdate("an empty buffer".into()));
        }
        let results = round.outcome.results.len();
        if round.changes.len() != results || round.scales.len() != results {
            return Err(StrategyError::invalid(
                "buffered round",
                format!(
                    "{} changes and {} staleness weights for {results} results",
                    round.changes.len(),
                    round.scales.len()
                ),
            ));
        }
        let weights = self.weights(&round.outcome)?;
        fold_changes(global, round, &weights)
    }
}

/// Tolerance on `|Σw − 1|` for the normalised aggregators.
pub const WEIGHT_SUM_TOLERANCE: f64 = 1e-9;

/// The one check every aggregator applies before returning: one weight per result, each finite
/// and `≥ 0`, and, when `normalised`, `|Σw − 1| ≤` [`WEIGHT_SUM_TOLERANCE`]. Inverse-probability
/// weights are not normalised (their sum is random, 1 only in expectation), so it passes
/// `normalised = false`.
pub fn validate_weights(weights: &[f64], results: usize, normalised: bool) -> Result<()> {
    if weights.len() != results {
        return Err(StrategyError::invalid(
            "aggregation weights",
            format!("{} weights for {results} results", weights.len()),
        ));
    }
    if let Some((i, w)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| !w.is_finite() || **w < 0.0)
    {
        return Err(StrategyError::invalid(
            "aggregation weights",
            format!("weight {i} is {w}; weights must be finite and non-negative"),
        ));
    }
    if normalised {
        let sum: f64 = weights.iter().sum();
        if (sum - 1.0).abs() > WEIGHT_SUM_TOLERANCE {
            return Err(StrategyError::invalid(
                "aggregation weights",
                format!("they sum to {sum}, not 1"),
            ));
        }
    }
    Ok(())
}

/// The results' sample counts, after checking there is at least one result and every count is
/// finite and `≥ 0` (`positive` demands `> 0`).
fn result_samples(round: &RoundOutcome, positive: bool) -> Result<Vec<f64>> {
    if round.results.is_empty() {
        return Err(StrategyError::invalid(
            "round outcome",
            format!(
                "no successful results to aggregate ({} failures)",
                round.failures.len()
            ),
        ));
    }
    round
        .results
        .iter()
        .map(|c| {
            let ok = c.samples.is_finite() && (c.samples > 0.0 || (!positive && c.samples == 0.0));
            if ok {
                Ok(c.samples)
            } else {
                Err(StrategyError::invalid(
                    "result samples",
                    format!(
                        "client {} reported {} samples; need a finite {} number",
                        c.client,
                        c.samples,
                        if positive { "positive" } else { "non-negative" }
                    ),
                ))
            }
        })
        .collect()
}

/// The aggregators known to the registry, with their parameters: what `[federation]
/// aggregator` says. It is read and written through [`AggregatorSpec`] (a name, or a table for
/// an aggregator with parameters), which checks the parameters, so a held one is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "AggregatorSpec", into = "AggregatorSpec")]
pub enum AggregatorName {
    /// [`FedAvg`].
    Fedavg,
    /// [`InverseProbability`].
    InverseProbability,
    /// [`Fesc`].
    Fesc,
    /// [`FescOracle`].
    FescOracle,
    /// [`UniformWeights`].
    Uniform,
    /// [`Median`].
    Median,
    /// [`TrimmedMean`], with its β.
    TrimmedMean(TrimmedMean),
    /// [`Krum`], with its f and m.
    Krum(Krum),
    /// [`Bulyan`], with its f.
    Bulyan(Bulyan),
}

impl AggregatorName {
    /// Every aggregator a name alone selects, in registry order; those with parameters are
    /// written as tables ([`AggregatorSpec`]).
    pub const ALL: [AggregatorName; 6] = [
        AggregatorName::Fedavg,
        AggregatorName::InverseProbability,
        AggregatorName::Fesc,
        AggregatorName::FescOracle,
        AggregatorName::Uniform,
        AggregatorName::Median,
    ];

    /// The kebab-case name used in configs and on the command line (a table's `kind`).
    pub fn as_str(&self) -> &'static str {
        match self {
            AggregatorName::Fedavg => "fedavg",
            AggregatorName::InverseProbability => "inverse-probability",
            AggregatorName::Fesc => "fesc",
            AggregatorName::FescOracle => "fesc-oracle",
            AggregatorName::Uniform => "uniform",
            AggregatorName::Median => "median",
            AggregatorName::TrimmedMean(_) => "trimmed-mean",
            AggregatorName::Krum(_) => "krum",
            AggregatorName::Bulyan(_) => "bulyan",
        }
    }

    /// A fresh aggregator of this kind. `fesc-oracle` cannot be built from its name alone: it
    /// needs the per-result variances and biases, so construct [`FescOracle`] directly.
    pub fn build(&self) -> Result<Box<dyn Aggregator>> {
        Ok(match *self {
            AggregatorName::Fedavg => Box::new(FedAvg),
            AggregatorName::InverseProbability => Box::new(InverseProbability),
            AggregatorName::Fesc => Box::new(Fesc),
            AggregatorName::Uniform => Box::new(UniformWeights),
            AggregatorName::Median => Box::new(Median),
            AggregatorName::TrimmedMean(t) => Box::new(t),
            AggregatorName::Krum(k) => Box::new(k),
            AggregatorName::Bulyan(b) => Box::new(b),
            AggregatorName::FescOracle => {
                return Err(StrategyError::invalid(
                    "aggregator",
                    "fesc-oracle needs the oracle variances a_i and biases b_i; build \
                     `FescOracle { a, b }` directly",
                ));
            }
        })
    }
}

/// The name, or for an aggregator with parameters its table
/// (`{ kind = "krum", f = 1, m = 3 }`).
impl fmt::Display for AggregatorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggregatorName::TrimmedMean(t) => t.fmt(f),
            AggregatorName::Krum(k) => k.fmt(f),
            AggregatorName::Bulyan(b) => b.fmt(f),
            other => f.write_str(other.as_str()),
        }
    }
}

/// An aggregator a name alone selects ([`AggregatorName::ALL`]); the name of one with
/// parameters is refused with the table to write, an unknown name with every valid one.
impl std::str::FromStr for AggregatorName {
    type Err = StrategyError;

    fn from_str(s: &str) -> Result<Self> {
        if let Some(n) = AggregatorName::ALL.into_iter().find(|n| n.as_str() == s) {
            return Ok(n);
        }
        if let Some(refusal) = AggregatorName::needs_parameters(s) {
            return Err(refusal);
        }
        let names = AggregatorName::ALL.map(|n| n.as_str());
        Err(StrategyError::UnknownName {
            kind: "aggregator",
            name: s.to_owned(),
            valid: names
                .iter()
                .chain(&robust::PARAMETERISED)
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in AggregatorName::ALL {
            assert_eq!(n.as_str().parse::<AggregatorName>().unwrap(), n);
            if let Ok(a) = n.build() {
                assert_eq!(a.name(), n.as_str());
            }
        }
        assert!(AggregatorName::FescOracle.build().is_err());
        match "mean".parse::<AggregatorName>() {
            Err(StrategyError::UnknownName { kind, valid, .. }) => {
                assert_eq!(kind, "aggregator");
                assert_eq!(
                    valid,
                    "fedavg, inverse-probability, fesc, fesc-oracle, uniform, median, \
                     trimmed-mean, krum, bulyan"
                );
            }
            other => panic!("{other:?}"),
        }
        // A name with parameters alone is refused with the table to write.
        match "krum".parse::<AggregatorName>() {
            Err(StrategyError::InvalidInput { what, reason }) => {
                assert_eq!(what, "aggregator");
                assert!(reason.contains("{ kind = \"krum\", f = "), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Adds `scale` × a fixed change to block 0.
    struct Step(Vec<f64>);

    impl WeightChange for Step {
        fn add_scaled(&self, change: &mut [Vec<f64>], scale: f64) -> Result<()> {
            for (c, d) in change[0].iter_mut().zip(&self.0) {
                *c += scale * d;
            }
            Ok(())
        }
    }

    /// D = (1, 3), s = (½, 1), changes +4 and +8 on the first value: FedAvg moves it by
    /// ¼ · ½ · 4 + ¾ · 8 = 6.5; the second value nobody touches keeps its bits. Uniform weights
    /// move it by ½ · ½ · 4 + ½ · 8 = 5. Inverse probability and FESC refuse a buffer.
    #[test]
    fn a_buffer_moves_by_the_weighted_staleness_scaled_changes() {
        let results = [1.0, 3.0].map(|samples| Contribution {
            client: samples as u64,
            samples,
            inclusion_probability: 1.0,
        });
        let (a, b) = (Step(vec![4.0, 0.0]), Step(vec![8.0, 0.0]));
        let changes: [&dyn WeightChange; 2] = [&a, &b];
        let round = ChangeRound {
            outcome: RoundOutcome {
                results: &results,
                failures: &[],
                population_samples: 4.0,
            },
            scales: &[0.5, 1.0],
            changes: &changes,
        };
        for (name, want) in [
            (AggregatorName::Fedavg, 6.5),
            (AggregatorName::Uniform, 5.0),
        ] {
            let mut block = [1.0f32, 0.1];
            let aggregator = name.build().unwrap();
            assert!(aggregator.folds_changes());
            let fit = aggregator.aggregate_changes(&mut [&mut block[..]], &round);
            assert_eq!(fit.unwrap(), Fit::Updated);
            assert_eq!(block, [1.0 + want, 0.1], "{name}");
        }
        for name in [AggregatorName::InverseProbability, AggregatorName::Fesc] {
            let aggregator = name.build().unwrap();
            assert!(!aggregator.folds_changes(), "{name}");
            let mut block = [1.0f32, 0.1];
            assert!(
                aggregator
                    .aggregate_changes(&mut [&mut block[..]], &round)
                    .is_err()
            );
            assert_eq!(block, [1.0, 0.1]);
        }
    }

    #[test]
    fn validate_weights_rules() {
        assert!(validate_weights(&[0.5, 0.5], 2, true).is_ok());
        assert!(validate_weights(&[0.5, 0.6], 2, true).is_err());
        assert!(validate_weights(&[0.5, 0.6], 2, false).is_ok());
        assert!(validate_weights(&[0.5], 2, false).is_err());
        assert!(validate_weights(&[1.5, -0.5], 2, true).is_err());
        assert!(validate_weights(&[f64::NAN, 1.0], 2, false).is_err());
    }
}
