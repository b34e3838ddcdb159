//! Client selection (docs/algorithms.md §2): which registered clients train in a round, and with
//! which inclusion probability `p_k` each was chosen, so an aggregator can reweight their
//! updates (`n_k / p_k`, §2.4).
//!
//! Three policies, chosen by name through [`SelectorName`]:
//! * [`UniformSelector`] (`uniform`): `m` of `K` clients without replacement, `p_k = m/K`.
//! * [`PoissonSelector`] (`poisson`): every client independently with `p_k = m/K`.
//! * [`OptimalPartialSelector`] (`optimal-partial`): the variance-optimal independent
//!   (Poisson) inclusion probabilities under an expected communication budget with partial
//!   training (§2.2–2.3), which need each client's update norm (a two-phase round).

mod optimal_partial;
mod poisson;
mod uniform;

pub use optimal_partial::{
    OptimalPartialSelector, optimal_partial_probabilities, poisson_sampling_variance,
};
pub use poisson::PoissonSelector;
pub use uniform::UniformSelector;

use crate::rng::ChaCha20Rng;
use crate::{Result, StrategyError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What the coordinator knows about one client when it selects the round's participants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientStats {
    /// The client's identifier.
    pub id: u64,
    /// `n_k`, its data weight (number of local samples, §2.1).
    pub samples: f64,
    /// `r_k ∈ [0, 1]`, the fraction of the model it trains and uploads: its communication cost
    /// in full-model uploads (§2.1). `0` marks a free client.
    pub keep_ratio: f64,
    /// `‖U_k‖`, the norm of its update; known only in a two-phase round where clients first
    /// report the norm (§2.3, last paragraph).
    pub update_norm: Option<f64>,
}

/// The outcome of one selection.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Positions in the `clients` slice that were chosen, ascending.
    pub chosen: Vec<usize>,
    /// `p_k`, the inclusion probability of every client (chosen or not), in `clients` order.
    pub probabilities: Vec<f64>,
}

/// A client-selection policy: from the round's client statistics and a budget, the inclusion
/// probabilities and one random draw of participants.
pub trait ClientSelector: Send + Sync + fmt::Debug {
    /// The registry name (`uniform`, `optimal-partial`).
    fn name(&self) -> &'static str;
    /// Whether [`ClientStats::update_norm`] must be known for every client.
    fn needs_update_norms(&self) -> bool;
    /// `p_k` for every client, in `clients` order, for an (expected) budget of `budget`
    /// full-model uploads.
    fn probabilities(&self, clients: &[ClientStats], budget: f64) -> Result<Vec<f64>>;
    /// Draws the participants with the stream `rng` (use
    /// `stream(seed, round, 0, Purpose::Selection)`).
    fn select(
        &self,
        clients: &[ClientStats],
        budget: f64,
        rng: &mut ChaCha20Rng,
    ) -> Result<Selection>;
}

/// Poisson sampling with inclusion probabilities `p`: one uniform draw `u_k` per client in
/// order, client k chosen iff `u_k < p_k`, so the stream consumed does not depend on the
/// probabilities. The chosen positions are ascending.
fn independent_draws(probabilities: Vec<f64>, rng: &mut ChaCha20Rng) -> Selection {
    let chosen = probabilities
        .iter()
        .enumerate()
        .filter_map(|(i, &p)| (crate::rng::uniform(rng) < p).then_some(i))
        .collect();
    Selection {
        chosen,
        probabilities,
    }
}

/// Checks what every selector needs: at least one client, finite non-negative sample counts and
/// keep ratios in `[0, 1]`.
fn validate_clients(clients: &[ClientStats]) -> Result<()> {
    if clients.is_empty() {
        return Err(StrategyError::invalid(
            "clients",
            "no clients to select from",
        ));
    }
    for c in clients {
        if !c.samples.is_finite() || c.samples < 0.0 {
            return Err(StrategyError::invalid(
                "client samples",
                format!("client {} has {} samples", c.id, c.samples),
            ));
        }
        if !(0.0..=1.0).contains(&c.keep_ratio) {
            return Err(StrategyError::invalid(
                "client keep ratio",
                format!(
                    "client {} has keep ratio {}; it must be in [0, 1]",
                    c.id, c.keep_ratio
                ),
            ));
        }
    }
    Ok(())
}

/// The selection policies known to the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectorName {
    /// [`UniformSelector`].
    Uniform,
    /// [`OptimalPartialSelector`].
    OptimalPartial,
    /// [`PoissonSelector`].
    Poisson,
}

impl SelectorName {
    /// Every selector, in registry order.
    pub const ALL: [SelectorName; 3] = [
        SelectorName::Uniform,
        SelectorName::OptimalPartial,
        SelectorName::Poisson,
    ];

    /// The kebab-case name used in configs and on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            SelectorName::Uniform => "uniform",
            SelectorName::OptimalPartial => "optimal-partial",
            SelectorName::Poisson => "poisson",
        }
    }

    /// A fresh selector of this kind.
    pub fn build(&self) -> Box<dyn ClientSelector> {
        match self {
            SelectorName::Uniform => Box::new(UniformSelector),
            SelectorName::OptimalPartial => Box::new(OptimalPartialSelector),
            SelectorName::Poisson => Box::new(PoissonSelector),
        }
    }
}

crate::policy_names!(SelectorName, "selector");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in SelectorName::ALL {
            assert_eq!(n.as_str().parse::<SelectorName>().unwrap(), n);
            assert_eq!(n.build().name(), n.as_str());
        }
        let err = "fedavg".parse::<SelectorName>().unwrap_err();
        assert_eq!(
            err,
            StrategyError::UnknownName {
                kind: "selector",
                name: "fedavg".into(),
                valid: "uniform, optimal-partial, poisson".into()
            }
        );
    }
}
