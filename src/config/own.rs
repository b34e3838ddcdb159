//! The settings of a federation whose network and data a program brings
//! ([`crate::federation::Own`]): the `[run]`, `[training]` and `[federation]` sections of a
//! config, without `[data]` and `[model]`, which the program's own network and example sets
//! replace. Each section is read and checked by its own rules, as in a whole [`super::Config`].

use super::{FederationSection, RunSection, TrainingSection};
use anyhow::Context;
use fedshard_strategies::server_optimizer::ServerOptimizer;
use serde::Deserialize;

/// `[run]`, `[training]`, `[federation]` and `[server_optimizer]`; any other section is refused
/// by name when parsed (`deny_unknown_fields`): simulated time, privacy, secure aggregation,
/// faults and compressor settings need a whole config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub run: RunSection,
    #[serde(default)]
    pub training: TrainingSection,
    pub federation: FederationSection,
    pub server_optimizer: Option<ServerOptimizer>,
}

impl Settings {
    /// Parses settings from TOML text (checked against the clients in
    /// [`Settings::validate`], once their number is known).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        toml::from_str(text).context("the settings of an own network and data")
    }

    /// Checks every section for `clients` clients; the error names the field.
    pub fn validate(&self, clients: usize) -> anyhow::Result<()> {
        self.run.validate()?;
        self.training.validate(self.federation.strategy)?;
        self.federation.validate(clients)
    }
}
