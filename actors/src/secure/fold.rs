//! The server's fold of a secure round: the decoded sum over the survivors' weights, block by
//! block, or released privately as a weight-space sum.

use super::BlockLayout;
use crate::error::{Error, Result};
use crate::round::{Folded, fold_blocks};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, TrainTask};
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

impl SecureSum {
    /// The sum as one f64 vector per tensor of `global` (zero for a tensor no task carried):
    /// the weight-space sum DP-FedAvg releases ([`crate::round::release`]). Only an unsharded
    /// model's blocks are its weights; a sharded layer's factor columns are not.
    pub fn weight_space(&self, global: &ModelState) -> Result<Vec<Vec<f64>>> {
        if !self.layout.layers.is_empty() {
            return Err(layout_error(
                "a secure sum over factor columns is not a weight-space change".into(),
            ));
        }
        Ok(global
            .tensors
            .iter()
            .map(|t| match self.layout.dense(&t.name) {
                Some((offset, len)) if len == t.data.len() => {
                    self.sum[offset..offset + len].to_vec()
                }
                _ => vec![0.0; t.data.len()],
            })
            .collect())
    }
}

/// Moves `global` (with `plan`, the round's SVD) by a session's sum: each block by the sum over
/// the total weight of the survivors whose task held it; a block nobody held stays. The blocks
/// and the recomposition of the sharded layers are the plain fold's ([`fold_blocks`]).
pub fn fold_secure(
    global: &mut ModelState,
    plan: Option<&ShardPlan>,
    tasks: &BTreeMap<ClientId, TrainTask>,
    secure: &SecureSum,
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
    let moved = |block: &mut [f32], sum: &[f64], weight: f64| {
        if weight > 0.0 {
            for (x, s) in block.iter_mut().zip(sum) {
                *x = (f64::from(*x) + s / weight) as f32;
            }
        }
    };
    fold_blocks(global, plan, |blocks, names, layer_starts| {
        let mut offset = 0;
        for (name, len) in &layout.dense {
            let b = names.iter().position(|n| n == name).ok_or_else(|| {
                layout_error(format!("the layout names an unknown tensor `{name}`"))
            })?;
            let weight = total(&|t| t.dense.get(name).is_some());
            moved(blocks[b], &secure.sum[offset..offset + len], weight);
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
                moved(blocks[first + term], &secure.sum[u], weight);
                moved(blocks[first + layer.terms + term], &secure.sum[v], weight);
            }
        }
        Ok(None)
    })
}

/// A layout that does not fit the model it was made from: the server's own mistake, never a
/// client's.
fn layout_error(what: String) -> Error {
    Error::SecureAggregation(fedshard_secagg::Error::Params(what))
}
