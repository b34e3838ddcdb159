//! Poisson selection: every client independently with the same probability `q = m/K`, so a
//! round has `m` participants on average and any number in `0..=K`. It is the sampling under
//! which DP-FedAvg's guarantee is amplified by the add-or-remove relation
//! (docs/algorithms.md §6.4), where a fixed-size uniform sample needs substitution (§6.5).

use super::{ClientSelector, ClientStats, Selection, independent_draws, validate_clients};
use crate::rng::ChaCha20Rng;
use crate::{Result, StrategyError};

/// Each client included by its own Bernoulli(`m/K`) draw, in `clients` order.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoissonSelector;

impl ClientSelector for PoissonSelector {
    fn name(&self) -> &'static str {
        "poisson"
    }

    fn needs_update_norms(&self) -> bool {
        false
    }

    /// `q = min(1, m/K)` for every client; the budget must be positive.
    fn probabilities(&self, clients: &[ClientStats], budget: f64) -> Result<Vec<f64>> {
        validate_clients(clients)?;
        if !(budget.is_finite() && budget > 0.0) {
            return Err(StrategyError::invalid(
                "selection budget",
                format!("Poisson selection needs a positive expected count, got {budget}"),
            ));
        }
        let q = (budget / clients.len() as f64).min(1.0);
        Ok(vec![q; clients.len()])
    }

    /// One uniform draw per client: client `k` is in when it falls below `q`.
    fn select(
        &self,
        clients: &[ClientStats],
        budget: f64,
        rng: &mut ChaCha20Rng,
    ) -> Result<Selection> {
        Ok(independent_draws(self.probabilities(clients, budget)?, rng))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    /// 20 000 draws of q = 0.3 over 10 clients: each client in 6000 ± 5σ times (σ ≈ 65), and
    /// the round sizes vary (Poisson sampling has no fixed size).
    #[test]
    fn each_client_is_in_with_probability_m_over_k() {
        let clients: Vec<ClientStats> = (0..10)
            .map(|i| ClientStats {
                id: i,
                samples: 1.0,
                keep_ratio: 1.0,
                update_norm: None,
            })
            .collect();
        let mut rng = stream(3, 0, 0, Purpose::Selection);
        let mut counts = [0usize; 10];
        let mut sizes = std::collections::BTreeSet::new();
        for _ in 0..20_000 {
            let s = PoissonSelector.select(&clients, 3.0, &mut rng).unwrap();
            sizes.insert(s.chosen.len());
            for &i in &s.chosen {
                counts[i] += 1;
            }
        }
        for n in counts {
            assert!((n as f64 - 6000.0).abs() < 5.0 * 65.0, "{n}");
        }
        assert!(sizes.len() > 5, "{sizes:?}");
        assert!(PoissonSelector.probabilities(&clients, 0.0).is_err());
        assert_eq!(
            PoissonSelector.probabilities(&clients, 30.0).unwrap(),
            vec![1.0; 10]
        );
    }
}
