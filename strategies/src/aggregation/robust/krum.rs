//! The selection rules (docs/algorithms.md §9.2 and §9.3): Krum and Multi-Krum keep the updates
//! closest to their n − f − 2 nearest neighbours; Bulyan keeps n − 2f updates by repeated Krum
//! and then averages, per coordinate, those closest to their median. Flower's
//! `aggregate_krum`, `_compute_distances`, `aggregate_bulyan` and
//! `_aggregate_n_closest_weights` (flwr 1.42, `server/strategy/aggregate.py`) are the
//! reference, tie-breaking included; where fedshard departs from them, the doc says so.

use super::{Changes, Statistic};
use crate::{Result, StrategyError};
use std::fmt;
use std::num::NonZeroUsize;

/// `‖x_i − x_j‖²` of every pair of flat changes (Flower's `_compute_distances`; it squares
/// `np.linalg.norm` of the difference, which rounds differently in the last bits).
fn squared_distances(vectors: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let n = vectors.len();
    let mut d = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in i + 1..n {
            let s: f64 = vectors[i]
                .iter()
                .zip(&vectors[j])
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            d[i][j] = s;
            d[j][i] = s;
        }
    }
    d
}

/// The Krum score of each update of `active` among `active` (Blanchard et al. 2017, §4:
/// `s(i) = Σ_{i→j} ‖V_i − V_j‖²` over its n − f − 2 nearest neighbours), exactly as Flower's
/// `aggregate_krum` forms it with `r = |active|`: the row of squared distances sorted, its
/// first entry (the update's zero distance to itself) skipped, and the next `max(1, r − f − 2)`
/// summed, as many as there are (Bulyan's last rounds have fewer).
fn scores(distances: &[Vec<f64>], active: &[usize], f: usize) -> Vec<f64> {
    let closest = active.len().saturating_sub(f + 2).max(1);
    active
        .iter()
        .map(|&i| {
            let mut row: Vec<f64> = active.iter().map(|&j| distances[i][j]).collect();
            row.sort_by(f64::total_cmp);
            row.iter().skip(1).take(closest).sum()
        })
        .collect()
}

/// The position of the smallest score, the first one on a tie (`np.argmin`).
fn argmin(scores: &[f64]) -> usize {
    let mut best = 0;
    for (i, s) in scores.iter().enumerate() {
        if s.total_cmp(&scores[best]).is_lt() {
            best = i;
        }
    }
    best
}

/// Krum (m = 1) and Multi-Krum (m ≥ 2) with f assumed Byzantine clients (Blanchard et al.,
/// "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017, §4;
/// Flower's `aggregate_krum`, the `Krum` strategy): every update is scored by its Krum score (`scores` below), and
/// the model moves by the update of the smallest score (Krum; Flower's
/// `num_clients_to_keep = 0`), or by the m updates of the smallest scores averaged by sample
/// count, `Σ n_c ΔW_c / Σ n_c` (Multi-Krum; Flower's `num_clients_to_keep = m`, whose
/// `aggregate(best_results)` weighs them so).
///
/// Ties: equal scores keep results order, that is client-id order (`np.argmin` keeps the first;
/// Multi-Krum's `np.argsort` is not a stable sort, so Flower's choice among tied scores at the
/// m-th place is unspecified, and fedshard's is the first).
///
/// A round of n ≤ 2f + 2 results, or fewer than m, is declined: the guarantee of Blanchard et
/// al. (Proposition 1) needs n > 2f + 2. Flower there clamps the neighbours to one and goes on
/// (and with m > n keeps fewer than m), which fedshard does not reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Krum {
    /// f, the Byzantine clients assumed among a round's results.
    pub f: usize,
    /// m, the updates kept and averaged (1: Krum).
    pub m: NonZeroUsize,
}

impl fmt::Display for Krum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{ kind = \"{}\", f = {}, m = {} }}",
            Self::NAME,
            self.f,
            self.m
        )
    }
}

impl Statistic for Krum {
    const NAME: &'static str = "krum";

    /// `max(2f + 3, m)`.
    fn min_results(&self) -> usize {
        (2 * self.f + 3).max(self.m.get())
    }

    fn change(&self, changes: &Changes) -> Result<Vec<f64>> {
        let n = changes.len();
        let distances = squared_distances(&changes.vectors);
        let all: Vec<usize> = (0..n).collect();
        let scores = scores(&distances, &all, self.f);
        let mut ranked = all;
        ranked.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
        let mut kept = ranked[..self.m.get()].to_vec();
        if let [best] = kept[..] {
            return Ok(changes.vectors[best].clone());
        }
        kept.sort_unstable();
        let samples: Vec<f64> = kept.iter().map(|&c| changes.samples[c]).collect();
        let total: f64 = samples.iter().sum();
        if samples.iter().any(|s| !s.is_finite() || *s < 0.0) || total <= 0.0 {
            return Err(StrategyError::invalid(
                "result samples",
                format!(
                    "Multi-Krum averages the {} kept updates by sample count, and they report \
                     {samples:?}; need finite counts ≥ 0 with a positive sum",
                    kept.len()
                ),
            ));
        }
        let mut delta = vec![0.0; changes.dimension()];
        for (&c, &s) in kept.iter().zip(&samples) {
            for (d, x) in delta.iter_mut().zip(&changes.vectors[c]) {
                *d += s * x;
            }
        }
        delta.iter_mut().for_each(|d| *d /= total);
        Ok(delta)
    }
}

/// Bulyan with f assumed Byzantine clients (El Mhamdi et al., "The Hidden Vulnerability of
/// Distributed Learning in Byzantium", ICML 2018, Algorithm 1; Flower's `aggregate_bulyan` with
/// `aggregate_krum` as the first rule, the `Bulyan` strategy): with `θ = n − 2f` and
/// `β = θ − 2f`,
/// 1. θ times, Krum (f, over the updates not yet chosen) chooses one update, which leaves the
///    pool (Flower: `results.pop(best_idx)`; its `_find_reference_weights` finds the first
///    update equal to Krum's, which is Krum's own);
/// 2. per coordinate, the median of the θ chosen values, then the mean of the β values closest
///    to it (`_aggregate_n_closest_weights`). Sample counts are ignored.
///
/// Ties: Krum's as in [`Krum`]; two values equally far from the median are taken smaller value
/// first (Flower's `np.argpartition` leaves their order unspecified).
///
/// A round of fewer than 4f + 3 results is declined (Flower raises `ValueError`: the paper's
/// bound on the attacker's leeway needs n ≥ 4f + 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bulyan {
    /// f, the Byzantine clients assumed among a round's results.
    pub f: usize,
}

impl fmt::Display for Bulyan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{ kind = \"{}\", f = {} }}", Self::NAME, self.f)
    }
}

impl Statistic for Bulyan {
    const NAME: &'static str = "bulyan";

    /// `4f + 3`.
    fn min_results(&self) -> usize {
        4 * self.f + 3
    }

    fn change(&self, changes: &Changes) -> Result<Vec<f64>> {
        let n = changes.len();
        let theta = n - 2 * self.f;
        let beta = theta - 2 * self.f;
        let distances = squared_distances(&changes.vectors);
        let mut pool: Vec<usize> = (0..n).collect();
        let mut chosen = Vec::with_capacity(theta);
        for _ in 0..theta {
            let best = argmin(&scores(&distances, &pool, self.f));
            chosen.push(pool.remove(best));
        }
        let mut column: Vec<f64> = Vec::with_capacity(theta);
        let mut sorted: Vec<f64> = Vec::with_capacity(theta);
        Ok((0..changes.dimension())
            .map(|k| {
                column.clear();
                column.extend(chosen.iter().map(|&c| changes.vectors[c][k]));
                sorted.clone_from(&column);
                sorted.sort_by(f64::total_cmp);
                let median = if theta % 2 == 1 {
                    sorted[theta / 2]
                } else {
                    (sorted[theta / 2 - 1] + sorted[theta / 2]) / 2.0
                };
                column.sort_by(|a, b| {
                    (a - median)
                        .abs()
                        .total_cmp(&(b - median).abs())
                        .then(a.total_cmp(b))
                });
                column[..beta].iter().sum::<f64>() / beta as f64
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores by hand: 1-value changes 0, 1, 3, 10 with f = 0 sum the n − 2 = 2 nearest:
    /// 0 → 1 + 9 = 10, 1 → 1 + 4 = 5, 3 → 4 + 9 = 13, 10 → 49 + 81 = 130. Over a pool of one,
    /// nothing is left to sum after the update itself (Bulyan's last round with f = 0).
    #[test]
    fn krum_scores_by_hand() {
        let vectors: Vec<Vec<f64>> = [0.0, 1.0, 3.0, 10.0].iter().map(|&v| vec![v]).collect();
        let d = squared_distances(&vectors);
        assert_eq!(scores(&d, &[0, 1, 2, 3], 0), [10.0, 5.0, 13.0, 130.0]);
        assert_eq!(scores(&d, &[2], 0), [0.0]);
        // r − f − 2 ≤ 0 clamps to one neighbour: 0 → 1, 1 → 1, 10 → 81.
        assert_eq!(scores(&d, &[0, 1, 3], 2), [1.0, 1.0, 81.0]);
        assert_eq!(argmin(&[3.0, 1.0, 1.0]), 1);
    }
}
