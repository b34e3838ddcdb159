//! A strategy chosen by name, planned once per (layer, keep-ratio group, round), then drawn once
//! per client (docs/algorithms.md §1.1 steps 2–3).
//!
//! Names are the base strategy plus optional modifiers: `top-n`, `prism`, `prism-wallenius`,
//! `unbiased`, `collective`, each optionally followed by `+scaled` (top-n and prism only, §1.4)
//! and/or `+cliplr` (§1.7). `scaled` alone is shorthand for `top-n+scaled`. Unbiased and
//! Collective always train with ClipLR, as in the paper.

use super::{Marginals, collective, prism, scaled, top_n, unbiased};
use crate::rng::ChaCha20Rng;
use crate::sampling::numpy_choice::NumpyChoice;
use crate::sampling::{PreparedDesign, SamplerName, prepare};
use crate::spectrum::check_sorted;
use crate::{Result, StrategyError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The base strategies of docs/algorithms.md §1.2–1.5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Base {
    TopN,
    Prism,
    PrismWallenius,
    Unbiased,
    Collective,
}

impl Base {
    pub const ALL: [Base; 5] = [
        Base::TopN,
        Base::Prism,
        Base::PrismWallenius,
        Base::Unbiased,
        Base::Collective,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Base::TopN => "top-n",
            Base::Prism => "prism",
            Base::PrismWallenius => "prism-wallenius",
            Base::Unbiased => "unbiased",
            Base::Collective => "collective",
        }
    }
}

/// A sharding strategy as named in a config or on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StrategySpec {
    pub base: Base,
    /// +Scaled: one Frobenius-norm-preserving multiplier per client (§1.4).
    pub scaled: bool,
    /// +ClipLR requested explicitly (Unbiased and Collective use it regardless).
    pub clip_lr: bool,
}

/// Every accepted name, for error messages and `--help`.
pub const STRATEGY_NAMES: &str = "top-n, top-n+scaled (or scaled), prism, prism+scaled, \
prism-wallenius, prism-wallenius+cliplr, unbiased, collective";

impl StrategySpec {
    pub fn new(base: Base) -> Self {
        Self {
            base,
            scaled: false,
            clip_lr: false,
        }
    }

    /// Whether local training clips the effective learning rate (§1.7).
    pub fn uses_clip_lr(&self) -> bool {
        self.clip_lr || matches!(self.base, Base::Unbiased | Base::Collective)
    }

    /// Plans one group of `clients` clients with keep ratio `keep_ratio` on a layer with the
    /// sorted `spectrum`, keeping `kept` terms each. Terms are drawn with `sampler` for the
    /// Unbiased and Collective strategies (and for PriSM+Wallenius's rare fill case); PriSM
    /// draws NumPy-style and Top-n deterministically.
    pub fn plan(
        &self,
        spectrum: &[f64],
        keep_ratio: f64,
        kept: usize,
        clients: usize,
        sampler: SamplerName,
    ) -> Result<GroupPlan> {
        check_sorted(spectrum)?;
        let total = spectrum.len();
        if kept == 0 || kept > total {
            return Err(StrategyError::invalid(
                "kept terms",
                format!("n = {kept} must be in 1..={total}"),
            ));
        }
        if clients == 0 {
            return Err(StrategyError::invalid(
                "clients",
                "a group needs at least one client",
            ));
        }
        let squares: Vec<f64> = spectrum.iter().map(|l| l * l).collect();
        let (marginals, draw) = match self.base {
            Base::TopN if self.scaled => (scaled::top_n_marginals(spectrum, kept)?, Draw::TopN),
            Base::TopN => (top_n::marginals(spectrum, kept)?, Draw::TopN),
            Base::Prism | Base::PrismWallenius => {
                let marginals = if self.base == Base::Prism {
                    prism::marginals(spectrum, kept, keep_ratio)?
                } else {
                    prism::wallenius_marginals(spectrum, kept, keep_ratio)?
                };
                let weights = prism::selection_weights(spectrum, prism::exponent(keep_ratio));
                let positive = weights.iter().filter(|w| **w > 0.0).count();
                let draw = if positive >= kept {
                    Draw::Choice(NumpyChoice::new(&weights, kept)?)
                } else {
                    // Fewer non-zero terms than slots: every non-zero term is kept and the rest
                    // are drawn uniformly among the zero terms, exactly the marginals above.
                    Draw::Design(prepare(
                        sampler,
                        &marginals.inclusion_probabilities,
                        Some(kept),
                    )?)
                };
                (marginals, draw)
            }
            Base::Unbiased | Base::Collective => {
                let marginals = if self.base == Base::Unbiased {
                    unbiased::marginals(spectrum, kept)?
                } else {
                    collective::marginals(spectrum, kept, clients)?
                };
                let design = prepare(sampler, &marginals.inclusion_probabilities, Some(kept))?;
                (marginals, Draw::Design(design))
            }
        };
        Ok(GroupPlan {
            kept,
            marginals,
            scaled: self.scaled,
            squares,
            draw,
        })
    }
}

impl fmt::Display for StrategySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.base.as_str())?;
        if self.scaled {
            f.write_str("+scaled")?;
        }
        if self.clip_lr {
            f.write_str("+cliplr")?;
        }
        Ok(())
    }
}

impl FromStr for StrategySpec {
    type Err = StrategyError;

    fn from_str(name: &str) -> Result<Self> {
        let unknown = || StrategyError::UnknownName {
            kind: "strategy",
            name: name.to_string(),
            valid: STRATEGY_NAMES.to_string(),
        };
        if name == "scaled" {
            return Ok(Self {
                base: Base::TopN,
                scaled: true,
                clip_lr: false,
            });
        }
        let mut parts = name.split('+');
        let base_name = parts.next().unwrap_or_default();
        let base = Base::ALL
            .into_iter()
            .find(|b| b.as_str() == base_name)
            .ok_or_else(unknown)?;
        let mut spec = Self::new(base);
        for modifier in parts {
            match modifier {
                "scaled" if matches!(base, Base::TopN | Base::Prism) && !spec.scaled => {
                    spec.scaled = true
                }
                "cliplr" if !spec.clip_lr => spec.clip_lr = true,
                _ => return Err(unknown()),
            }
        }
        Ok(spec)
    }
}

impl Serialize for StrategySpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StrategySpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// How a client's index set is drawn.
#[derive(Debug)]
enum Draw {
    TopN,
    Choice(NumpyChoice),
    Design(Box<dyn PreparedDesign>),
}

/// A planned group: the marginals every client of the group shares, and the cached sampler
/// set-up, so each further client costs one draw.
#[derive(Debug)]
pub struct GroupPlan {
    pub kept: usize,
    pub marginals: Marginals,
    scaled: bool,
    squares: Vec<f64>,
    draw: Draw,
}

/// One client's terms of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// Term indices, ascending, into the sorted spectrum.
    pub indices: Vec<usize>,
    /// ω for each index.
    pub multipliers: Vec<f64>,
}

impl GroupPlan {
    /// Whether ω depends on the drawn set (+Scaled on a random draw): then
    /// [`Marginals::multipliers`] holds the value for the top-n set only and each draw computes
    /// its own. Top-n+Scaled draws the same set every time, so its ω is fixed.
    pub fn multipliers_per_draw(&self) -> bool {
        self.scaled && !matches!(self.draw, Draw::TopN)
    }

    /// Draws one client's index set and multipliers.
    pub fn draw(&self, rng: &mut ChaCha20Rng) -> Shard {
        let indices = match &self.draw {
            Draw::TopN => (0..self.kept).collect(),
            Draw::Choice(choice) => choice.draw(rng),
            Draw::Design(design) => design.draw(rng),
        };
        let multipliers = if self.scaled {
            let kept: f64 = indices.iter().map(|&i| self.squares[i]).sum();
            let total: f64 = self.squares.iter().sum();
            let omega = if kept > 0.0 {
                (total / kept).sqrt()
            } else {
                1.0
            };
            vec![omega; indices.len()]
        } else {
            indices
                .iter()
                .map(|&i| self.marginals.multipliers[i])
                .collect()
        };
        Shard {
            indices,
            multipliers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    const A: [f64; 6] = [10.0, 5.0, 3.0, 2.0, 1.0, 0.5];

    #[test]
    fn names_round_trip_and_typos_list_valid_names() {
        for name in [
            "top-n",
            "top-n+scaled",
            "prism",
            "prism+scaled",
            "prism-wallenius",
            "prism-wallenius+cliplr",
            "unbiased",
            "collective",
        ] {
            let spec: StrategySpec = name.parse().unwrap();
            assert_eq!(spec.to_string(), name);
        }
        assert_eq!(
            "scaled".parse::<StrategySpec>().unwrap().to_string(),
            "top-n+scaled"
        );
        let err = "unbaised".parse::<StrategySpec>().unwrap_err().to_string();
        assert!(
            err.contains("unbaised") && err.contains("collective"),
            "{err}"
        );
        assert!("unbiased+scaled".parse::<StrategySpec>().is_err());
        assert!("top-n+scaled+scaled".parse::<StrategySpec>().is_err());
    }

    #[test]
    fn clip_lr_follows_the_paper() {
        assert!("unbiased".parse::<StrategySpec>().unwrap().uses_clip_lr());
        assert!(
            "prism-wallenius+cliplr"
                .parse::<StrategySpec>()
                .unwrap()
                .uses_clip_lr()
        );
        assert!(
            !"prism-wallenius"
                .parse::<StrategySpec>()
                .unwrap()
                .uses_clip_lr()
        );
    }

    #[test]
    fn every_strategy_draws_n_distinct_terms() {
        let mut rng = stream(1, 0, 0, Purpose::Sharding);
        for name in [
            "top-n",
            "scaled",
            "prism+scaled",
            "prism-wallenius",
            "unbiased",
            "collective",
        ] {
            let spec: StrategySpec = name.parse().unwrap();
            let plan = spec
                .plan(&A, 0.5, 3, 4, SamplerName::ConditionalPoisson)
                .unwrap();
            for _ in 0..200 {
                let shard = plan.draw(&mut rng);
                assert_eq!(shard.indices.len(), 3, "{name}");
                assert!(shard.indices.windows(2).all(|w| w[0] < w[1]), "{name}");
                assert!(
                    shard.multipliers.iter().all(|w| w.is_finite() && *w > 0.0),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn scaled_multiplier_is_drawn_per_client() {
        let spec: StrategySpec = "top-n+scaled".parse().unwrap();
        let plan = spec
            .plan(&A, 0.34, 2, 1, SamplerName::ConditionalPoisson)
            .unwrap();
        let shard = plan.draw(&mut stream(0, 0, 0, Purpose::Sharding));
        let expected = (139.25f64 / 125.0).sqrt();
        assert!((shard.multipliers[0] - expected).abs() < 1e-12);
    }

    /// The unbiased estimator Ŵ = Σ z_i ω_i λ_i u_i v_iᵀ averages to W: in the spectral basis
    /// that is E[z_i ω_i] = 1 for every term. 10⁵ draws; the per-term standard error of the mean
    /// of z_i ω_i is sqrt((1 − π_i)/π_i / draws), so 5σ ≤ 0.03 for π ≥ 0.03 here.
    #[test]
    fn unbiased_estimator_averages_to_w_by_monte_carlo() {
        let spec: StrategySpec = "unbiased".parse().unwrap();
        for sampler in [
            SamplerName::ConditionalPoisson,
            SamplerName::Brewer,
            SamplerName::Systematic,
        ] {
            let plan = spec.plan(&A, 0.5, 3, 1, sampler).unwrap();
            let draws = 100_000;
            let mut sum = [0.0f64; 6];
            let mut rng = stream(42, 0, 0, Purpose::Sharding);
            for _ in 0..draws {
                let shard = plan.draw(&mut rng);
                for (i, w) in shard.indices.iter().zip(&shard.multipliers) {
                    sum[*i] += w;
                }
            }
            for (i, s) in sum.iter().enumerate() {
                let pi = plan.marginals.inclusion_probabilities[i];
                let sigma = ((1.0 - pi) / pi / draws as f64).sqrt();
                let mean = s / draws as f64;
                assert!(
                    (mean - 1.0).abs() <= 5.0 * sigma + 1e-12,
                    "{sampler}: term {i}: E[z ω] = {mean}"
                );
            }
        }
    }
}
