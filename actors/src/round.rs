//! One round's logic as plain functions over plain data, so it is unit-tested without actors:
//! plan the shards of every participant (ALGORITHMS.md §1.1 steps 1–3) and fold the accepted
//! updates into the global model (step 5, and §2.4 for inverse-probability weights).

use crate::model::{ModelState, NamedTensor};
use crate::payload::DecodedUpdate;
use crate::trainer::{ClientId, LayerShard};
use fedshard_strategies::metrics::anme_layer;
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::sampling::SamplerName;
use fedshard_strategies::sharding::plan::StrategySpec;
use fedshard_strategies::spectrum::kept_terms;
use fedshard_strategies::svd::{Factors, factorize, recompose};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which layers are sharded and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardingPolicy {
    pub strategy: StrategySpec,
    pub sampler: SamplerName,
    /// Names of the decomposable tensors (never the first or last layer of a network).
    pub layers: Vec<String>,
}

/// A participant of the round and the keep ratio of its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Participant {
    pub client: ClientId,
    pub keep_ratio: f64,
}

/// Per (layer, cluster) statistics of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    pub layer: String,
    pub keep_ratio: f64,
    pub clients: usize,
    pub kept: usize,
    pub anme: f64,
    pub expected_discrepancy: Option<f64>,
}

/// The factorised sharded layers of this round and every participant's shards.
#[derive(Debug, Default)]
pub struct ShardPlan {
    /// The round's SVD of each sharded layer, in policy order.
    pub factors: Vec<(String, Factors<f32>)>,
    /// Each participant's shards, keyed by client id.
    pub shards: BTreeMap<ClientId, Vec<LayerShard>>,
    pub groups: Vec<GroupStats>,
}

impl ShardPlan {
    /// Mean ANME over layers and clusters (0 when nothing is sharded).
    pub fn anme(&self) -> f64 {
        if self.groups.is_empty() {
            0.0
        } else {
            self.groups.iter().map(|g| g.anme).sum::<f64>() / self.groups.len() as f64
        }
    }
}

/// The model without its sharded layers: what every client trains densely.
pub fn dense_part(global: &ModelState, policy: Option<&ShardingPolicy>) -> ModelState {
    let sharded = |name: &str| policy.is_some_and(|p| p.layers.iter().any(|l| l == name));
    ModelState {
        tensors: global
            .tensors
            .iter()
            .filter(|t| !sharded(&t.name))
            .cloned()
            .collect(),
    }
}

/// Plans the shards of one round: the SVD of each sharded layer (once per round), the strategy
/// per keep-ratio cluster with C = that cluster's participants, and one joint-sampler draw per
/// client from the stream (seed, round, client, Sharding), layers drawn in policy order.
pub fn plan_shards(
    global: &ModelState,
    policy: &ShardingPolicy,
    participants: &[Participant],
    seed: u64,
    round: u64,
) -> Result<ShardPlan, String> {
    let mut clusters: BTreeMap<u64, Vec<ClientId>> = BTreeMap::new();
    for p in participants {
        clusters
            .entry(p.keep_ratio.to_bits())
            .or_default()
            .push(p.client);
    }
    let mut rngs: BTreeMap<ClientId, _> = participants
        .iter()
        .map(|p| (p.client, stream(seed, round, p.client, Purpose::Sharding)))
        .collect();
    let mut shards: BTreeMap<ClientId, Vec<LayerShard>> = BTreeMap::new();
    let mut factors = Vec::new();
    let mut groups = Vec::new();
    for name in &policy.layers {
        let tensor = global
            .get(name)
            .ok_or_else(|| format!("sharded layer `{name}` is not a tensor of the model"))?;
        let (rows, cols) = tensor.matrix_shape();
        let layer =
            factorize(&tensor.data, rows, cols).map_err(|e| format!("layer `{name}`: {e}"))?;
        let spectrum: Vec<f64> = layer
            .singular_values
            .iter()
            .map(|&s| f64::from(s))
            .collect();
        for (ratio_bits, members) in &clusters {
            let keep_ratio = f64::from_bits(*ratio_bits);
            let kept = kept_terms(spectrum.len(), keep_ratio).map_err(|e| e.to_string())?;
            let plan = policy
                .strategy
                .plan(&spectrum, keep_ratio, kept, members.len(), policy.sampler)
                .map_err(|e| format!("layer `{name}`, keep ratio {keep_ratio}: {e}"))?;
            groups.push(GroupStats {
                layer: name.clone(),
                keep_ratio,
                clients: members.len(),
                kept,
                anme: anme_layer(&plan.marginals.inclusion_probabilities, kept),
                expected_discrepancy: plan.marginals.expected_discrepancy,
            });
            for client in members {
                let rng = rngs.get_mut(client).ok_or("participant without a stream")?;
                let shard = plan.draw(rng);
                shards.entry(*client).or_default().push(LayerShard {
                    name: name.clone(),
                    shape: tensor.shape.clone(),
                    left: gather_rows(&layer.left, rows, &shard.indices),
                    right: gather_rows(&layer.right, cols, &shard.indices),
                    multipliers: shard.multipliers.iter().map(|&w| w as f32).collect(),
                    indices: shard.indices,
                });
            }
        }
        factors.push((name.clone(), layer));
    }
    Ok(ShardPlan {
        factors,
        shards,
        groups,
    })
}

fn gather_rows(matrix: &[f32], width: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        out.extend_from_slice(&matrix[r * width..(r + 1) * width]);
    }
    out
}

/// An accepted update with its aggregation weight.
#[derive(Debug)]
pub struct WeightedUpdate<'a> {
    pub client: ClientId,
    pub weight: f64,
    pub update: &'a DecodedUpdate,
}

/// Folds the accepted updates into the global model.
///
/// Every coordinate moves by the weighted mean (or, when `normalised` is false, the weighted
/// sum — the unbiased inverse-probability estimator of §2.4) of the changes of the clients that
/// trained it: all clients for dense tensors, the holders of term i for column i of the factors
/// (§1.1 step 5: terms nobody held stay unchanged). Sharded layers are then recomposed as
/// W = Σ u'_i v'_iᵀ. Updates are folded in client-id order so the result does not depend on
/// arrival order.
pub fn aggregate(
    global: &mut ModelState,
    plan: &ShardPlan,
    updates: &mut [WeightedUpdate<'_>],
    normalised: bool,
) {
    if updates.is_empty() {
        return;
    }
    updates.sort_by_key(|u| u.client);
    for tensor in global.tensors.iter_mut() {
        let holders: Vec<(f64, &NamedTensor)> = updates
            .iter()
            .filter_map(|u| u.update.dense.get(&tensor.name).map(|t| (u.weight, t)))
            .collect();
        fold(
            &mut tensor.data,
            &holders
                .iter()
                .map(|(w, t)| (*w, t.data.as_slice()))
                .collect::<Vec<_>>(),
            normalised,
        );
    }
    for (layer_index, (name, factors)) in plan.factors.iter().enumerate() {
        let mut factors = factors.clone();
        let (rows, cols) = (factors.rows, factors.cols);
        for term in 0..factors.singular_values.len() {
            let mut left = Vec::new();
            let mut right = Vec::new();
            for u in updates.iter() {
                let shard = &u.update.shards[layer_index];
                if let Ok(j) = shard.indices.binary_search(&term) {
                    left.push((u.weight, &shard.left[j * rows..(j + 1) * rows]));
                    right.push((u.weight, &shard.right[j * cols..(j + 1) * cols]));
                }
            }
            fold(
                &mut factors.left[term * rows..(term + 1) * rows],
                &left,
                normalised,
            );
            fold(
                &mut factors.right[term * cols..(term + 1) * cols],
                &right,
                normalised,
            );
        }
        if let Some(tensor) = global.get_mut(name) {
            tensor.data = recompose(&factors);
        }
    }
}

/// `x ← x + Σ_c w_c (x_c − x) / (Σ_c w_c if normalised)`, accumulated in f64.
fn fold(target: &mut [f32], contributions: &[(f64, &[f32])], normalised: bool) {
    if contributions.is_empty() {
        return;
    }
    let scale = if normalised {
        let total: f64 = contributions.iter().map(|(w, _)| w).sum();
        if total <= 0.0 {
            return;
        }
        1.0 / total
    } else {
        1.0
    };
    for (k, x) in target.iter_mut().enumerate() {
        let old = f64::from(*x);
        let delta: f64 = contributions
            .iter()
            .map(|(w, c)| w * (f64::from(c[k]) - old))
            .sum();
        *x = (old + scale * delta) as f32;
    }
}
