//! The server's fold of a secure round: the decoded sum, block by block, through the run's
//! aggregator (over the survivors' weights, or released privately as a weight-space sum by
//! [`crate::round::Private`]).

use super::{BlockLayout, WidthLayout};
use crate::error::{Error, Result};
use crate::round::sliced::{NONE, classes_of, fold_classes};
use crate::round::{Folded, declined, fold_blocks};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_protocol::width::{coordinates, positions_in_union};
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
    if let Some(width) = &layout.width {
        return fold_union(global, width, tasks, secure, aggregator);
    }
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

/// [`fold_sum`] of a width round (docs/algorithms.md §8.3): each tensor's values in the union
/// of the slices fall into classes held by the same survivors ([`classes_of`]), and each class
/// moves by its sum over its holders' total weight, as the plain fold moves it by their
/// weighted mean; a value no survivor held stays.
fn fold_union(
    global: &mut ModelState,
    width: &WidthLayout,
    tasks: &BTreeMap<ClientId, TrainTask>,
    secure: &SecureSum,
    aggregator: &dyn Aggregator,
) -> Result<Folded> {
    let survivors: Vec<(&TrainTask, f64)> = secure
        .survivors
        .iter()
        .filter_map(|(id, &w)| tasks.get(id).map(|t| (t, w)))
        .collect();
    let mut classes = Vec::new();
    let mut sums: Vec<Vec<f64>> = Vec::new();
    let mut weights = Vec::new();
    let mut offset = 0;
    for (name, len) in &secure.layout.dense {
        let i = global
            .tensors
            .binary_search_by(|g| g.name.as_str().cmp(name))
            .map_err(|_| layout_error(format!("the layout names an unknown tensor `{name}`")))?;
        let tensor = &global.tensors[i];
        let union = coordinates(tensor, &width.groups, &width.union).map_err(Error::Plan)?;
        let fits = union.as_ref().map_or(tensor.data.len(), Vec::len) == *len;
        let sum = (secure.sum.get(offset..offset + len))
            .filter(|_| fits)
            .ok_or_else(|| layout_error(format!("the sum does not fit tensor `{name}`")))?;
        offset += len;
        // Where each survivor's values of the tensor sit in the union (NONE where it held none).
        let mut positions = Vec::with_capacity(survivors.len());
        for (task, _) in &survivors {
            let (Some(sent), Some(slice)) = (task.dense.get(name), task.width.as_ref()) else {
                positions.push(vec![None]);
                continue;
            };
            let places = positions_in_union(sent, &width.groups, &slice.kept, &width.union)
                .map_err(Error::Plan)?
                .unwrap_or_else(|| (0..*len).collect());
            let mut at = vec![NONE; *len];
            for (k, p) in places.into_iter().enumerate() {
                *at.get_mut(p)
                    .ok_or_else(|| layout_error(format!("`{name}` outside the union")))? = k as u32;
            }
            positions.push(vec![Some(at)]);
        }
        for mut class in classes_of(0, *len, &positions) {
            weights.push(class.holders.iter().map(|&r| survivors[r].1).sum::<f64>());
            sums.push(class.indices.iter().map(|&k| sum[k]).collect());
            if let Some(union) = &union {
                class.indices.iter_mut().for_each(|k| *k = union[*k]);
            }
            class.tensor = i;
            classes.push(class);
        }
    }
    let summed: Vec<SummedBlock<'_>> = sums
        .iter()
        .zip(&weights)
        .enumerate()
        .map(|(block, (sum, &weight))| SummedBlock { block, sum, weight })
        .collect();
    let round = SumRound {
        blocks: &summed,
        count: secure.survivors.len(),
        unclipped: secure.unclipped,
        weight_space: false,
    };
    fold_classes(global, &classes, |blocks| {
        declined(aggregator, aggregator.aggregate_sum(blocks, &round))
    })
}

/// A layout that does not fit the model it was made from: the server's own mistake, never a
/// client's.
fn layout_error(what: String) -> Error {
    Error::SecureAggregation(fedshard_secagg::Error::Params(what))
}
