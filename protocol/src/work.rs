//! How much computation a training task is: the multiply-adds of one sample's forward pass
//! through the model's weights, dense or factorised. Simulated time scales a device's speed by
//! a task's share of the full model's multiply-adds (docs/async.md, "Simulated time"), so a
//! sub-model's cost follows where its arithmetic is: a convolution's weight is used at every
//! output position of an image, a linear layer's once per feature vector (or per token).
//!
//! Products of two activations (attention's scores and its weighted sum of the values, a
//! pooling's weighted sum of the tokens) count too, at the width of the activations they
//! multiply: a shard narrows a projection's rank, not its output, so these do not change with
//! the keep ratio, and a transformer's share stays nearer 1 than its weights' share alone.
//!
//! The backward pass costs about twice the forward pass for every product alike, so the share
//! is the same for a training step. Element-wise work (norms, activations, biases) is not
//! counted.

use crate::model::{ModelState, NamedTensor};
use crate::task::LayerShard;
use crate::width::{WidthGroup, sliced_len};
use fedshard_strategies::StrategyError;
use fedshard_strategies::spectrum::kept_terms;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a weight tensor's layer applies in one sample's forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightUse {
    /// Positions at which the layer applies: 1 for a linear layer on a feature vector, the
    /// output's H · W for a convolution, the tokens for a transformer's linear layers. Each
    /// value of the weight takes part in one multiply-add per position.
    pub positions: u64,
    /// A convolution, whose shard runs as its factors (a convolution with the n filters, then a
    /// 1 × 1 convolution) only where that is cheaper than the composed weight
    /// ([`factors_are_cheaper`]); a linear layer always runs its factors.
    pub convolution: bool,
}

/// The multiply-add counts of a model's weights, by tensor name.
pub type WeightUses = BTreeMap<String, WeightUse>;

/// Whether `n` factor pairs of a `rows × cols` matrix (`rows + cols` values each) cost fewer
/// multiply-adds per position than the matrix they compose.
pub fn factors_are_cheaper(n: usize, rows: usize, cols: usize) -> bool {
    n * (rows + cols) < rows * cols
}

/// Where one sample's forward pass multiplies: at each weight's uses, and between two
/// activations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Arithmetic {
    /// Where each weight applies.
    pub weights: WeightUses,
    /// Multiply-adds of products between two activations (attention, pooling), the same for
    /// every sub-model.
    pub between_activations: u64,
}

/// A model's multiply-add count: its [`Arithmetic`] and the full model's total, which a task's
/// share is taken of.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelWork {
    arithmetic: Arithmetic,
    full: u64,
}

impl ModelWork {
    /// The count of the model that multiplies as `arithmetic` says, `full_model` its tensors.
    /// Without weight uses (a model that is never sharded) every task counts as the whole
    /// model.
    pub fn new(arithmetic: Arithmetic, full_model: &ModelState) -> Self {
        let full = if arithmetic.weights.is_empty() {
            0
        } else {
            multiply_adds(full_model, &[], &arithmetic.weights) + arithmetic.between_activations
        };
        Self { arithmetic, full }
    }

    /// The full model's multiply-adds per sample (0 without weight uses).
    pub fn full(&self) -> u64 {
        self.full
    }

    /// A task's share of the full model's multiply-adds per sample, in (0, 1] (1 without
    /// weight uses).
    pub fn share(&self, dense: &ModelState, shards: &[LayerShard]) -> f64 {
        if self.full == 0 {
            return 1.0;
        }
        let task = multiply_adds(dense, shards, &self.arithmetic.weights)
            + self.arithmetic.between_activations;
        (task as f64 / self.full as f64).min(1.0)
    }
}

/// Multiply-adds per sample of a forward pass through the weights of `dense` and `shards`
/// under `uses`; a tensor without a use (a bias, a norm, an embedding table) counts none.
pub fn multiply_adds(dense: &ModelState, shards: &[LayerShard], uses: &WeightUses) -> u64 {
    let dense: u64 = dense
        .tensors
        .iter()
        .filter_map(|t| Some(uses.get(&t.name)?.positions * t.data.len() as u64))
        .sum();
    let shards: u64 = shards
        .iter()
        .filter_map(|s| {
            let used = uses.get(&s.name)?;
            Some(shard_multiply_adds(
                used,
                s.indices.len(),
                s.rows(),
                s.cols(),
            ))
        })
        .sum();
    dense + shards
}

/// Multiply-adds per sample of `n` terms of a `rows × cols` layer used as `used` says: its
/// factors, or for a convolution the composed weight where that is cheaper.
fn shard_multiply_adds(used: &WeightUse, n: usize, rows: usize, cols: usize) -> u64 {
    let per_position = if !used.convolution || factors_are_cheaper(n, rows, cols) {
        n * (rows + cols)
    } else {
        rows * cols
    };
    used.positions * per_position as u64
}

impl ModelWork {
    /// The share of a spectral sub-model of `global` that keeps `⌈r · N⌉` terms
    /// ([`kept_terms`]) of each layer of `layers` (N = min(rows, cols)) and the rest dense: what a
    /// client at keep ratio r computes. Errors unless `r ∈ (0, 1]`.
    pub fn spectral_share(
        &self,
        global: &ModelState,
        layers: &[String],
        keep_ratio: f64,
    ) -> Result<f64, StrategyError> {
        kept_terms(1, keep_ratio)?;
        Ok(self.share_by(global, |t, used| {
            if !layers.contains(&t.name) {
                return used.positions * t.data.len() as u64;
            }
            let (rows, cols) = t.matrix_shape();
            let n = kept_terms(rows.min(cols), keep_ratio).unwrap_or(rows.min(cols));
            shard_multiply_adds(used, n, rows, cols)
        }))
    }

    /// The share of a width sub-model of `global` whose widths keep `widths` units
    /// ([`crate::width::sliced_len`] of each weight).
    pub fn width_share(
        &self,
        global: &ModelState,
        groups: &[WidthGroup],
        widths: &BTreeMap<String, usize>,
    ) -> f64 {
        self.share_by(global, |t, used| {
            used.positions * sliced_len(t, groups, widths)
        })
    }

    /// The share of the full model's multiply-adds of a sub-model whose weight `t` (used as
    /// the count says) costs `cost(t, use)`; 1 without weight uses.
    fn share_by(&self, global: &ModelState, cost: impl Fn(&NamedTensor, &WeightUse) -> u64) -> f64 {
        if self.full == 0 {
            return 1.0;
        }
        let uses = &self.arithmetic.weights;
        let task: u64 = global
            .tensors
            .iter()
            .filter_map(|t| Some(cost(t, uses.get(&t.name)?)))
            .sum();
        ((task + self.arithmetic.between_activations) as f64 / self.full as f64).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NamedTensor;

    fn shard(name: &str, shape: [usize; 2], n: usize) -> LayerShard {
        LayerShard {
            name: name.into(),
            shape: shape.to_vec(),
            indices: (0..n).collect(),
            left: vec![0.0; n * shape[0]],
            right: vec![0.0; n * shape[1]],
            multipliers: vec![1.0; n],
        }
    }

    /// A convolution 32 × 144 at 16 positions and a linear layer 128 × 256 used once, dense and
    /// at rank 8 and 30; the bias counts nothing.
    #[test]
    fn factors_count_their_products_and_a_convolution_takes_the_cheaper_form() {
        let uses = WeightUses::from([
            (
                "conv.weight".to_string(),
                WeightUse {
                    positions: 16,
                    convolution: true,
                },
            ),
            (
                "fc.weight".to_string(),
                WeightUse {
                    positions: 1,
                    convolution: false,
                },
            ),
        ]);
        let dense = ModelState::new(vec![
            NamedTensor::zeros("conv.weight", vec![32, 16, 3, 3]),
            NamedTensor::zeros("fc.weight", vec![128, 256]),
            NamedTensor::zeros("fc.bias", vec![128]),
        ])
        .expect("valid");
        assert_eq!(multiply_adds(&dense, &[], &uses), 16 * 32 * 144 + 128 * 256);
        let bias_only =
            ModelState::new(vec![NamedTensor::zeros("fc.bias", vec![128])]).expect("valid");
        // Rank 8: both layers run their factors.
        let low = [
            shard("conv.weight", [32, 144], 8),
            shard("fc.weight", [128, 256], 8),
        ];
        assert_eq!(
            multiply_adds(&bias_only, &low, &uses),
            16 * 8 * (32 + 144) + 8 * (128 + 256)
        );
        // Rank 30: 30 · 176 > 32 · 144, so the convolution runs composed; the linear layer
        // still runs its factors.
        let high = [
            shard("conv.weight", [32, 144], 30),
            shard("fc.weight", [128, 256], 30),
        ];
        assert!(!factors_are_cheaper(30, 32, 144));
        assert_eq!(
            multiply_adds(&bias_only, &high, &uses),
            16 * 32 * 144 + 30 * (128 + 256)
        );
    }

    /// A task's share of the full model, products between activations counted in both; every
    /// task is the whole model when nothing says where the weights apply (FedPM, ridge: never
    /// sharded).
    #[test]
    fn a_share_is_of_the_full_models_count_and_one_without_uses() {
        let uses = WeightUses::from([(
            "fc.weight".to_string(),
            WeightUse {
                positions: 2,
                convolution: false,
            },
        )]);
        let full =
            ModelState::new(vec![NamedTensor::zeros("fc.weight", vec![100, 50])]).expect("valid");
        let empty = ModelState::new(vec![]).expect("valid");
        let rank_10 = [shard("fc.weight", [100, 50], 10)];
        let weights_only = Arithmetic {
            weights: uses.clone(),
            between_activations: 0,
        };
        let work = ModelWork::new(weights_only, &full);
        assert_eq!(work.full(), 10_000);
        assert_eq!(work.share(&full, &[]), 1.0);
        assert_eq!(work.share(&empty, &rank_10), 3000.0 / 10_000.0);
        // Products between activations count in every task's and the full model's total.
        let with_scores = Arithmetic {
            weights: uses,
            between_activations: 2_000,
        };
        let work = ModelWork::new(with_scores, &full);
        assert_eq!(work.full(), 12_000);
        assert_eq!(work.share(&empty, &rank_10), 5000.0 / 12_000.0);
        let none = ModelWork::new(Arithmetic::default(), &full);
        assert_eq!(none.full(), 0);
        assert_eq!(none.share(&empty, &rank_10), 1.0);
        let scores_only = Arithmetic {
            weights: WeightUses::new(),
            between_activations: 2_000,
        };
        assert_eq!(
            ModelWork::new(scores_only, &full).share(&empty, &rank_10),
            1.0
        );
    }
}
