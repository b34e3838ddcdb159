//! Width slicing, the sub-model baselines that cut a model by its channels and neurons instead of
//! its spectrum (docs/algorithms.md §8): HeteroFL (Diao et al., ICLR 2021) keeps the leading
//! `⌈r · K⌉` units of every hidden width, FedRolex (Alam et al., NeurIPS 2022, Algorithm 1) a
//! window of the same size whose start advances one unit per round and wraps around, and FjORD
//! (Horváth et al., NeurIPS 2021) HeteroFL's leading units as the client's largest width, of
//! which each local batch trains a narrower prefix drawn by ordered dropout
//! ([`WidthStrategy::ordered_dropout_levels`]).
//!
//! A width here is one hidden dimension of the model (a convolution's output channels, a linear
//! layer's neurons, an attention block's heads) of `K` units, split into `G` consecutive equal
//! norm groups (a GroupNorm's groups; `G = 1` otherwise). The selection keeps the same number of
//! units in every norm group, chosen inside each group by the strategy, so a sliced GroupNorm's
//! groups are the global groups' kept parts: a unit never changes group between the global model
//! and a client's.

use crate::{Result, StrategyError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The width-slicing strategies, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WidthStrategy {
    /// HeteroFL: the leading units, the same every round (a static nested slice).
    #[serde(rename = "heterofl")]
    HeteroFl,
    /// FedRolex: a rolling window starting at `round mod K`, wrapping around.
    #[serde(rename = "fedrolex")]
    FedRolex,
    /// FjORD: HeteroFL's leading units up to the client's capacity, of which every local batch
    /// trains the leading units at a level drawn uniformly from [`FJORD_LEVELS`] (ordered
    /// dropout), without a scaler.
    #[serde(rename = "fjord")]
    FjOrd,
}

/// Every accepted width-strategy name.
pub const WIDTH_NAMES: &str = "heterofl, fedrolex, fjord";

/// FjORD's width levels: the paper's uniform distribution over five levels (its experiments'
/// `D_p = U_5`), as in Flower's FjORD baseline (`p_s = [0.2, …, 1.0]`).
pub const FJORD_LEVELS: [f64; 5] = [0.2, 0.4, 0.6, 0.8, 1.0];

impl WidthStrategy {
    pub const ALL: [WidthStrategy; 3] = [
        WidthStrategy::HeteroFl,
        WidthStrategy::FedRolex,
        WidthStrategy::FjOrd,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WidthStrategy::HeteroFl => "heterofl",
            WidthStrategy::FedRolex => "fedrolex",
            WidthStrategy::FjOrd => "fjord",
        }
    }

    /// The levels a client of capacity `keep_ratio` draws a width from for each local batch,
    /// ascending; `None` for the strategies that train their whole slice every batch.
    ///
    /// FjORD's ordered dropout (the paper's §3.1 and Algorithm 1; Flower's `ODSampler`): a
    /// client of tier `p_max` samples `p ~ U(P_{≤ p_max})` per batch, the levels of
    /// [`FJORD_LEVELS`] up to its capacity. A capacity that is not a level (a keep ratio of
    /// 0.1, or 0.5) is added as the top level, so every client trains its whole slice
    /// sometimes and a capacity below the lowest level still trains.
    pub fn ordered_dropout_levels(self, keep_ratio: f64) -> Option<Vec<f64>> {
        (self == WidthStrategy::FjOrd).then(|| {
            let mut levels: Vec<f64> = FJORD_LEVELS
                .into_iter()
                .filter(|&p| p <= keep_ratio + 1e-9)
                .collect();
            if levels.last().is_none_or(|&p| (p - keep_ratio).abs() > 1e-9) {
                levels.push(keep_ratio);
            }
            levels
        })
    }

    /// The kept units of a width of `units` units in `norm_groups` groups at `keep_ratio`, in
    /// round `round` (rounds count from 1), ascending: [`kept_units`] of them, the same number
    /// from each norm group.
    ///
    /// * HeteroFL and FjORD: units `0 … k−1` of each group (HeteroFL's `idx[:ceil(rate · size)]`,
    ///   FjORD's `weight[:ceil(width · p)]`).
    /// * FedRolex: units `s, s+1, …, s+k−1 (mod m)` of each group of `m` units, with
    ///   `s = (round − 1) mod m`: the window of the paper's Algorithm 1, which starts at the
    ///   first unit in the first round and moves by one unit per round, wrapping around, so
    ///   that every unit is trained equally often over `m` rounds.
    ///
    /// Errors unless `units ≥ 1`, `norm_groups` divides `units`, and `keep_ratio ∈ (0, 1]`.
    pub fn kept(
        self,
        units: usize,
        norm_groups: usize,
        keep_ratio: f64,
        round: u64,
    ) -> Result<Vec<usize>> {
        let per_group = kept_units(units, norm_groups, keep_ratio)? / norm_groups;
        let group = units / norm_groups;
        let start = match self {
            WidthStrategy::HeteroFl | WidthStrategy::FjOrd => 0,
            WidthStrategy::FedRolex => (round.saturating_sub(1) % group as u64) as usize,
        };
        let mut kept = Vec::with_capacity(per_group * norm_groups);
        for g in 0..norm_groups {
            let mut local: Vec<usize> = (0..per_group).map(|i| (start + i) % group).collect();
            local.sort_unstable();
            kept.extend(local.into_iter().map(|u| g * group + u));
        }
        Ok(kept)
    }
}

/// How many of `units` units in `norm_groups` equal groups a keep ratio keeps:
/// `G · ⌈r · K / G⌉`, at least one unit per group (HeteroFL's `ceil(rate · size)` for `G = 1`).
///
/// Errors unless `units ≥ 1`, `norm_groups ≥ 1` divides `units`, and `keep_ratio ∈ (0, 1]`.
pub fn kept_units(units: usize, norm_groups: usize, keep_ratio: f64) -> Result<usize> {
    if units == 0 {
        return Err(StrategyError::invalid(
            "width",
            "a width has at least one unit",
        ));
    }
    if norm_groups == 0 || !units.is_multiple_of(norm_groups) {
        return Err(StrategyError::invalid(
            "norm groups",
            format!("{norm_groups} groups do not split {units} units evenly"),
        ));
    }
    if !(keep_ratio > 0.0 && keep_ratio <= 1.0) {
        return Err(StrategyError::invalid(
            "keep ratio",
            format!("{keep_ratio} is not in (0, 1]"),
        ));
    }
    let group = units / norm_groups;
    let per_group = ((keep_ratio * group as f64).ceil() as usize).clamp(1, group);
    Ok(per_group * norm_groups)
}

impl fmt::Display for WidthStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WidthStrategy {
    type Err = StrategyError;

    fn from_str(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| StrategyError::UnknownName {
                kind: "width strategy",
                name: name.to_string(),
                valid: WIDTH_NAMES.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Index sets computed by hand: K = 8 units, r = 0.25 keeps ⌈2⌉ = 2; r = 0.3 keeps ⌈2.4⌉ = 3.
    #[test]
    fn heterofl_keeps_the_leading_units() {
        let h = WidthStrategy::HeteroFl;
        assert_eq!(h.kept(8, 1, 0.25, 1).unwrap(), vec![0, 1]);
        assert_eq!(h.kept(8, 1, 0.3, 7).unwrap(), vec![0, 1, 2]);
        assert_eq!(h.kept(8, 1, 1.0, 3).unwrap(), (0..8).collect::<Vec<_>>());
        // Two norm groups of 4: ⌈0.25 · 4⌉ = 1 unit of each, the leading one.
        assert_eq!(h.kept(8, 2, 0.25, 1).unwrap(), vec![0, 4]);
        // A tiny ratio still keeps one unit per group.
        assert_eq!(h.kept(8, 2, 0.01, 1).unwrap(), vec![0, 4]);
    }

    /// FedRolex's window of 3 of 8 units starts at unit (round − 1) mod 8 and wraps:
    /// round 1 → {0,1,2}, round 2 → {1,2,3}, round 7 → {6,7,0}, round 9 → {0,1,2} again.
    #[test]
    fn fedrolex_rolls_one_unit_per_round_and_wraps() {
        let f = WidthStrategy::FedRolex;
        assert_eq!(f.kept(8, 1, 0.3, 1).unwrap(), vec![0, 1, 2]);
        assert_eq!(f.kept(8, 1, 0.3, 2).unwrap(), vec![1, 2, 3]);
        assert_eq!(f.kept(8, 1, 0.3, 7).unwrap(), vec![0, 6, 7]);
        assert_eq!(f.kept(8, 1, 0.3, 9).unwrap(), vec![0, 1, 2]);
        // Two groups of 4 units, 2 kept in each, round 4: start 3 → {3, 0} in each group.
        assert_eq!(f.kept(8, 2, 0.5, 4).unwrap(), vec![0, 3, 4, 7]);
    }

    /// Over K rounds every unit of a FedRolex width is kept exactly k times.
    #[test]
    fn fedrolex_trains_every_unit_equally_often() {
        let (units, ratio) = (10, 0.3);
        let mut count = [0usize; 10];
        for round in 1..=units as u64 {
            for u in WidthStrategy::FedRolex
                .kept(units, 1, ratio, round)
                .unwrap()
            {
                count[u] += 1;
            }
        }
        assert!(count.iter().all(|&c| c == 3), "{count:?}");
    }

    /// FjORD keeps HeteroFL's leading units; its levels are the uniform-5 grid up to the
    /// capacity, with a capacity off the grid as the top level.
    #[test]
    fn fjord_draws_from_the_levels_up_to_the_capacity() {
        let f = WidthStrategy::FjOrd;
        assert_eq!(f.kept(8, 2, 0.5, 9).unwrap(), vec![0, 1, 4, 5]);
        assert_eq!(
            f.ordered_dropout_levels(1.0).unwrap(),
            FJORD_LEVELS.to_vec()
        );
        assert_eq!(f.ordered_dropout_levels(0.4).unwrap(), vec![0.2, 0.4]);
        assert_eq!(f.ordered_dropout_levels(0.5).unwrap(), vec![0.2, 0.4, 0.5]);
        assert_eq!(f.ordered_dropout_levels(0.1).unwrap(), vec![0.1]);
        assert_eq!(WidthStrategy::HeteroFl.ordered_dropout_levels(0.5), None);
        assert_eq!(WidthStrategy::FedRolex.ordered_dropout_levels(0.5), None);
    }

    #[test]
    fn refuses_what_it_cannot_slice() {
        assert!(kept_units(0, 1, 0.5).is_err());
        assert!(kept_units(6, 4, 0.5).is_err());
        assert!(kept_units(6, 2, 0.0).is_err());
        assert!(kept_units(6, 2, 1.5).is_err());
        let err = "heterofll"
            .parse::<WidthStrategy>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("fedrolex"), "{err}");
    }
}
