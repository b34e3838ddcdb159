//! The shards of one round: the SVD of every sharded layer and each participant's columns of
//! its factors (docs/algorithms.md §1.1 steps 1–3), as plain functions over plain data.

use crate::error::Error;
use crate::model::ModelState;
use crate::task::{ClientId, LayerShard};
use crate::width::{WidthGroup, WidthPolicy, WidthSlice, plan_widths};
use fedshard_strategies::metrics::anme_layer;
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::sampling::SamplerName;
use fedshard_strategies::sharding::plan::StrategySpec;
use fedshard_strategies::spectrum::kept_terms;
use fedshard_strategies::svd::{Factors, factorize};
use rayon::prelude::*;
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

/// How a run shards its model: the terms of each layer's SVD, or the units of each width.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "kebab-case")]
pub enum Sharding {
    Spectral(ShardingPolicy),
    Width(WidthPolicy),
}

impl Sharding {
    /// The layers sent as factor columns (none under a width strategy).
    pub fn spectral_layers(&self) -> &[String] {
        match self {
            Sharding::Spectral(p) => &p.layers,
            Sharding::Width(_) => &[],
        }
    }
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
    /// Under a width strategy: the model's widths and every participant's slice (then there
    /// are no factors or shards).
    pub width: Option<WidthPlan>,
}

/// A round's width slices: the model's widths and the units each participant keeps.
#[derive(Debug, Clone, Default)]
pub struct WidthPlan {
    pub groups: Vec<WidthGroup>,
    pub slices: BTreeMap<ClientId, WidthSlice>,
}

/// Plans one round under `sharding`: [`plan_shards`] for a spectral strategy, every
/// participant's [`WidthSlice`] for a width strategy.
pub fn plan_round(
    global: &ModelState,
    sharding: &Sharding,
    participants: &[Participant],
    seed: u64,
    round: u64,
) -> Result<ShardPlan, Error> {
    match sharding {
        Sharding::Spectral(policy) => plan_shards(global, policy, participants, seed, round),
        Sharding::Width(policy) => {
            let ratios: Vec<(ClientId, f64)> = participants
                .iter()
                .map(|p| (p.client, p.keep_ratio))
                .collect();
            Ok(ShardPlan {
                width: Some(WidthPlan {
                    groups: policy.groups.clone(),
                    slices: plan_widths(policy, &ratios, round)?,
                }),
                ..ShardPlan::default()
            })
        }
    }
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
) -> Result<ShardPlan, Error> {
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
    let tensors = policy
        .layers
        .iter()
        .map(|name| {
            global
                .get(name)
                .ok_or_else(|| Error::UnknownLayer(name.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Each SVD runs on one core, so its factors are the same on any machine; the layers are
    // independent, so a model with many of them still uses every core.
    let factorized: Vec<_> = tensors
        .par_iter()
        .map(|tensor| {
            let (rows, cols) = tensor.matrix_shape();
            factorize(&tensor.data, rows, cols)
        })
        .collect();
    for ((name, tensor), layer) in policy.layers.iter().zip(tensors).zip(factorized) {
        let (rows, cols) = tensor.matrix_shape();
        let layer = layer.map_err(|source| Error::Factorize {
            layer: name.clone(),
            source,
        })?;
        let spectrum: Vec<f64> = layer
            .singular_values
            .iter()
            .map(|&s| f64::from(s))
            .collect();
        for (ratio_bits, members) in &clusters {
            let keep_ratio = f64::from_bits(*ratio_bits);
            let kept = kept_terms(spectrum.len(), keep_ratio)?;
            let plan = policy
                .strategy
                .plan(&spectrum, keep_ratio, kept, members.len(), policy.sampler)
                .map_err(|source| Error::Plan {
                    layer: name.clone(),
                    keep_ratio,
                    source,
                })?;
            groups.push(GroupStats {
                layer: name.clone(),
                keep_ratio,
                clients: members.len(),
                kept,
                anme: anme_layer(&plan.marginals.inclusion_probabilities, kept),
                expected_discrepancy: plan.marginals.expected_discrepancy,
            });
            for client in members {
                let rng = rngs.get_mut(client).ok_or(Error::NoStream(*client))?;
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
        width: None,
    })
}

fn gather_rows(matrix: &[f32], width: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        out.extend_from_slice(&matrix[r * width..(r + 1) * width]);
    }
    out
}
