//! Byzantine-robust aggregation (docs/algorithms.md §9): the model moves by a robust statistic
//! of the clients' changes instead of their weighted mean, so that a few arbitrary
//! (Byzantine) updates cannot drag it anywhere they like.
//!
//! * [`Median`] (`median`): the coordinate-wise median (Yin et al. 2018; Flower's
//!   `aggregate_median`).
//! * [`TrimmedMean`] (`trimmed-mean`, β): the coordinate-wise mean without the ⌊β n⌋ smallest
//!   and ⌊β n⌋ largest values (Yin et al. 2018; Flower's `aggregate_trimmed_avg`).
//! * [`Krum`] (`krum`, f and m): the m updates with the smallest Krum scores, averaged by sample
//!   count; m = 1 is Krum itself (Blanchard et al. 2017; Flower's `aggregate_krum`).
//! * [`Bulyan`] (`bulyan`, f): n − 2f updates chosen by repeated Krum, then per coordinate the
//!   mean of the n − 4f values closest to their median (El Mhamdi et al. 2018; Flower's
//!   `aggregate_bulyan`).
//!
//! Flower computes these statistics of the clients' weights `w_c`; fedshard computes them of the
//! changes `ΔW_c = w_c − W` and moves the model by the result. Every one of them commutes with
//! adding the shared `W` (a median or a mean of `W + x_c` is `W` plus that of the `x_c`, and
//! Krum's distances do not see `W`), so `W + stat(ΔW)` is Flower's `stat(w)`, up to rounding.
//!
//! A robust aggregator must see each client's whole update, so it takes the round as
//! weight-space changes ([`super::Aggregator::folds_blocks`] is false): a sharded update is the
//! change its factors make to the dense weights, a width-sliced one is zero outside its slice.
//! That zero is a vote for "no change" on those coordinates, the vote of a client that sent the
//! global values back unchanged. A buffered update's change is first scaled by its
//! staleness weight `s(τ_c)`, the step FedBuff would let it take; the statistic is then taken
//! of the scaled changes (in a round every `s_c` is 1, and Flower's definitions hold exactly).
//!
//! Results are put in the order of their client ids before anything is computed, so the
//! outcome never depends on the order updates arrived in: a tie (two Krum scores equal, two
//! values equally close to Bulyan's median) is broken the way Flower breaks it on a result list
//! sorted by client id, the order fedshard's block fold uses.
//!
//! Refused before a run starts: a secure sum, since the server would see only the sum of the
//! updates ([`super::Aggregator::sum_weight`] says so), and differential privacy, whose
//! DP-FedAvg would replace the fold by its clipped, noised mean, with noise calibrated to one
//! client's influence on a sum, not on a median or a selection
//! ([`super::Aggregator::robust`] tells the runtime).

mod coordinate;
mod krum;
mod spec;
#[cfg(test)]
mod tests;

pub use coordinate::{Median, TrimFraction, TrimmedMean};
pub use krum::{Bulyan, Krum};
pub use spec::AggregatorSpec;
pub(super) use spec::PARAMETERISED;

use super::{Aggregator, ChangeRound, Fit, FitRound, SumWeight};
use crate::{Result, StrategyError};

/// Why a robust aggregator cannot fold a secure sum ([`Aggregator::sum_weight`]).
const NOT_A_SUM: &str = "it is a robust statistic of the individual updates (a median, a \
                         trimmed mean, a Krum selection), and a secure sum shows the server \
                         only their sum: use `fedavg` or `uniform`";

/// The round's changes as a robust statistic takes them: one flat vector per result (the
/// blocks one after another), `s_c ΔW_c`, in client-id order.
#[derive(Debug)]
struct Changes {
    /// `s_c ΔW_c` of each result, flattened over the blocks.
    vectors: Vec<Vec<f64>>,
    /// `n_c` of each result, in the same order.
    samples: Vec<f64>,
}

impl Changes {
    /// Forms every change of `round` against blocks of the lengths of `global`'s, scaled by its
    /// `s_c`, and sorts them by client id (a stable sort: one client twice in a buffer keeps
    /// its arrival order). Refuses a round whose lists disagree in length, a scale that is not
    /// a finite non-negative number, or a change that is not finite (accepted updates are
    /// finite, so one would be a bug upstream).
    fn gather(global: &[&mut [f32]], round: &ChangeRound) -> Result<Self> {
        let results = round.outcome.results;
        if round.changes.len() != results.len() || round.scales.len() != results.len() {
            return Err(StrategyError::invalid(
                "robust round",
                format!(
                    "{} changes and {} scales for {} results",
                    round.changes.len(),
                    round.scales.len(),
                    results.len()
                ),
            ));
        }
        let mut order: Vec<usize> = (0..results.len()).collect();
        order.sort_by_key(|&i| results[i].client);
        let lens: Vec<usize> = global.iter().map(|b| b.len()).collect();
        let mut vectors = Vec::with_capacity(order.len());
        let mut samples = Vec::with_capacity(order.len());
        for i in order {
            let (client, scale) = (results[i].client, round.scales[i]);
            if !scale.is_finite() || scale < 0.0 {
                return Err(StrategyError::invalid(
                    "robust round",
                    format!("client {client} has the scale {scale}; need a finite number ≥ 0"),
                ));
            }
            let mut blocks: Vec<Vec<f64>> = lens.iter().map(|&n| vec![0.0; n]).collect();
            round.changes[i].add_scaled(&mut blocks, scale)?;
            let flat: Vec<f64> = blocks.concat();
            if flat.len() != lens.iter().sum::<usize>() || flat.iter().any(|v| !v.is_finite()) {
                return Err(StrategyError::invalid(
                    "robust round",
                    format!("client {client}'s change is not finite or not of the model's size"),
                ));
            }
            vectors.push(flat);
            samples.push(results[i].samples);
        }
        Ok(Self { vectors, samples })
    }

    fn len(&self) -> usize {
        self.vectors.len()
    }

    /// The values of coordinate `k` across the results, in results order, into `column`.
    fn column(&self, k: usize, column: &mut Vec<f64>) {
        column.clear();
        column.extend(self.vectors.iter().map(|v| v[k]));
    }

    /// The dimension of the flat vectors (every result has it).
    fn dimension(&self) -> usize {
        self.vectors.first().map_or(0, Vec::len)
    }
}

/// A robust statistic of the round's changes: what each robust aggregator computes, the rest
/// (gathering, the minimum count, applying the change) shared by [`fold_statistic`].
trait Statistic: std::fmt::Display {
    const NAME: &'static str;
    /// The fewest results the statistic is defined for (its paper's assumption on n).
    fn min_results(&self) -> usize;
    /// The change the model takes, one value per coordinate of the flat vectors.
    fn change(&self, changes: &Changes) -> Result<Vec<f64>>;
}

/// `W ← W + stat(s_c ΔW_c)`: declines an empty round and one below the statistic's minimum
/// ([`Fit::NoUpdate`], the model stays: a robust rule without its majority guarantees nothing,
/// and Flower raises there, which a run must not); a value whose change is exactly 0 keeps its
/// bits. On `Err` the blocks are untouched.
fn fold_statistic<S: Statistic>(
    statistic: &S,
    global: &mut [&mut [f32]],
    round: &ChangeRound,
) -> Result<Fit> {
    let n = round.outcome.results.len();
    if n == 0 {
        return Ok(Fit::NoUpdate("no successful results".into()));
    }
    let min = statistic.min_results();
    if n < min {
        return Ok(Fit::NoUpdate(format!(
            "{statistic} folds at least {min} results, and the round has {n}"
        )));
    }
    let changes = Changes::gather(global, round)?;
    let delta = statistic.change(&changes)?;
    let mut delta = delta.iter();
    for block in global.iter_mut() {
        for (x, &d) in block.iter_mut().zip(delta.by_ref()) {
            if d != 0.0 {
                *x = (f64::from(*x) + d) as f32;
            }
        }
    }
    Ok(Fit::Updated)
}

/// Every robust statistic is an [`Aggregator`] that folds changes only.
macro_rules! robust_aggregators {
    ($($ty:ty),*) => {$(
        impl Aggregator for $ty {
            fn name(&self) -> &'static str {
                <$ty as Statistic>::NAME
            }

            /// Never: a robust statistic takes whole weight-space changes, not block values
            /// ([`Aggregator::folds_blocks`] is false, so a runtime never calls this).
            fn aggregate_fit(&self, _global: &mut [&mut [f32]], _round: &FitRound) -> Result<Fit> {
                Err(StrategyError::invalid(
                    "aggregator",
                    format!(
                        "{} takes each update's weight-space change (aggregate_changes), not \
                         block values",
                        <$ty as Statistic>::NAME
                    ),
                ))
            }

            fn folds_blocks(&self) -> bool {
                false
            }

            fn folds_changes(&self) -> bool {
                true
            }

            fn aggregate_changes(
                &self,
                global: &mut [&mut [f32]],
                round: &ChangeRound,
            ) -> Result<Fit> {
                fold_statistic(self, global, round)
            }

            fn sum_weight(&self) -> std::result::Result<SumWeight, &'static str> {
                Err(NOT_A_SUM)
            }

            fn robust(&self) -> bool {
                true
            }

            fn min_results(&self) -> usize {
                Statistic::min_results(self)
            }
        }
    )*};
}

robust_aggregators!(Median, TrimmedMean, Krum, Bulyan);
