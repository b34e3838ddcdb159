//! Folding a sum whose parts the aggregator never sees (secure aggregation, docs/secagg.md):
//! each client premultiplies its change by a weight known before the round ([`SumWeight`]), a
//! session sums the weighted changes, and every block moves by its sum over the total weight of
//! the clients that held it: the per-block weighted mean of [`super::fold_weighted`], up to the
//! encoding's rounding.

use super::Fit;
use crate::{Result, StrategyError};

/// How an aggregator weighs an update it only ever sees inside a sum: a weight per client,
/// fixed before the round, that the client can apply to its own update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumWeight {
    /// FedAvg: `D_c`, the client's sample count as the server's registry knows it.
    Samples,
    /// Every client alike.
    Uniform,
}

impl SumWeight {
    /// The weight of a client with `samples` samples, before any normalisation.
    pub fn of(self, samples: f64) -> f64 {
        match self {
            SumWeight::Samples => samples,
            SumWeight::Uniform => 1.0,
        }
    }
}

/// One block of a sum: the global block it moves, the sum of its holders' weighted changes, and
/// their total weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SummedBlock<'a> {
    pub block: usize,
    pub sum: &'a [f64],
    pub weight: f64,
}

/// A finished sum as [`super::Aggregator::aggregate_sum`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct SumRound<'a> {
    /// The summed blocks; a global block that is not here nobody held.
    pub blocks: &'a [SummedBlock<'a>],
    /// How many clients' inputs are in the sum.
    pub count: usize,
    /// How many of them needed no clipping, when the clients counted it (adaptive clipping under
    /// differential privacy).
    pub unclipped: Option<usize>,
    /// Whether the blocks are the model's weights themselves (no sharded layer's factor
    /// columns among them): only such a sum is a weight-space change.
    pub weight_space: bool,
}

/// Checks that every summed block names a global block of its length, so that nothing is
/// written when one does not.
pub fn check_sum(global: &[&mut [f32]], round: &SumRound<'_>) -> Result<()> {
    for s in round.blocks {
        let fits = global.get(s.block).is_some_and(|b| b.len() == s.sum.len());
        if !fits || !s.weight.is_finite() || s.weight < 0.0 {
            return Err(StrategyError::invalid(
                "summed block",
                format!(
                    "block {} with {} values and weight {} does not fit the {} global blocks",
                    s.block,
                    s.sum.len(),
                    s.weight,
                    global.len()
                ),
            ));
        }
    }
    Ok(())
}

/// `x ← x + sum / weight` for every summed block whose holders weigh anything, in f64; a block
/// nobody held keeps its exact bits. Checked before anything is written.
pub fn fold_sum(global: &mut [&mut [f32]], round: &SumRound<'_>) -> Result<Fit> {
    check_sum(global, round)?;
    if round.count == 0 {
        return Ok(Fit::NoUpdate("an empty sum".into()));
    }
    for s in round.blocks.iter().filter(|s| s.weight > 0.0) {
        for (x, &v) in global[s.block].iter_mut().zip(s.sum) {
            *x = (f64::from(*x) + v / s.weight) as f32;
        }
    }
    Ok(Fit::Updated)
}

#[cfg(test)]
mod tests {
    use super::super::{AggregatorName, BlockUpdate, Contribution, FitRound, RoundOutcome};
    use super::*;

    /// The sum a secure round decodes is the fold of the clear round: two clients with D = 1
    /// and 3 move block 0 from 1 to their FedAvg mean (2·1 + 6·3)/4 = 5 whether the server sees
    /// their values (`aggregate_fit`) or only the sum of their weighted changes over the total
    /// weight (`aggregate_sum`); block 1, held by the second alone, moves to its value; block 2,
    /// held by nobody, keeps its bits. Uniform weights give (2 + 6)/2 = 4 on block 0.
    #[test]
    fn a_sum_of_weighted_changes_folds_as_the_clear_round_does() {
        let results = [1.0, 3.0].map(|samples| Contribution {
            client: samples as u64,
            samples,
            inclusion_probability: 1.0,
        });
        let (a, b) = ([2.0f32], [6.0f32]);
        let (b1, start) = ([9.0f32], [1.0f32, 0.5, 0.25]);
        let updates: Vec<Vec<BlockUpdate>> = vec![vec![(0, &a)], vec![(0, &b), (1, &b1)]];
        for (name, want, weights) in [
            (AggregatorName::Fedavg, 5.0, [1.0, 3.0]),
            (AggregatorName::Uniform, 4.0, [1.0, 1.0]),
        ] {
            let aggregator = name.build().unwrap();
            let weight = aggregator.sum_weight().unwrap();
            assert_eq!(weights, [weight.of(1.0), weight.of(3.0)], "{name}");
            let mut clear = start;
            let round = FitRound {
                outcome: RoundOutcome {
                    results: &results,
                    failures: &[],
                    population_samples: 4.0,
                },
                updates: &updates,
            };
            let mut blocks: Vec<&mut [f32]> = clear.chunks_mut(1).collect();
            aggregator.aggregate_fit(&mut blocks, &round).unwrap();
            let sum0 = [weights[0] * (2.0 - 1.0) + weights[1] * (6.0 - 1.0)];
            let sum1 = [weights[1] * (9.0 - 0.5)];
            let summed = [
                SummedBlock {
                    block: 0,
                    sum: &sum0,
                    weight: weights[0] + weights[1],
                },
                SummedBlock {
                    block: 1,
                    sum: &sum1,
                    weight: weights[1],
                },
            ];
            let sum = SumRound {
                blocks: &summed,
                count: 2,
                unclipped: None,
                weight_space: true,
            };
            let mut secure = start;
            let mut blocks: Vec<&mut [f32]> = secure.chunks_mut(1).collect();
            assert_eq!(
                aggregator.aggregate_sum(&mut blocks, &sum).unwrap(),
                Fit::Updated
            );
            assert_eq!(secure, clear, "{name}");
            assert_eq!(secure, [want, 9.0, 0.25], "{name}");
        }
    }

    /// Inverse probability and FESC say why a sum cannot serve them, and refuse one; a sum
    /// naming a block that is not there is refused before anything moves.
    #[test]
    fn aggregators_without_a_client_side_weight_refuse_a_sum() {
        let sum = [1.0];
        let bad = [SummedBlock {
            block: 3,
            sum: &sum,
            weight: 1.0,
        }];
        let round = SumRound {
            blocks: &bad,
            count: 1,
            unclipped: None,
            weight_space: true,
        };
        for name in [AggregatorName::InverseProbability, AggregatorName::Fesc] {
            let aggregator = name.build().unwrap();
            let why = aggregator.sum_weight().unwrap_err();
            assert!(!why.is_empty());
            let mut value = [1.0f32];
            assert!(
                aggregator
                    .aggregate_sum(&mut [&mut value[..]], &round)
                    .is_err()
            );
        }
        let mut value = [1.0f32];
        let fedavg = AggregatorName::Fedavg.build().unwrap();
        assert!(fedavg.aggregate_sum(&mut [&mut value[..]], &round).is_err());
        assert_eq!(value, [1.0]);
    }
}
