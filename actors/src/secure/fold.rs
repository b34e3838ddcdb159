//! The server's fold of a secure round: the decoded sum, block by block, through the run's
//! aggregator (over the survivors' weights, or released privately as a weight-space sum by
//! [`crate::round::Private`]).

use super::BlockLayout;
use crate::error::{Error, Result};
use crate::round::{Folded, declined, fold_blocks};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_strategies::aggregation::{Aggregator, SumRound, SummedBlock};
use std::collections::BTreeMap;

/// What a round's session came to: the decoded sum, and who is in it.
#[derive(Debug, Clone, PartialEq)]
pub struct SecureSum {
    pub layout: BlockLayout,
    /// The sum of the survivors' weighted, clipped changes, decoded.
    pub sum: Vec<f64>,
    /// With `[privacy]`: how many of the survivors' changes needed no clipping.
    pub unclipped: Option<usize>,
    /// The clients whose inputs are in the sum, with their weights.
    pub survivors: BTreeMap<ClientId, f64>,
}

/// Moves `global` (with `plan`, the round's SVD) by a session's sum through `aggregator`
/// ([`Aggregator::aggregate_sum`]): each block by its sum over the total weight of the survivors
/// whose task held it; a block nobody held stays. The blocks and the recomposition of the
/// sharded layers are the plain fold's ([`fold_blocks`]).
pub fn fold_sum(
    global: &mut ModelState,
    plan: Option<&ShardPlan>,
    tasks: &BTreeMap<ClientId, TrainTask>,
    secure: &SecureSum,
    aggregator: &dyn Aggregator,
) -> Result<Folded> {
    let layout = &secure.layout;
    let total = |held: &dyn Fn(&TrainTask) -> bool| -> f64 {
        secure
            .survivors
            .iter()
            .filter(|(id, _)| tasks.get(id).is_some_and(held))
            .map(|(_, w)| w)
            .sum()
    };
    fold_blocks(global, plan, |blocks, names, layer_starts| {
        let mut summed = Vec::new();
        let mut offset = 0;
        for (name, len) in &layout.dense {
            let block = names.iter().position(|n| n == name).ok_or_else(|| {
                layout_error(format!("the layout names an unknown tensor `{name}`"))
            })?;
            let sum = secure
                .sum
                .get(offset..offset + len)
                .ok_or_else(|| layout_error(format!("the sum is too short for tensor `{name}`")))?;
            let weight = total(&|t| t.dense.get(name).is_some());
            summed.push(SummedBlock { block, sum, weight });
            offset += len;
        }
        let in_input = layout.layer_starts();
        for (l, ((layer, &first), start)) in layout
            .layers
            .iter()
            .zip(layer_starts)
            .zip(in_input)
            .enumerate()
        {
            for term in 0..layer.terms {
                let weight = total(&|t| {
                    t.shards
                        .get(l)
                        .is_some_and(|s| s.indices.binary_search(&term).is_ok())
                });
                let [u, v] = layer.term_ranges(start, term);
                let too_short = || layout_error("the sum is too short for its layers".into());
                let (u, v) = (
                    secure.sum.get(u).ok_or_else(too_short)?,
                    secure.sum.get(v).ok_or_else(too_short)?,
                );
                summed.push(SummedBlock {
                    block: first + term,
                    sum: u,
                    weight,
                });
                summed.push(SummedBlock {
                    block: first + layer.terms + term,
                    sum: v,
                    weight,
                });
            }
        }
        let round = SumRound {
            blocks: &summed,
            count: secure.survivors.len(),
            unclipped: secure.unclipped,
            weight_space: layout.layers.is_empty(),
        };
        declined(aggregator, aggregator.aggregate_sum(blocks, &round))
    })
}

/// A layout that does not fit the model it was made from: the server's own mistake, never a
/// client's.
fn layout_error(what: String) -> Error {
    Error::SecureAggregation(fedshard_secagg::Error::Params(what))
}
