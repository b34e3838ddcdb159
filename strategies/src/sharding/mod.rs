//! Sharding strategies ([`strategy::Strategy`] picks one by name): the width-slicing baselines
//! of [`width`] (docs/algorithms.md §8), and the spectral ones (§1.2–1.5): from a sorted
//! singular spectrum `λ_1 ≥ … ≥ λ_N`, a number of kept terms `n` and (for Collective) a group size `C`, compute the
//! inclusion probabilities `π` and multipliers `ω` of each term.
//!
//! Every function here takes the spectrum already sorted non-increasing (see
//! [`crate::spectrum`]) and returns vectors in that order.

/// The inclusion probabilities and multipliers a strategy assigns to the terms of a layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Marginals {
    /// `π_i = P(term i is sent)`, with `Σπ = n` and `0 ≤ π ≤ 1`.
    pub inclusion_probabilities: Vec<f64>,
    /// `ω_i`, the frozen multiplier of term i in `Ŵ = U diag(ω) Vᵀ` (0 for terms never sent).
    pub multipliers: Vec<f64>,
    /// `E‖W − Ŵ‖²_F` for this strategy, where a closed form exists.
    pub expected_discrepancy: Option<f64>,
}

pub mod collective;
pub mod plan;
pub mod prism;
pub mod scaled;
pub mod strategy;
pub mod top_n;
pub mod unbiased;
pub mod wallenius;
pub mod width;
