//! The blocks of a width-sliced round (docs/algorithms.md §8.3): every value of the global model
//! moves to the weighted mean of the clients whose slice kept it, and stays where nobody's did,
//! through the same [`Aggregator`](fedshard_strategies::aggregation::Aggregator) seam as every
//! other fold.
//!
//! Why blocks of "same holders": an aggregator folds blocks, each moved by the results that hold
//! it. The values of a tensor that exactly the same clients kept fold alike, so each tensor is
//! split into such classes (a class per distinct set of holders, a handful per tensor however
//! the slices overlap), each class gathered into one block, folded, and scattered back. An
//! aggregator then sees a width-sliced round as it sees a spectral one: blocks and the results
//! that trained them.

use super::{Accepted, Folded};
use crate::error::{Error, Result};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::WidthPlan;
use fedshard_protocol::width::coordinates;
use fedshard_strategies::aggregation::BlockUpdate;
use std::collections::HashMap;

/// Not held by a result.
pub(crate) const NONE: u32 = u32::MAX;

/// One class of a tensor: the tensor, its flat indices, and the results that hold them.
pub(crate) struct Class {
    pub(crate) tensor: usize,
    pub(crate) indices: Vec<usize>,
    pub(crate) holders: Vec<usize>,
}

/// Folds `order`'s sliced updates into `global` through `fit` (which gets the blocks and each
/// result's block updates, and answers why it declined, or `None`): the classes of every
/// tensor gathered into blocks, folded, scattered back. `global` changes only when `fit`
/// moved the blocks and every value is finite.
pub(crate) fn fold_sliced(
    global: &mut ModelState,
    width: &WidthPlan,
    order: &[&Accepted],
    fit: impl FnOnce(&mut [&mut [f32]], &[Vec<BlockUpdate<'_>>]) -> Result<Option<String>>,
) -> Result<Folded> {
    // Per result and tensor: where each global value sits in the result's tensor (NONE when
    // the result's slice left it out).
    let tensors = global.tensors.len();
    let mut positions: Vec<Vec<Option<Vec<u32>>>> = Vec::with_capacity(order.len());
    for a in order {
        let slice = width.slices.get(&a.client).ok_or_else(|| Error::Update {
            client: a.client,
            reason: "an update without a width slice in the plan".into(),
        })?;
        let mut per_tensor = vec![None; tensors];
        for t in &a.update.dense.tensors {
            // The state is sorted by name (`ModelState::new`).
            let i = global
                .tensors
                .binary_search_by(|g| g.name.as_str().cmp(&t.name))
                .map_err(|_| Error::Update {
                    client: a.client,
                    reason: format!("unknown tensor `{}`", t.name),
                })?;
            let target = &global.tensors[i];
            let coords = coordinates(target, &width.groups, &slice.kept).map_err(Error::Plan)?;
            let held = coords.as_ref().map_or(target.data.len(), Vec::len);
            if held != t.data.len() {
                return Err(Error::Update {
                    client: a.client,
                    reason: format!(
                        "{} values of `{}`, its slice keeps {held}",
                        t.data.len(),
                        t.name
                    ),
                });
            }
            let mut at = vec![NONE; target.data.len()];
            match coords {
                Some(coords) => {
                    for (k, c) in coords.into_iter().enumerate() {
                        at[c] = k as u32;
                    }
                }
                None => at.iter_mut().enumerate().for_each(|(k, p)| *p = k as u32),
            }
            per_tensor[i] = Some(at);
        }
        positions.push(per_tensor);
    }

    let mut classes = Vec::new();
    for (i, tensor) in global.tensors.iter().enumerate() {
        classes.extend(classes_of(i, tensor.data.len(), &positions));
    }
    // Each result's values of each class it holds, in the class's order.
    let mut held: Vec<Vec<(usize, Vec<f32>)>> = vec![Vec::new(); order.len()];
    for (b, c) in classes.iter().enumerate() {
        for &r in &c.holders {
            let name = &global.tensors[c.tensor].name;
            let data = &order[r]
                .update
                .dense
                .get(name)
                .expect("a holder holds the tensor")
                .data;
            let at = positions[r][c.tensor]
                .as_ref()
                .expect("a holder has positions");
            held[r].push((b, c.indices.iter().map(|&k| data[at[k] as usize]).collect()));
        }
    }
    let updates: Vec<Vec<BlockUpdate<'_>>> = held
        .iter()
        .map(|blocks| blocks.iter().map(|(b, v)| (*b, v.as_slice())).collect())
        .collect();
    fold_classes(global, &classes, |views| fit(views, &updates))
}

/// Moves `global` by `fit` over `classes` as blocks: each class's values gathered into one
/// block, moved, scattered back. `global` changes only when `fit` moved the blocks (it answers
/// why it declined, or `None`) and every value is finite.
pub(crate) fn fold_classes(
    global: &mut ModelState,
    classes: &[Class],
    fit: impl FnOnce(&mut [&mut [f32]]) -> Result<Option<String>>,
) -> Result<Folded> {
    let mut blocks: Vec<Vec<f32>> = classes
        .iter()
        .map(|c| {
            let data = &global.tensors[c.tensor].data;
            c.indices.iter().map(|&k| data[k]).collect()
        })
        .collect();
    let mut views: Vec<&mut [f32]> = blocks.iter_mut().map(Vec::as_mut_slice).collect();
    if let Some(why) = fit(&mut views)? {
        return Ok(Folded::Unchanged(why));
    }
    let mut next = global.clone();
    for (c, block) in classes.iter().zip(&blocks) {
        let data = &mut next.tensors[c.tensor].data;
        for (&k, &v) in c.indices.iter().zip(block) {
            data[k] = v;
        }
    }
    if !next.is_finite() {
        return Ok(Folded::NonFinite);
    }
    *global = next;
    Ok(Folded::Updated)
}

/// The classes of tensor `i` (`len` values) that at least one result holds: values grouped by
/// the exact set of results that hold them, in ascending index order within a class.
pub(crate) fn classes_of(i: usize, len: usize, positions: &[Vec<Option<Vec<u32>>>]) -> Vec<Class> {
    let holders: Vec<usize> = (0..positions.len())
        .filter(|&r| positions[r][i].is_some())
        .collect();
    if holders.is_empty() {
        return Vec::new();
    }
    // Refine one class id per value result by result: (old class, held by r) → new class.
    let mut class = vec![0u32; len];
    let mut members: Vec<Vec<usize>> = vec![Vec::new()];
    for &r in &holders {
        let at = positions[r][i].as_ref().expect("filtered to holders");
        let mut renumber: HashMap<(u32, bool), u32> = HashMap::new();
        let mut next_members: Vec<Vec<usize>> = Vec::new();
        for (k, id) in class.iter_mut().enumerate() {
            let held = at[k] != NONE;
            let new = *renumber.entry((*id, held)).or_insert_with(|| {
                let mut m = members[*id as usize].clone();
                if held {
                    m.push(r);
                }
                next_members.push(m);
                (next_members.len() - 1) as u32
            });
            *id = new;
        }
        members = next_members;
    }
    let mut indices: Vec<Vec<usize>> = vec![Vec::new(); members.len()];
    for (k, id) in class.iter().enumerate() {
        indices[*id as usize].push(k);
    }
    members
        .into_iter()
        .zip(indices)
        .filter(|(m, _)| !m.is_empty())
        .map(|(m, indices)| Class {
            tensor: i,
            indices,
            holders: m,
        })
        .collect()
}
