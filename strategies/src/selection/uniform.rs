//! Uniform selection: `m` of the `K` clients without replacement, each with `p_k = m/K`.

use super::{ClientSelector, ClientStats, Selection, validate_clients};
use crate::rng::ChaCha20Rng;
use crate::{Result, StrategyError};
use rand::Rng;
use std::collections::HashMap;

/// `m` clients drawn uniformly without replacement (the FedAvg default and the baseline of
/// docs/algorithms.md §2). Keep ratios and update norms are ignored; the budget counts clients.
#[derive(Debug, Clone, Copy, Default)]
pub struct UniformSelector;

impl UniformSelector {
    /// The number of clients `m` to draw: `budget` rounded to the nearest integer, which must be
    /// at least 1; `m ≥ K` selects everyone.
    fn sample_size(clients: &[ClientStats], budget: f64) -> Result<usize> {
        validate_clients(clients)?;
        let m = budget.round();
        if !m.is_finite() || m < 1.0 {
            return Err(StrategyError::invalid(
                "selection budget",
                format!("uniform selection needs at least one client, got budget {budget}"),
            ));
        }
        Ok(if m >= clients.len() as f64 {
            clients.len()
        } else {
            m as usize
        })
    }
}

/// `p_k = m/K` for each of the `k` clients.
fn equal(m: usize, k: usize) -> Vec<f64> {
    vec![m as f64 / k as f64; k]
}

/// A uniform integer in `0..bound` (`bound ≥ 1`) by Lemire's multiply-and-reject method, exact
/// (no modulo bias).
fn uniform_below(rng: &mut impl Rng, bound: u64) -> u64 {
    let threshold = bound.wrapping_neg() % bound;
    loop {
        let product = u128::from(rng.next_u64()) * u128::from(bound);
        if (product as u64) >= threshold {
            return (product >> 64) as u64;
        }
    }
}

impl ClientSelector for UniformSelector {
    fn name(&self) -> &'static str {
        "uniform"
    }

    fn needs_update_norms(&self) -> bool {
        false
    }

    fn probabilities(&self, clients: &[ClientStats], budget: f64) -> Result<Vec<f64>> {
        let m = Self::sample_size(clients, budget)?;
        Ok(equal(m, clients.len()))
    }

    /// A partial Fisher–Yates shuffle: `m` draws, each one uniform integer. The shuffled
    /// positions are kept sparsely (only those a swap moved), so a round of `m` clients out of
    /// a million registered ones touches `m` entries, not a vector of a million; the swaps and
    /// so the draws are the dense shuffle's.
    fn select(
        &self,
        clients: &[ClientStats],
        budget: f64,
        rng: &mut ChaCha20Rng,
    ) -> Result<Selection> {
        let m = Self::sample_size(clients, budget)?;
        let k = clients.len();
        let probabilities = equal(m, k);
        let mut moved: HashMap<usize, usize> = HashMap::with_capacity(2 * m);
        let at = |moved: &HashMap<usize, usize>, i: usize| moved.get(&i).copied().unwrap_or(i);
        for i in 0..m {
            let j = i + uniform_below(rng, (k - i) as u64) as usize;
            let (pi, pj) = (at(&moved, i), at(&moved, j));
            moved.insert(i, pj);
            moved.insert(j, pi);
        }
        let mut chosen: Vec<usize> = (0..m).map(|i| at(&moved, i)).collect();
        chosen.sort_unstable();
        Ok(Selection {
            chosen,
            probabilities,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    fn clients(k: usize) -> Vec<ClientStats> {
        (0..k)
            .map(|i| ClientStats {
                id: i as u64,
                samples: 1.0,
                keep_ratio: 1.0,
                update_norm: None,
            })
            .collect()
    }

    #[test]
    fn draws_m_distinct_sorted_clients() {
        let c = clients(10);
        let mut rng = stream(3, 0, 0, Purpose::Selection);
        let mut counts = [0usize; 10];
        for _ in 0..20_000 {
            let s = UniformSelector.select(&c, 3.0, &mut rng).unwrap();
            assert_eq!(s.chosen.len(), 3);
            assert!(s.chosen.windows(2).all(|w| w[0] < w[1]));
            for &i in &s.chosen {
                counts[i] += 1;
            }
        }
        // Each client is chosen with probability 0.3: 6000 ± 5σ (σ = √(20000·0.3·0.7) ≈ 65).
        for n in counts {
            assert!((n as f64 - 6000.0).abs() < 5.0 * 65.0, "{n}");
        }
    }

    #[test]
    fn budget_rules() {
        let c = clients(4);
        assert_eq!(
            UniformSelector.probabilities(&c, 9.0).unwrap(),
            vec![1.0; 4]
        );
        assert_eq!(
            UniformSelector.probabilities(&c, 2.2).unwrap(),
            vec![0.5; 4]
        );
        assert!(UniformSelector.probabilities(&c, 0.4).is_err());
        assert!(UniformSelector.probabilities(&c, f64::NAN).is_err());
        assert!(UniformSelector.probabilities(&[], 1.0).is_err());
    }

    /// The sparse shuffle draws what the dense partial Fisher–Yates shuffle (a vector of every
    /// position, swapped in place) drew before it, stream for stream: the same clients from the
    /// same seeds, and the stream left at the same place.
    #[test]
    fn the_sparse_shuffle_draws_the_dense_shuffles_clients() {
        for (k, budget, seed) in [
            (10, 3.0, 1),
            (1000, 10.0, 2),
            (1000, 999.0, 3),
            (50_000, 700.0, 4),
        ] {
            let c = clients(k);
            let mut sparse = stream(seed, 5, 0, Purpose::Selection);
            let mut dense = sparse.clone();
            let drawn = UniformSelector.select(&c, budget, &mut sparse).unwrap();
            let m = budget as usize;
            let mut positions: Vec<usize> = (0..k).collect();
            for i in 0..m {
                let j = i + uniform_below(&mut dense, (k - i) as u64) as usize;
                positions.swap(i, j);
            }
            let mut expected = positions[..m].to_vec();
            expected.sort_unstable();
            assert_eq!(drawn.chosen, expected, "k = {k}, m = {m}");
            assert_eq!(sparse.next_u64(), dense.next_u64());
            assert_eq!(drawn.probabilities, vec![m as f64 / k as f64; k]);
        }
    }
}
