//! The TOML run configuration: parsed with `deny_unknown_fields` into typed sections (a
//! dataset, a model kind and a schedule each carry their own fields only), then validated as a
//! whole before anything starts, with errors that name the file, the field and what was
//! expected. Each section checks its own ranges; this module assembles them and checks what
//! spans sections, asking the rules of the types that own them (the architectures' data in
//! `fedshard_training::models::accepts`, the compressors' needs in
//! `fedshard_protocol::uplink::requirements`).

mod data;
mod federation;
mod files;
mod model;
mod overrides;
mod own;
mod privacy;
mod rules;
mod secure;
mod simulation;
mod uplink;

pub(crate) use data::default_test_fraction;
pub use data::{DataSection, LabelSplit};
pub use federation::{FederationSection, KeepRatioShare, Mode, Schedule};
pub use files::{ClientSplit, FilesSection, TestSet};
pub use model::{CUDA_NOT_BUILT, Device, Model, ModelSection, TrainingSection};
pub use overrides::Overrides;
pub use own::Settings;
pub use privacy::PrivacySection;
pub use secure::SecureSection;
pub use simulation::{DevicesSection, DrawnRate, NetworkSection, Rate};
pub(crate) use simulation::{Run as SimulatedRun, clock as simulated_clock};

use anyhow::{Context, bail};
use fedshard_actors::clock::ClockKind;
use fedshard_actors::faults::FaultPlan;
use fedshard_protocol::uplink::{CompressionConfig, Compressor, Host};
use fedshard_strategies::server_optimizer::ServerOptimizer;
use fedshard_training::train::neural::LocalMethod;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The largest config file read (shipped ones are a few kilobytes).
pub const MAX_FILE: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub run: RunSection,
    pub data: DataSection,
    pub model: ModelSection,
    #[serde(default)]
    pub training: TrainingSection,
    pub federation: FederationSection,
    /// Deterministic fault injection (for tests and demonstrations).
    pub faults: Option<FaultPlan>,
    /// The Prometheus exporter of `fedshard run`.
    pub metrics: Option<MetricsSection>,
    /// Settings of the compressor named by `federation.compressor`.
    pub compression: Option<CompressionConfig>,
    /// Simulated time: the clients' devices (`[run] clock = "virtual"`).
    pub devices: Option<DevicesSection>,
    /// Simulated time: the clients' links (`[run] clock = "virtual"`).
    pub network: Option<NetworkSection>,
    /// Client-level differential privacy (DP-FedAvg and its accountant).
    pub privacy: Option<PrivacySection>,
    /// Secure aggregation: the server sees the sum of each round's updates, never one of them.
    pub secure_aggregation: Option<SecureSection>,
    /// The server's step with each aggregate (FedAvgM, FedAdagrad, FedAdam, FedYogi;
    /// docs/algorithms.md §10); none: the aggregate is the new model.
    pub server_optimizer: Option<ServerOptimizer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// `HOST:PORT` to serve `/metrics` on, or `off` (default 127.0.0.1:9464).
    pub addr: String,
}

/// Parses a metrics address: `off` (None) or an `IP:PORT` socket address.
pub fn parse_metrics_addr(text: &str) -> Result<Option<std::net::SocketAddr>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        format!("an address IP:PORT (such as 127.0.0.1:9464) or `off`, found {text:?}")
    })
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    pub name: String,
    #[serde(default)]
    pub seed: u64,
    pub rounds: u64,
    /// `wall` (default): real time; `virtual`: simulated time (`[devices]`, `[network]`,
    /// docs/async.md), reproducible whatever the machine's load.
    #[serde(default)]
    pub clock: ClockKind,
}

impl RunSection {
    /// The longest run name.
    const MAX_NAME: usize = 100;

    /// The run's name is a folder's name under `runs/` (and a metrics label): letters, digits,
    /// `-`, `_` and `.`, not beginning with `.`, so that no name (`../../escape`, `/etc`, `..`)
    /// can put the run folder anywhere else. A run has at least one round.
    fn validate(&self) -> anyhow::Result<()> {
        let name = &self.name;
        check(
            "run.name",
            (1..=Self::MAX_NAME).contains(&name.len())
                && !name.starts_with('.')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
            "a folder name of 1 to 100 letters, digits, `-`, `_` and `.`, not beginning with `.`",
            format!("{name:?}"),
        )?;
        check(
            "run.rounds",
            self.rounds >= 1,
            "at least 1",
            self.rounds.to_string(),
        )
    }
}

/// Fails with "field `name`: expected …, found …" unless `ok`.
fn check(name: &str, ok: bool, expected: &str, found: String) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        bail!("field `{name}`: expected {expected}, found {found}")
    }
}

/// The field an error in the `[data]` table is about: the dataset's tagged choice is read as a
/// whole, so the parser points at the table and names the field only in some messages
/// (``unknown field `fine_alpha` ``, ``missing field `path` ``). A message about a value
/// (``invalid value: integer `-5`, expected usize``) names no field: it is the one key of the
/// table whose value the message quotes, when exactly one key does (else none is named, never a
/// wrong one).
fn data_field(text: &str, error: &toml::de::Error) -> Option<String> {
    let table = text.get(error.span()?)?;
    if table.trim() != "[data]" {
        return None;
    }
    let message = error.message();
    for prefix in ["unknown field `", "missing field `", "duplicate field `"] {
        if let Some(rest) = message.strip_prefix(prefix) {
            return Some(rest[..rest.find('`')?].to_string());
        }
    }
    let parsed: toml::Table = toml::from_str(text).ok()?;
    let data = parsed.get("data")?.as_table()?;
    let mut quoted = data.iter().filter(|(_, value)| {
        let shown = match value {
            toml::Value::String(s) => format!("\"{s}\""),
            other => format!("`{other}`"),
        };
        message.contains(&shown)
    });
    match (quoted.next(), quoted.next()) {
        (Some((key, _)), None) => Some(key.clone()),
        _ => None,
    }
}

/// The text of the config file at `path`: only a regular file of at most [`MAX_FILE`] bytes is
/// read (a config is a few kilobytes, and a path such as `/dev/zero` or a FIFO must fail, naming
/// what it is, instead of filling the memory or blocking).
pub fn read_config_file(path: &Path) -> anyhow::Result<String> {
    let bytes = fedshard_protocol::stored::read_regular(path, MAX_FILE, "a TOML config")
        .context("cannot read config")?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text, expected TOML", path.display()))
}

impl Config {
    /// The run's length and schedule for a table caption: `60 rounds, 10 clients, 10 per round`,
    /// or in async mode `120 versions, 10 clients, 6 training at once, an aggregate every 5
    /// updates`.
    pub fn schedule_caption(&self) -> String {
        let f = &self.federation;
        let clients = self.data.clients();
        match f.schedule {
            Schedule::Async {
                concurrency,
                buffer,
                ..
            } => format!(
                "{} versions, {clients} clients, {concurrency} training at once, an aggregate \
                 every {buffer} updates",
                self.run.rounds
            ),
            Schedule::Sync { .. } => format!(
                "{} rounds, {clients} clients, {} per round",
                self.run.rounds, f.clients_per_round
            ),
        }
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        Self::load_with(path, &Overrides::default())
    }

    /// Reads a config file ([`read_config_file`]), lays a command's flags over it and validates
    /// the result.
    pub fn load_with(path: &Path, overrides: &Overrides) -> anyhow::Result<Self> {
        let text = read_config_file(path)?;
        Self::parse_with(&text, path, overrides)
    }

    /// Parses and validates config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Self> {
        Self::parse_with(text, path, &Overrides::default())
    }

    /// Reads a config file's fields without validating them against each other, the data or
    /// the build: for a command that only describes the model (`fedshard widths`), so that a
    /// GPU-scale config can be described on a machine without its dataset or without CUDA. A
    /// run must use [`Config::load`].
    pub fn read_unvalidated(path: &Path) -> anyhow::Result<Self> {
        Self::deserialize_text(&read_config_file(path)?, path)
    }

    /// Parses config text, lays `overrides` over it and validates the result; an error names
    /// the flags that were given.
    pub fn parse_with(text: &str, path: &Path, overrides: &Overrides) -> anyhow::Result<Self> {
        let mut config = Self::deserialize_text(text, path)?;
        let flags = overrides.flags();
        let with = if flags.is_empty() {
            String::new()
        } else {
            format!(" with {}", flags.join(" and "))
        };
        overrides
            .apply(&mut config)
            .and_then(|()| config.validate())
            .with_context(|| format!("{}: invalid config{with}", path.display()))?;
        Ok(config)
    }

    /// The fields of config text, unvalidated; a TOML error names the file (and the `data`
    /// field it is about, when it is one).
    fn deserialize_text(text: &str, path: &Path) -> anyhow::Result<Self> {
        toml::from_str(text).map_err(|e| {
            let detail = e.to_string();
            match data_field(text, &e) {
                Some(name) => anyhow::anyhow!(
                    "{}: field `data.{name}`: {}",
                    path.display(),
                    detail.trim_end()
                ),
                None => anyhow::anyhow!("{}: {}", path.display(), detail.trim_end()),
            }
        })
    }

    /// What a valid config does that a user is unlikely to want, one sentence each, for the
    /// commands to log before a run starts: today QSGD or SignSGD on sharded layers, whose
    /// quantised factor columns multiply into `u'v'ᵀ` (measured in docs/klms.md).
    pub fn warnings(&self) -> Vec<String> {
        let quantised = matches!(
            self.federation.compressor.host(),
            Some(Host::Qsgd | Host::Signsgd)
        );
        let sharded = self.model.sharded_layers();
        if quantised && !sharded.is_empty() {
            vec![format!(
                "`{}` quantises the factor columns of the sharded layers {sharded:?}, and their \
                 noise multiplies in the recomposed u'v'ᵀ: on the digits it can learn far less than \
                 on the dense model (docs/klms.md, \"With sharded layers\")",
                self.federation.compressor
            )]
        } else {
            Vec::new()
        }
    }

    /// Logs each of [`Config::warnings`] as a warning.
    pub fn log_warnings(&self) {
        for warning in self.warnings() {
            tracing::warn!("{warning}");
        }
    }

    /// Checks every field against its domain; the error names the field.
    /// The model this config trains, resolved against its data: what a run's set-up builds.
    pub fn model(&self) -> anyhow::Result<Model> {
        // SGLD asks each client for one step on its share of the potential, not for local
        // training (docs/algorithms.md §4.9).
        let method = match self.federation.compressor.host() {
            Some(Host::Sgld) => LocalMethod::Sgld,
            _ => LocalMethod::Sgd,
        };
        self.model.resolve(&self.data, self.training.device, method)
    }

    /// Checks every field against its domain; the error names the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.run.validate()?;
        self.data.validate()?;
        simulation::validate(self.run.clock, self.devices.as_ref(), self.network.as_ref())?;
        self.training.validate(self.federation.strategy)?;
        let sgd_clients = matches!(
            self.model,
            ModelSection::Softmax { .. } | ModelSection::Neural { .. } | ModelSection::Onnx { .. }
        ) && !matches!(
            self.federation.compressor,
            Compressor::Sgld | Compressor::SgldKlms
        );
        check(
            "training.proximal_mu",
            self.training.recipe.proximal_mu == 0.0 || sgd_clients,
            "0 with the ridge and fedpm models and the sgld compressors, whose clients do not \
             take local SGD steps for a proximal term to act on",
            format!(
                "{} with model `{}` and compressor `{}`",
                self.training.recipe.proximal_mu,
                self.model.kind(),
                self.federation.compressor
            ),
        )?;
        check(
            "federation.scaffold",
            !self.federation.scaffold || sgd_clients,
            "false with the ridge and fedpm models and the sgld compressors, whose clients do \
             not take local SGD steps for SCAFFOLD's correction to act on",
            format!(
                "true with model `{}` and compressor `{}`",
                self.model.kind(),
                self.federation.compressor
            ),
        )?;
        uplink::validate(self)?;
        self.federation.validate(self.data.clients())?;
        let partial = self.federation.partial();
        check(
            "federation.keep_ratios",
            !partial || !matches!(self.model, ModelSection::Fedpm { .. }),
            "keep ratio 1 for every client with the fedpm model (it shards nothing)",
            "a keep ratio below 1".into(),
        )?;
        check(
            "model.sharded_layers",
            !partial || !self.model.sharded_layers().is_empty(),
            "at least one sharded layer when a keep ratio is below 1",
            "none".into(),
        )?;
        let model = self.model()?;
        // A width strategy needs a model that describes its widths: refused here, before
        // anything runs, by the rule that builds the run's sharding.
        crate::federation::sharding(
            &self.federation,
            (
                !self.model.sharded_layers().is_empty(),
                self.model.resolved_sharded_layers(),
            ),
            model.width_groups(),
            self.model.kind(),
        )?;
        if let Some(p) = &self.privacy {
            p.validate(self)?;
        }
        rules::check(self)?;
        if let Some(m) = &self.metrics
            && let Err(e) = parse_metrics_addr(&m.addr)
        {
            bail!("field `metrics.addr`: expected {e}");
        }
        if let Some(faults) = &self.faults {
            check(
                "faults.rate",
                (0.0..=1.0).contains(&faults.rate),
                "a probability in [0, 1]",
                faults.rate.to_string(),
            )?;
            if let Some(s) = &faults.stragglers {
                s.validate().map_err(anyhow::Error::msg)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
