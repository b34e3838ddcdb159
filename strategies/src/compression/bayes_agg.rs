//! FedPM's server aggregation of decoded masks, BayesAgg (docs/algorithms.md §4.6): a Beta posterior
//! per coordinate whose mode is the next global mask probability `θ`.

use crate::error::{Result, StrategyError};

/// The per-coordinate Beta posterior `Beta(α_j, β_j)` after one round of masks.
#[derive(Debug, Clone, PartialEq)]
pub struct BetaPosterior {
    /// `α_j = λ₀ + Σ_c m_j^(c)`.
    pub alpha: Vec<f64>,
    /// `β_j = λ₀ + C − Σ_c m_j^(c)`.
    pub beta: Vec<f64>,
}

impl BetaPosterior {
    /// The Beta mode `θ_j = (α_j − 1) / (α_j + β_j − 2)` (§4.6; the paper's `α^(t−1)` in the
    /// numerator is a typo). Needs `α_j + β_j > 2`.
    pub fn mode(&self) -> Result<Vec<f64>> {
        self.alpha
            .iter()
            .zip(&self.beta)
            .map(|(&a, &b)| {
                if a + b > 2.0 {
                    Ok((a - 1.0) / (a + b - 2.0))
                } else {
                    Err(StrategyError::invalid(
                        "Beta posterior",
                        format!("α + β = {} ≤ 2 has no interior mode", a + b),
                    ))
                }
            })
            .collect()
    }
}

/// BayesAgg with priors reset to `Beta(λ₀, λ₀)` (the reference resets every round): counts the
/// `C` decoded masks per coordinate. Every mask must have the same length; `λ₀ > 0`.
pub fn bayes_agg(masks: &[&[bool]], lambda_0: f64) -> Result<BetaPosterior> {
    if !(lambda_0 > 0.0 && lambda_0.is_finite()) {
        return Err(StrategyError::invalid(
            "λ₀",
            format!("{lambda_0}; expected a finite positive prior count"),
        ));
    }
    let Some(first) = masks.first() else {
        return Err(StrategyError::invalid("masks", "none received"));
    };
    let d = first.len();
    if let Some(c) = masks.iter().position(|m| m.len() != d) {
        return Err(StrategyError::invalid(
            "masks",
            format!(
                "mask {c} has {} coordinates, the first has {d}",
                masks[c].len()
            ),
        ));
    }
    let clients = masks.len() as f64;
    let mut ones = vec![0.0; d];
    for mask in masks {
        for (count, &m) in ones.iter_mut().zip(*mask) {
            *count += f64::from(u8::from(m));
        }
    }
    Ok(BetaPosterior {
        alpha: ones.iter().map(|s| lambda_0 + s).collect(),
        beta: ones.iter().map(|s| lambda_0 + clients - s).collect(),
    })
}
