//! Joint samplers (docs/algorithms.md §1.5–1.6): draw exactly `n` distinct term indices with given
//! inclusion probabilities `π` (or, for NumPy-style choice, given selection weights).
//!
//! A sampler is prepared once per `π` (the fit of conditional Poisson's working probabilities,
//! its selection table), then draws cheaply for every client of a group from a caller-provided
//! ChaCha stream.
//!
//! [`prepare`] is the one entry point other code needs: it validates the input, removes the
//! certainty units of §1.6 ([`certainty`]) and fits the named design on what is left.

pub mod brewer;
pub mod certainty;
pub mod conditional_poisson;
pub mod minimum_support;
pub mod numpy_choice;
pub mod systematic;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StrategyError};
use crate::rng::ChaCha20Rng;

pub use brewer::Brewer;
pub use certainty::CertaintyDesign;
pub use conditional_poisson::ConditionalPoisson;
pub use minimum_support::MinimumSupport;
pub use numpy_choice::NumpyChoice;
pub use systematic::Systematic;

/// A sampling design fitted to one `π` vector, ready to draw index sets.
pub trait PreparedDesign: Send + Sync + std::fmt::Debug {
    /// The fixed sample size `n` every draw has.
    fn sample_size(&self) -> usize;
    /// Draws one index set of exactly [`Self::sample_size`] distinct indices into `out`
    /// (cleared first), in ascending order.
    fn draw_into(&self, rng: &mut ChaCha20Rng, out: &mut Vec<usize>);
    /// Convenience wrapper around [`Self::draw_into`].
    fn draw(&self, rng: &mut ChaCha20Rng) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.sample_size());
        self.draw_into(rng, &mut out);
        out
    }
}

/// The joint samplers a configuration can name (docs/algorithms.md §1.5–1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SamplerName {
    /// Conditional Poisson / maximum entropy (`UPmaxentropy`), the paper's default (§1.6).
    #[default]
    ConditionalPoisson,
    /// Brewer's draw-by-draw method (`UPbrewer`, §1.6).
    Brewer,
    /// Deville–Tillé minimum support splitting (`UPminimalsupport`, §1.6).
    MinimumSupport,
    /// Ordered systematic sampling (`UPsystematic`, §1.6).
    Systematic,
    /// NumPy's `choice(replace=False, p)` (§1.5, PriSM); `values` are weights, not `π`.
    NumpyChoice,
}

impl SamplerName {
    /// Every sampler, in the order of docs/algorithms.md.
    pub const ALL: [SamplerName; 5] = [
        SamplerName::ConditionalPoisson,
        SamplerName::Brewer,
        SamplerName::MinimumSupport,
        SamplerName::Systematic,
        SamplerName::NumpyChoice,
    ];

    /// The kebab-case name used in configurations and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            SamplerName::ConditionalPoisson => "conditional-poisson",
            SamplerName::Brewer => "brewer",
            SamplerName::MinimumSupport => "minimum-support",
            SamplerName::Systematic => "systematic",
            SamplerName::NumpyChoice => "numpy-choice",
        }
    }

    /// Whether `values` given to [`prepare`] are inclusion probabilities `π` (true) or
    /// selection weights (false, NumPy choice).
    pub const fn takes_inclusion_probabilities(self) -> bool {
        !matches!(self, SamplerName::NumpyChoice)
    }
}

crate::policy_names!(SamplerName, "sampler");

/// Prepares the design `name` for `values`, ready to draw for every client of a group.
///
/// * πps designs (conditional Poisson, Brewer, minimum support, systematic): `values` are the
///   inclusion probabilities `π` of docs/algorithms.md §1.6, each finite in `[0, 1]` (within `1e-12`
///   of 0 or 1 counts as 0 or 1), with `n = round(Σπ)` and `|Σπ − n| ≤ 1e-6`; `n`, if given,
///   must equal `round(Σπ)`. Certainty units are handled once here ([`certainty`]).
/// * `numpy-choice` (§1.5): `values` are non-negative selection weights, normalised to `p`
///   internally, and `n` is required.
pub fn prepare(
    name: SamplerName,
    values: &[f64],
    n: Option<usize>,
) -> Result<Box<dyn PreparedDesign>> {
    match name {
        SamplerName::NumpyChoice => {
            let n = n.ok_or_else(|| {
                StrategyError::invalid(
                    "sample size",
                    "numpy-choice draws from weights and needs the sample size n",
                )
            })?;
            Ok(Box::new(NumpyChoice::new(values, n)?))
        }
        _ => Ok(Box::new(CertaintyDesign::new(name, values, n)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_from_str_and_display() {
        for name in SamplerName::ALL {
            assert_eq!(name.as_str().parse::<SamplerName>(), Ok(name));
            assert_eq!(name.to_string(), name.as_str());
        }
        assert_eq!(SamplerName::default(), SamplerName::ConditionalPoisson);
    }

    #[test]
    fn unknown_name_lists_the_valid_ones() {
        let err = "poisson".parse::<SamplerName>().unwrap_err();
        assert_eq!(
            err,
            StrategyError::UnknownName {
                kind: "sampler",
                name: "poisson".into(),
                valid: "conditional-poisson, brewer, minimum-support, systematic, numpy-choice"
                    .into(),
            }
        );
    }

    #[test]
    fn serde_uses_the_kebab_names() {
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        for name in SamplerName::ALL {
            let de: StrDeserializer<'_, Error> = name.as_str().into_deserializer();
            assert_eq!(SamplerName::deserialize(de), Ok(name));
        }
        let de: StrDeserializer<'_, Error> = "ConditionalPoisson".into_deserializer();
        assert!(SamplerName::deserialize(de).is_err());
    }

    #[test]
    fn prepare_dispatches_and_draws_size_n() {
        let pi = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2];
        let mut rng = crate::rng::stream(3, 0, 0, crate::rng::Purpose::Sharding);
        for name in SamplerName::ALL {
            let n = if name == SamplerName::NumpyChoice {
                Some(3)
            } else {
                None
            };
            let design = prepare(name, &pi, n).unwrap();
            assert_eq!(design.sample_size(), 3, "{name}");
            let s = design.draw(&mut rng);
            assert_eq!(s.len(), 3, "{name}");
            assert!(s.windows(2).all(|w| w[0] < w[1]), "{name}: {s:?}");
        }
        assert!(prepare(SamplerName::NumpyChoice, &pi, None).is_err());
    }
}
