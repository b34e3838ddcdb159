//! The `strategy` of a federation: a spectral strategy ([`StrategySpec`], docs/algorithms.md §1)
//! or a width-slicing baseline ([`WidthStrategy`], §8), chosen by one name.

use super::plan::{STRATEGY_NAMES, StrategySpec};
use super::width::{WIDTH_NAMES, WidthStrategy};
use crate::StrategyError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A sharding strategy by family: what a client keeps of each sharded layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Terms of each layer's SVD.
    Spectral(StrategySpec),
    /// Units (channels, neurons, heads) of each hidden width.
    Width(WidthStrategy),
}

impl Strategy {
    /// Whether local training clips the effective learning rate (§1.7): spectral strategies
    /// that say so; a width slice has no multipliers to clip against.
    pub fn uses_clip_lr(&self) -> bool {
        match self {
            Strategy::Spectral(spec) => spec.uses_clip_lr(),
            Strategy::Width(_) => false,
        }
    }

    /// The spectral strategy, if this is one.
    pub fn spectral(&self) -> Option<StrategySpec> {
        match self {
            Strategy::Spectral(spec) => Some(*spec),
            Strategy::Width(_) => None,
        }
    }
}

impl From<StrategySpec> for Strategy {
    fn from(spec: StrategySpec) -> Self {
        Strategy::Spectral(spec)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Spectral(spec) => spec.fmt(f),
            Strategy::Width(width) => width.fmt(f),
        }
    }
}

impl FromStr for Strategy {
    type Err = StrategyError;

    fn from_str(name: &str) -> crate::Result<Self> {
        if let Ok(width) = name.parse::<WidthStrategy>() {
            return Ok(Strategy::Width(width));
        }
        name.parse::<StrategySpec>()
            .map(Strategy::Spectral)
            .map_err(|_| StrategyError::UnknownName {
                kind: "strategy",
                name: name.to_string(),
                valid: format!("{STRATEGY_NAMES}; width slicing: {WIDTH_NAMES}"),
            })
    }
}

impl Serialize for Strategy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Strategy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_picks_the_family_and_typos_list_both() {
        for name in ["heterofl", "fedrolex", "top-n", "unbiased", "prism+scaled"] {
            let s: Strategy = name.parse().unwrap();
            assert_eq!(s.to_string(), name);
        }
        assert!(matches!("fedrolex".parse(), Ok(Strategy::Width(_))));
        assert!(!"heterofl".parse::<Strategy>().unwrap().uses_clip_lr());
        assert!("collective".parse::<Strategy>().unwrap().uses_clip_lr());
        let err = "hetero".parse::<Strategy>().unwrap_err().to_string();
        assert!(
            err.contains("collective") && err.contains("fedrolex"),
            "{err}"
        );
    }
}
