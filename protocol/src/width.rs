//! Width slicing as plain data (docs/algorithms.md §8): where each hidden width of a model sits in
//! its tensors ([`WidthGroup`], described by the model, never by the runtime), which units a
//! client keeps ([`WidthSlice`], in its task), and the sub-model those units cut out of the global
//! tensors ([`slice_state`]) together with where each value came from ([`coordinates`]), which is
//! all the server needs to fold a sliced update back.

use crate::error::Error;
use crate::model::{ModelState, NamedTensor};
use crate::task::ClientId;
use fedshard_strategies::StrategyError;
use fedshard_strategies::sharding::width::{WidthStrategy, kept_units};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One axis of one tensor that follows a width: unit `u` of the width is the indices
/// `u·block … (u+1)·block − 1` of that axis (`block` > 1 where a flattened convolution output
/// feeds a linear layer, `H·W` values per channel, or where a unit is an attention head of
/// `head_dim` rows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Axis {
    pub tensor: String,
    pub axis: usize,
    pub block: usize,
}

/// One hidden width of a model: `units` units in `norm_groups` equal consecutive groups (a
/// GroupNorm's; 1 otherwise), and every tensor axis that follows it. Inputs and outputs of the
/// model are never widths, so they stay whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WidthGroup {
    pub name: String,
    pub units: usize,
    pub norm_groups: usize,
    pub axes: Vec<Axis>,
}

/// How a run slices widths: the strategy, and the model's widths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WidthPolicy {
    pub strategy: WidthStrategy,
    pub groups: Vec<WidthGroup>,
}

/// Kept units of each width, by the width's name, ascending: a client's slice, or the union of
/// a round's slices that its secure sum runs over.
pub type KeptUnits = BTreeMap<String, Vec<usize>>;

/// The units one client keeps of every width, and how it trains them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WidthSlice {
    /// Kept units of each width.
    pub kept: KeptUnits,
    /// The client's keep ratio r (its capacity).
    pub keep_ratio: f64,
    /// How the client trains the slice; HeteroFL's scaler when absent (a task from before
    /// FjORD).
    #[serde(default)]
    pub local: LocalWidth,
}

/// How a client trains its width slice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub enum LocalWidth {
    /// HeteroFL and FedRolex: the whole slice every batch, the output of every layer whose
    /// outputs are sliced divided by the keep ratio (HeteroFL's scaler, which FedRolex keeps),
    /// so the sub-model's activations keep the full model's scale.
    #[default]
    Scaled,
    /// FjORD's ordered dropout: every batch trains the leading units of each norm group at a
    /// level `p` drawn uniformly from `levels` (ascending, the last the keep ratio), unscaled.
    OrderedDropout { levels: Vec<f64> },
}

impl WidthSlice {
    /// The ratio the sliced layers divide their outputs by during local training: the keep
    /// ratio under [`LocalWidth::Scaled`] below full width, else none.
    pub fn scaler(&self) -> Option<f64> {
        match self.local {
            LocalWidth::Scaled if self.keep_ratio != 1.0 => Some(self.keep_ratio),
            _ => None,
        }
    }

    /// Kept units of each width, by name: the sub-model's widths.
    pub fn widths(&self) -> BTreeMap<String, usize> {
        self.kept
            .iter()
            .map(|(g, u)| (g.clone(), u.len()))
            .collect()
    }

    /// FjORD's batch at level `level`: the model this slice cuts out seen as a model of its
    /// own (each of `groups` narrowed to its kept units, the same axes and norm groups), and
    /// the leading units of each of its norm groups that the global width keeps at `level`
    /// (`kept_units(K, G, level)`, at most the slice's). Slicing the client's tensors with
    /// these is slicing the global model with HeteroFL's leading units at `level`, because
    /// the slice's own units are leading ones too.
    pub fn ordered_prefix(
        &self,
        groups: &[WidthGroup],
        level: f64,
    ) -> Result<(Vec<WidthGroup>, WidthSlice), Error> {
        let mut local = Vec::with_capacity(groups.len());
        let mut kept = BTreeMap::new();
        for g in groups {
            let units = self.kept.get(&g.name).map_or(0, Vec::len);
            let per_group = units / g.norm_groups;
            let at_level =
                kept_units(g.units, g.norm_groups, level).map_err(|source| Error::Plan {
                    layer: g.name.clone(),
                    keep_ratio: level,
                    source,
                })? / g.norm_groups;
            let take = at_level.min(per_group);
            kept.insert(
                g.name.clone(),
                (0..g.norm_groups)
                    .flat_map(|n| n * per_group..n * per_group + take)
                    .collect(),
            );
            local.push(WidthGroup { units, ..g.clone() });
        }
        let prefix = WidthSlice {
            kept,
            keep_ratio: level,
            local: self.local.clone(),
        };
        Ok((local, prefix))
    }
}

/// Every participant's slice in round `round` at its keep ratio.
pub fn plan_widths(
    policy: &WidthPolicy,
    participants: &[(ClientId, f64)],
    round: u64,
) -> Result<BTreeMap<ClientId, WidthSlice>, Error> {
    let mut slices = BTreeMap::new();
    for &(client, keep_ratio) in participants {
        let mut kept = BTreeMap::new();
        for g in &policy.groups {
            let units = policy
                .strategy
                .kept(g.units, g.norm_groups, keep_ratio, round)
                .map_err(|source| Error::Plan {
                    layer: g.name.clone(),
                    keep_ratio,
                    source,
                })?;
            kept.insert(g.name.clone(), units);
        }
        let local = match policy.strategy.ordered_dropout_levels(keep_ratio) {
            Some(levels) => LocalWidth::OrderedDropout { levels },
            None => LocalWidth::Scaled,
        };
        slices.insert(
            client,
            WidthSlice {
                kept,
                keep_ratio,
                local,
            },
        );
    }
    Ok(slices)
}

/// The number of units a keep ratio keeps of every width: the sub-model's widths, without a
/// round (every strategy keeps the same number).
pub fn widths_at(
    groups: &[WidthGroup],
    keep_ratio: f64,
) -> Result<BTreeMap<String, usize>, StrategyError> {
    groups
        .iter()
        .map(|g| {
            Ok((
                g.name.clone(),
                kept_units(g.units, g.norm_groups, keep_ratio)?,
            ))
        })
        .collect()
}

/// The number of values of `tensor` in a sub-model whose widths keep `widths` units each (a
/// width missing from `widths` stays whole): the product over its axes of the kept length.
pub fn sliced_len(
    tensor: &NamedTensor,
    groups: &[WidthGroup],
    widths: &BTreeMap<String, usize>,
) -> u64 {
    let mut shape: Vec<u64> = tensor.shape.iter().map(|&d| d as u64).collect();
    for g in groups {
        let Some(&kept) = widths.get(&g.name) else {
            continue;
        };
        for a in g.axes.iter().filter(|a| a.tensor == tensor.name) {
            if let Some(d) = shape.get_mut(a.axis) {
                *d = (kept * a.block) as u64;
            }
        }
    }
    shape.iter().product()
}

/// The flat indices into `tensor` (row-major, global shape) of the values that keep the units
/// `kept`, in the sliced tensor's row-major order; `None` when no width of `groups` runs along
/// the tensor.
pub fn coordinates(
    tensor: &NamedTensor,
    groups: &[WidthGroup],
    kept: &KeptUnits,
) -> Result<Option<Vec<usize>>, Error> {
    let Some(kept) = kept_along_axes(tensor, groups, kept)? else {
        return Ok(None);
    };
    let shape = &tensor.shape;
    let mut strides = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * shape[a + 1];
    }
    let mut out = vec![0usize];
    for (a, indices) in kept.iter().enumerate() {
        let mut next = Vec::with_capacity(out.len() * indices.len());
        for base in &out {
            next.extend(indices.iter().map(|i| base + i * strides[a]));
        }
        out = next;
    }
    Ok(Some(out))
}

/// The global model cut to `slice`: every tensor a width runs along keeps the slice's indices on
/// those axes (its shape shrinks), the others stay whole.
pub fn slice_state(
    global: &ModelState,
    groups: &[WidthGroup],
    slice: &WidthSlice,
) -> Result<ModelState, Error> {
    let mut tensors = Vec::with_capacity(global.tensors.len());
    for t in &global.tensors {
        let Some(kept) = kept_along_axes(t, groups, &slice.kept)? else {
            tensors.push(t.clone());
            continue;
        };
        let coords = coordinates(t, groups, &slice.kept)?.unwrap_or_default();
        tensors.push(NamedTensor {
            name: t.name.clone(),
            shape: kept.iter().map(Vec::len).collect(),
            data: coords.iter().map(|&i| t.data[i]).collect(),
        });
    }
    ModelState::new(tensors).map_err(|e| Error::Width(e.to_string()))
}

/// The units that any of `slices` keeps, of every width: the part of the model a round's
/// secure sum runs over (docs/algorithms.md §8.3), so that nobody's input carries the units
/// nobody trained.
pub fn union_of<'a>(slices: impl IntoIterator<Item = &'a WidthSlice>) -> KeptUnits {
    let mut union = KeptUnits::new();
    for slice in slices {
        for (width, units) in &slice.kept {
            union.entry(width.clone()).or_default().extend(units);
        }
    }
    for units in union.values_mut() {
        units.sort_unstable();
        units.dedup();
    }
    union
}

/// Where each value of `tensor`, cut to the units `kept`, sits in the same tensor cut to
/// `union` (which keeps every unit `kept` keeps), both row-major: the places a client's sliced
/// values take in a round's secure input. `None` when no width runs along the tensor (it is
/// whole in both).
///
/// The tensor cut to `union` is seen as a model of its own, whose widths have the union's
/// units and in which `kept` names units by their place in the union; its coordinates are
/// then [`coordinates`]'.
pub fn positions_in_union(
    tensor: &NamedTensor,
    groups: &[WidthGroup],
    kept: &KeptUnits,
    union: &KeptUnits,
) -> Result<Option<Vec<usize>>, Error> {
    let mut local = Vec::with_capacity(groups.len());
    let mut places = KeptUnits::new();
    let mut shape = tensor.shape.clone();
    for g in groups {
        let missing =
            |what: &str| Error::Width(format!("{what} keeps nothing of width `{}`", g.name));
        let whole = union
            .get(&g.name)
            .ok_or_else(|| missing("the round's union"))?;
        let own = kept.get(&g.name).ok_or_else(|| missing("the slice"))?;
        let at = own
            .iter()
            .map(|u| {
                whole.binary_search(u).map_err(|_| {
                    Error::Width(format!(
                        "unit {u} of width `{}` is outside the round's union",
                        g.name
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for a in g.axes.iter().filter(|a| a.tensor == tensor.name) {
            if tensor.shape.get(a.axis) != Some(&(own.len() * a.block)) {
                return Err(Error::Width(format!(
                    "`{}` has shape {:?}, its slice keeps {} units of width `{}` along axis {}",
                    tensor.name,
                    tensor.shape,
                    own.len(),
                    g.name,
                    a.axis
                )));
            }
            shape[a.axis] = whole.len() * a.block;
        }
        places.insert(g.name.clone(), at);
        local.push(WidthGroup {
            units: whole.len(),
            ..g.clone()
        });
    }
    let at_union = NamedTensor {
        name: tensor.name.clone(),
        shape,
        data: Vec::new(),
    };
    coordinates(&at_union, &local, &places)
}

/// For each axis of `tensor`, the indices `kept_units` keep (all of an axis no width runs along), or
/// `None` when no width runs along the tensor.
fn kept_along_axes(
    tensor: &NamedTensor,
    groups: &[WidthGroup],
    kept_units: &KeptUnits,
) -> Result<Option<Vec<Vec<usize>>>, Error> {
    let mut kept: Vec<Option<Vec<usize>>> = vec![None; tensor.shape.len()];
    let mut sliced = false;
    for g in groups {
        for axis in g.axes.iter().filter(|a| a.tensor == tensor.name) {
            let length = tensor.shape.get(axis.axis).copied().ok_or_else(|| {
                Error::Width(format!(
                    "width `{}` runs along axis {} of `{}`, which has shape {:?}",
                    g.name, axis.axis, tensor.name, tensor.shape
                ))
            })?;
            if g.units * axis.block != length || kept[axis.axis].is_some() {
                return Err(Error::Width(format!(
                    "width `{}` ({} units of {}) does not fit axis {} of `{}` (shape {:?}), \
                     or another width runs along it too",
                    g.name, g.units, axis.block, axis.axis, tensor.name, tensor.shape
                )));
            }
            let units = kept_units.get(&g.name).ok_or_else(|| {
                Error::Width(format!("the slice keeps nothing of width `{}`", g.name))
            })?;
            if let Some(u) = units.iter().find(|&&u| u >= g.units) {
                return Err(Error::Width(format!(
                    "unit {u} of width `{}` is out of range (it has {})",
                    g.name, g.units
                )));
            }
            let indices = units
                .iter()
                .flat_map(|u| u * axis.block..(u + 1) * axis.block)
                .collect();
            kept[axis.axis] = Some(indices);
            sliced = true;
        }
    }
    if !sliced {
        return Ok(None);
    }
    Ok(Some(
        kept.into_iter()
            .zip(&tensor.shape)
            .map(|(k, &len)| k.unwrap_or_else(|| (0..len).collect()))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-unit-per-channel flatten: `conv` (4 channels, 3 × 1 × 1 kernels), then `fc`
    /// (2 outputs × (4 channels · 2 positions)).
    fn groups() -> Vec<WidthGroup> {
        vec![WidthGroup {
            name: "conv".into(),
            units: 4,
            norm_groups: 2,
            axes: vec![
                Axis {
                    tensor: "conv.weight".into(),
                    axis: 0,
                    block: 1,
                },
                Axis {
                    tensor: "conv.bias".into(),
                    axis: 0,
                    block: 1,
                },
                Axis {
                    tensor: "fc.weight".into(),
                    axis: 1,
                    block: 2,
                },
            ],
        }]
    }

    fn global() -> ModelState {
        let t = |name: &str, shape: Vec<usize>| {
            let len: usize = shape.iter().product();
            NamedTensor::new(name, shape, (0..len).map(|v| v as f32).collect()).unwrap()
        };
        ModelState::new(vec![
            t("conv.weight", vec![4, 3, 1, 1]),
            t("conv.bias", vec![4]),
            t("fc.weight", vec![2, 8]),
            t("fc.bias", vec![2]),
        ])
        .unwrap()
    }

    /// Channels {1, 3} kept: conv rows 1 and 3, their biases, and fc columns 2, 3 and 6, 7 of
    /// each row; fc's bias stays whole. Values are the global flat indices, so the sliced data
    /// is its own coordinate list.
    #[test]
    fn a_slice_cuts_every_axis_a_width_runs_along() {
        let slice = WidthSlice {
            kept: BTreeMap::from([("conv".to_string(), vec![1, 3])]),
            keep_ratio: 0.5,
            local: Default::default(),
        };
        let sub = slice_state(&global(), &groups(), &slice).unwrap();
        let conv = sub.get("conv.weight").unwrap();
        assert_eq!(conv.shape, vec![2, 3, 1, 1]);
        assert_eq!(conv.data, vec![3.0, 4.0, 5.0, 9.0, 10.0, 11.0]);
        assert_eq!(sub.get("conv.bias").unwrap().data, vec![1.0, 3.0]);
        let fc = sub.get("fc.weight").unwrap();
        assert_eq!(fc.shape, vec![2, 4]);
        assert_eq!(fc.data, vec![2.0, 3.0, 6.0, 7.0, 10.0, 11.0, 14.0, 15.0]);
        assert_eq!(sub.get("fc.bias").unwrap().data, vec![0.0, 1.0]);
        for t in &global().tensors {
            let coords = coordinates(t, &groups(), &slice.kept).unwrap();
            let data = &sub.get(&t.name).unwrap().data;
            match coords {
                Some(c) => assert_eq!(c.iter().map(|&i| i as f32).collect::<Vec<_>>(), *data),
                None => assert_eq!(t.data, *data),
            }
        }
    }

    /// FedRolex in round 2 keeps unit 1 of each norm group of 2 at r = 0.5: channels {1, 3}.
    #[test]
    fn plans_follow_the_strategy_per_norm_group() {
        let policy = WidthPolicy {
            strategy: WidthStrategy::FedRolex,
            groups: groups(),
        };
        let slices = plan_widths(&policy, &[(5, 0.5), (6, 1.0)], 2).unwrap();
        assert_eq!(slices[&5].kept["conv"], vec![1, 3]);
        assert_eq!(slices[&6].kept["conv"], vec![0, 1, 2, 3]);
        assert_eq!(widths_at(&groups(), 0.5).unwrap()["conv"], 2);
    }

    /// Slices {1, 3} and {0, 1} of `conv`: their union {0, 1, 3}. Cut to {1, 3}, `fc.weight`'s
    /// columns are 2, 3, 6, 7 of each row; cut to the union, 0–3 and 6, 7; so the slice's
    /// values sit at places 2, 3, 4, 5 of each union row of 6.
    #[test]
    fn a_slice_sits_inside_the_union_of_a_round() {
        let slice = |units: Vec<usize>| WidthSlice {
            kept: BTreeMap::from([("conv".to_string(), units)]),
            keep_ratio: 0.5,
            local: Default::default(),
        };
        let (a, b) = (slice(vec![1, 3]), slice(vec![0, 1]));
        let union = union_of([&a, &b]);
        assert_eq!(union["conv"], vec![0, 1, 3]);
        let sub = slice_state(&global(), &groups(), &a).unwrap();
        let fc = sub.get("fc.weight").unwrap();
        let places = positions_in_union(fc, &groups(), &a.kept, &union).unwrap();
        assert_eq!(places, Some(vec![2, 3, 4, 5, 8, 9, 10, 11]));
        // The union's coordinates at those places are the slice's own coordinates.
        let whole = global();
        for t in &whole.tensors {
            let cut = sub.get(&t.name).unwrap();
            let own = coordinates(t, &groups(), &a.kept).unwrap();
            let at_union = coordinates(t, &groups(), &union).unwrap();
            match positions_in_union(cut, &groups(), &a.kept, &union).unwrap() {
                Some(places) => {
                    let union = at_union.unwrap();
                    let via: Vec<usize> = places.iter().map(|&p| union[p]).collect();
                    assert_eq!(Some(via), own, "{}", t.name);
                }
                None => assert!(own.is_none() && at_union.is_none()),
            }
        }
        let outside = positions_in_union(fc, &groups(), &a.kept, &b.kept).unwrap_err();
        assert!(
            outside.to_string().contains("outside the round's union"),
            "{outside}"
        );
    }

    #[test]
    fn a_width_that_does_not_fit_is_refused() {
        let mut bad = groups();
        bad[0].axes[2].block = 3;
        let slice = WidthSlice {
            kept: BTreeMap::from([("conv".to_string(), vec![0])]),
            keep_ratio: 0.25,
            local: Default::default(),
        };
        let err = slice_state(&global(), &bad, &slice)
            .unwrap_err()
            .to_string();
        assert!(err.contains("fc.weight"), "{err}");
    }
}
