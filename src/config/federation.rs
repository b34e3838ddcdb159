//! The `[federation]` section: who is asked, how updates are weighted and sent, and the
//! schedule, a tagged [`Schedule`] that carries the fields of its own mode only.
//!
//! The aggregator is a name, or for a robust one with parameters a table of its `kind` and its
//! parameters (`aggregator = { kind = "krum", f = 1, m = 3 }`, docs/algorithms.md §9): the
//! strategies crate checks them ([`AggregatorSpec`]) and this section puts its name in front.
//!
//! The TOML keeps the schedule's fields flat beside `mode` (`mode = "async"`, `concurrency = 4`,
//! …). serde's `flatten` does not combine with `deny_unknown_fields`, so the section is read as
//! a flat [`RawFederation`] and converted once, with errors that name the field.

use super::check;
use fedshard_actors::schedule::Staleness;
use fedshard_protocol::uplink::Compressor;
use fedshard_strategies::StrategyError;
use fedshard_strategies::aggregation::{AggregatorName, AggregatorSpec};
use fedshard_strategies::sampling::SamplerName;
use fedshard_strategies::selection::SelectorName;
use fedshard_strategies::sharding::strategy::Strategy;
use serde::{Deserialize, Serialize};

/// A share of the clients with a given keep ratio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepRatioShare {
    pub ratio: f64,
    pub share: f64,
}

/// `[federation]`, its schedule resolved into [`Schedule`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawFederation", into = "RawFederation")]
pub struct FederationSection {
    /// Expected uploads per round, m.
    pub clients_per_round: f64,
    pub selector: SelectorName,
    /// `fedavg`, …, or a robust aggregator with its parameters (checked when read).
    pub aggregator: AggregatorName,
    pub strategy: Strategy,
    pub sampler: SamplerName,
    /// Keep ratios of the clients, as shares that sum to 1 (default: everyone trains everything).
    pub keep_ratios: Vec<KeepRatioShare>,
    pub max_clusters: Option<usize>,
    pub deadline_ms: u64,
    pub min_successful: usize,
    /// How clients send their updates: `identity` (f32 values), `qsgd`, `signsgd`, `fedpm`,
    /// `sgld`, or one of those with KLMS (`qsgd-klms`, `signsgd-klms`, `fedpm-klms`,
    /// `sgld-klms`).
    pub compressor: Compressor,
    /// Bound on the norm ‖values − sent‖₂ of a client's update, computed by the server against
    /// the task; an update above it is rejected as `norm_bound` (default: no bound).
    pub max_update_norm: Option<f64>,
    /// Rounds or buffered asynchronous aggregation, each with its own settings.
    pub schedule: Schedule,
    /// SCAFFOLD's control variates (docs/algorithms.md §12): each client's steps are corrected
    /// by `c − c_i`, its host keeps `c_i`, the server `c` (default: off).
    pub scaffold: bool,
}

/// How the server schedules its clients (`mode`), with the settings of that mode only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// Rounds: ask clients, wait, aggregate.
    Sync {
        /// Over-commitment c ≥ 1: a round asks ⌈c · clients_per_round⌉ clients and closes at
        /// the first ⌊clients_per_round⌋ accepted updates; the rest are counted `late` and
        /// dropped (none: a round waits for every client or the deadline).
        over_commit: Option<f64>,
    },
    /// Buffered asynchronous aggregation (FedBuff): `run.rounds` counts applied model versions.
    Async {
        /// The clients training at any time.
        concurrency: usize,
        /// Accepted updates per applied aggregate.
        buffer: usize,
        /// The staleness weight s(τ), `{ kind = "constant" }` (default),
        /// `{ kind = "polynomial", a = 0.5 }` or `{ kind = "hinge", a = 10, b = 4 }`.
        staleness: Staleness,
    },
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule::Sync { over_commit: None }
    }
}

/// The name of a [`Schedule`], as `mode` spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Sync,
    Async,
}

impl Mode {
    /// What one step of the run is called in progress lines and captions: a `round`, or in
    /// async mode a model `version` (`run.rounds` counts these).
    pub fn step(self) -> &'static str {
        match self {
            Mode::Sync => "round",
            Mode::Async => "version",
        }
    }
}

impl Schedule {
    pub fn mode(&self) -> Mode {
        match self {
            Schedule::Sync { .. } => Mode::Sync,
            Schedule::Async { .. } => Mode::Async,
        }
    }

    /// See [`Mode::step`].
    pub fn step(&self) -> &'static str {
        self.mode().step()
    }

    /// The round engine's schedule for this one: the one translation, for the runtime config
    /// and for the engine's rules asked when the config is read.
    pub fn engine(self) -> fedshard_actors::schedule::Schedule {
        use fedshard_actors::schedule::{AsyncConfig, Schedule as Engine};
        match self {
            Schedule::Sync { over_commit } => Engine::Rounds { over_commit },
            Schedule::Async {
                concurrency,
                buffer,
                staleness,
            } => Engine::Buffered(AsyncConfig {
                concurrency,
                buffer,
                staleness,
            }),
        }
    }
}

impl FederationSection {
    /// The ranges the types cannot express, for a federation of `clients` clients: the
    /// budget, the keep-ratio shares, the bounds and the schedule's sizes.
    pub(super) fn validate(&self, clients: usize) -> anyhow::Result<()> {
        // A budget above the population would be silently cut to it: asking for more clients
        // than exist is a mistake to name, not to run.
        check(
            "federation.clients_per_round",
            self.clients_per_round > 0.0 && self.clients_per_round <= clients as f64,
            &format!("a positive number, at most the {clients} clients of `data.clients`"),
            self.clients_per_round.to_string(),
        )?;
        check(
            "federation.keep_ratios",
            !self.keep_ratios.is_empty(),
            "at least one { ratio, share }",
            "none".into(),
        )?;
        for (i, k) in self.keep_ratios.iter().enumerate() {
            check(
                &format!("federation.keep_ratios[{i}].ratio"),
                k.ratio > 0.0 && k.ratio <= 1.0,
                "a keep ratio in (0, 1]",
                k.ratio.to_string(),
            )?;
            check(
                &format!("federation.keep_ratios[{i}].share"),
                k.share > 0.0 && k.share <= 1.0,
                "a share in (0, 1]",
                k.share.to_string(),
            )?;
        }
        let shares: f64 = self.keep_ratios.iter().map(|k| k.share).sum();
        check(
            "federation.keep_ratios",
            (shares - 1.0).abs() < 1e-9,
            "shares that sum to 1",
            format!("a sum of {shares}"),
        )?;
        if let Some(k) = self.max_clusters {
            check(
                "federation.max_clusters",
                k >= 1,
                "at least 1",
                k.to_string(),
            )?;
        }
        if let Some(bound) = self.max_update_norm {
            check(
                "federation.max_update_norm",
                bound > 0.0 && bound.is_finite(),
                "a positive number",
                bound.to_string(),
            )?;
        }
        self.validate_schedule(clients)?;
        self.validate_round_size()?;
        check(
            "federation.deadline_ms",
            self.deadline_ms >= 1,
            "a positive number of milliseconds",
            self.deadline_ms.to_string(),
        )?;
        check(
            "federation.aggregator",
            self.aggregator != AggregatorName::FescOracle,
            "an aggregator a real server can compute (fesc-oracle needs each node's bias and \
             variance, known only in `fedshard oneshot ridge`)",
            self.aggregator.to_string(),
        )?;
        check(
            "federation.aggregator",
            self.selector != SelectorName::OptimalPartial
                || self.aggregator == AggregatorName::InverseProbability,
            "inverse-probability with the optimal-partial selector (its samples are unbiased \
             only with n_k/p_k weights)",
            self.aggregator.to_string(),
        )
    }

    /// A synchronous round closes with at most `⌊clients_per_round⌋` results (the budget, or
    /// the updates an over-committed round waits for), so an aggregator that declines fewer
    /// ([`fedshard_strategies::aggregation::Aggregator::min_results`]: Krum more than 2f + 2,
    /// Bulyan 4f + 3) would never move the model. A buffer's size is the engine's rule.
    fn validate_round_size(&self) -> anyhow::Result<()> {
        let (Schedule::Sync { .. }, Ok(aggregator)) = (self.schedule, self.aggregator.build())
        else {
            return Ok(());
        };
        let min = aggregator.min_results();
        check(
            "federation.clients_per_round",
            self.clients_per_round.floor() >= min as f64,
            &format!(
                "at least {min} updates per round: `aggregator = {}` declines a smaller round",
                self.aggregator
            ),
            self.clients_per_round.to_string(),
        )
    }

    /// Whether some client trains less than the whole model.
    pub fn partial(&self) -> bool {
        self.keep_ratios.iter().any(|k| k.ratio < 1.0)
    }

    /// The schedule's ranges: an over-commitment of at least 1; in async mode a concurrency
    /// the `clients` can fill and a buffer. The selector and the aggregator FedBuff works with
    /// are the engine's rules (`super::rules`).
    fn validate_schedule(&self, clients: usize) -> anyhow::Result<()> {
        match self.schedule {
            Schedule::Sync { over_commit: None } => Ok(()),
            Schedule::Sync {
                over_commit: Some(c),
            } => check(
                "federation.over_commit",
                c >= 1.0 && c.is_finite(),
                "a factor of at least 1",
                c.to_string(),
            ),
            Schedule::Async {
                concurrency,
                buffer,
                staleness,
            } => {
                check(
                    "federation.concurrency",
                    (1..=clients).contains(&concurrency),
                    &format!(
                        "with `mode = \"async\"`, the clients training at once, in 1..={clients}"
                    ),
                    concurrency.to_string(),
                )?;
                check(
                    "federation.buffer",
                    buffer >= 1,
                    "with `mode = \"async\"`, the accepted updates per aggregate, at least 1",
                    buffer.to_string(),
                )?;
                staleness.validate().map_err(anyhow::Error::msg)
            }
        }
    }
}

/// `[federation]` as the TOML writes it: the schedule's fields flat beside `mode`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFederation {
    clients_per_round: f64,
    #[serde(default = "default_selector")]
    selector: SelectorName,
    #[serde(default = "default_aggregator")]
    aggregator: AggregatorSpec,
    #[serde(default = "default_strategy")]
    strategy: Strategy,
    #[serde(default)]
    sampler: SamplerName,
    #[serde(default = "default_keep_ratios")]
    keep_ratios: Vec<KeepRatioShare>,
    max_clusters: Option<usize>,
    #[serde(default = "default_deadline_ms")]
    deadline_ms: u64,
    #[serde(default = "default_min_successful")]
    min_successful: usize,
    #[serde(default)]
    compressor: Compressor,
    #[serde(default)]
    max_update_norm: Option<f64>,
    #[serde(default)]
    over_commit: Option<f64>,
    #[serde(default)]
    mode: Mode,
    concurrency: Option<usize>,
    buffer: Option<usize>,
    staleness: Option<Staleness>,
    #[serde(default)]
    scaffold: bool,
}

impl TryFrom<RawFederation> for FederationSection {
    type Error = String;

    /// Refuses a setting of the other mode, and an async schedule without its sizes.
    fn try_from(raw: RawFederation) -> Result<Self, String> {
        let refuse = |name: &str, expected: &str, found: &str| {
            Err(format!(
                "field `federation.{name}`: expected {expected}, found {found}"
            ))
        };
        // The parameters' rules are the aggregator's; the section adds its name.
        let aggregator = AggregatorName::try_from(raw.aggregator).map_err(|e| match e {
            StrategyError::InvalidInput { what, reason } => {
                format!("field `federation.{what}`: {reason}")
            }
            other => format!("field `federation.aggregator`: {other}"),
        })?;
        let schedule = match raw.mode {
            Mode::Sync => {
                for (name, set) in [
                    ("concurrency", raw.concurrency.is_some()),
                    ("buffer", raw.buffer.is_some()),
                    ("staleness", raw.staleness.is_some()),
                ] {
                    if set {
                        return refuse(
                            name,
                            "no value: it applies only with `mode = \"async\"`",
                            "a value with mode `sync`",
                        );
                    }
                }
                Schedule::Sync {
                    over_commit: raw.over_commit,
                }
            }
            Mode::Async => {
                if raw.over_commit.is_some() {
                    return refuse(
                        "over_commit",
                        "no value with `mode = \"async\"` (an async server never waits for a \
                         round)",
                        "a value",
                    );
                }
                let Some(concurrency) = raw.concurrency else {
                    return refuse(
                        "concurrency",
                        "with `mode = \"async\"`, the clients training at once (at least 1)",
                        "none",
                    );
                };
                let Some(buffer) = raw.buffer else {
                    return refuse(
                        "buffer",
                        "with `mode = \"async\"`, the accepted updates per aggregate, at least 1",
                        "none",
                    );
                };
                Schedule::Async {
                    concurrency,
                    buffer,
                    staleness: raw.staleness.unwrap_or_default(),
                }
            }
        };
        Ok(Self {
            clients_per_round: raw.clients_per_round,
            selector: raw.selector,
            aggregator,
            strategy: raw.strategy,
            sampler: raw.sampler,
            keep_ratios: raw.keep_ratios,
            max_clusters: raw.max_clusters,
            deadline_ms: raw.deadline_ms,
            min_successful: raw.min_successful,
            compressor: raw.compressor,
            max_update_norm: raw.max_update_norm,
            schedule,
            scaffold: raw.scaffold,
        })
    }
}

impl From<FederationSection> for RawFederation {
    fn from(f: FederationSection) -> Self {
        let (mode, over_commit, concurrency, buffer, staleness) = match f.schedule {
            Schedule::Sync { over_commit } => (Mode::Sync, over_commit, None, None, None),
            Schedule::Async {
                concurrency,
                buffer,
                staleness,
            } => (
                Mode::Async,
                None,
                Some(concurrency),
                Some(buffer),
                Some(staleness),
            ),
        };
        Self {
            clients_per_round: f.clients_per_round,
            selector: f.selector,
            aggregator: f.aggregator.into(),
            strategy: f.strategy,
            sampler: f.sampler,
            keep_ratios: f.keep_ratios,
            max_clusters: f.max_clusters,
            deadline_ms: f.deadline_ms,
            min_successful: f.min_successful,
            compressor: f.compressor,
            max_update_norm: f.max_update_norm,
            over_commit,
            mode,
            concurrency,
            buffer,
            staleness,
            scaffold: f.scaffold,
        }
    }
}

fn default_selector() -> SelectorName {
    SelectorName::Uniform
}
fn default_aggregator() -> AggregatorSpec {
    AggregatorName::Fedavg.into()
}
fn default_strategy() -> Strategy {
    Strategy::Spectral(fedshard_strategies::sharding::plan::StrategySpec::new(
        fedshard_strategies::sharding::plan::Base::TopN,
    ))
}
fn default_keep_ratios() -> Vec<KeepRatioShare> {
    vec![KeepRatioShare {
        ratio: 1.0,
        share: 1.0,
    }]
}
fn default_deadline_ms() -> u64 {
    60_000
}
fn default_min_successful() -> usize {
    1
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use fedshard_strategies::aggregation::{AggregatorName, Bulyan, Krum};
    use std::num::NonZeroUsize;
    use std::path::Path;

    /// `config/digits-cnn.toml` (10 clients a round) with `aggregator = <spec>`, parsed.
    fn with(spec: &str) -> anyhow::Result<Config> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/digits-cnn.toml");
        let text = std::fs::read_to_string(&path).expect("shipped");
        let text = text.replace("aggregator = \"fedavg\"", &format!("aggregator = {spec}"));
        Config::parse(&text, Path::new("robust.toml"))
    }

    /// Each robust aggregator in its one form, read into its type and written back to the same
    /// config.
    #[test]
    fn robust_aggregators_read_and_write_in_their_one_form() {
        let krum = AggregatorName::Krum(Krum {
            f: 1,
            m: NonZeroUsize::new(3).unwrap(),
        });
        for (spec, name) in [
            ("\"median\"", Some(AggregatorName::Median)),
            ("{ kind = \"krum\", f = 1, m = 3 }", Some(krum)),
            (
                "{ kind = \"bulyan\", f = 1 }",
                Some(AggregatorName::Bulyan(Bulyan { f: 1 })),
            ),
            ("{ kind = \"trimmed-mean\", beta = 0.2 }", None),
        ] {
            let config = with(spec).unwrap_or_else(|e| panic!("{spec}: {e:#}"));
            if let Some(name) = name {
                assert_eq!(config.federation.aggregator, name);
            }
            let written = toml::to_string(&config).expect("serialises");
            let again: Config =
                toml::from_str(&written).unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(again, config, "{written}");
        }
    }

    /// Every refusal names its field (the parameter's own where there is one) and what to
    /// write; a round too small for the aggregator names `clients_per_round`.
    #[test]
    fn robust_parameters_are_refused_by_field() {
        let cases = [
            (
                "\"krum\"",
                "field `federation.aggregator`",
                "{ kind = \"krum\", f = ",
            ),
            (
                "{ kind = \"fedavg\" }",
                "field `federation.aggregator`",
                "takes no parameters",
            ),
            (
                "{ kind = \"krum\", f = -1, m = 1 }",
                "field `federation.aggregator.f`",
                "found -1",
            ),
            (
                "{ kind = \"krum\", f = 1 }",
                "field `federation.aggregator.m`",
                "found none",
            ),
            (
                "{ kind = \"krum\", f = 1, m = 0 }",
                "field `federation.aggregator.m`",
                "≥ 1",
            ),
            (
                "{ kind = \"krum\", f = 1, m = 1, beta = 0.1 }",
                "federation.aggregator",
                "`beta`",
            ),
            (
                "{ kind = \"krum\", f = 1, m = 1, g = 2 }",
                "robust.toml",
                "unknown field `g`",
            ),
            (
                "{ kind = \"trimmed-mean\", beta = 0.5 }",
                "federation.aggregator.beta",
                "[0, 0.5)",
            ),
            (
                "{ kind = \"geomed\", f = 1 }",
                "federation.aggregator",
                "valid names",
            ),
            // Bulyan with f = 2 folds 4f + 3 = 11 results; a round has 10.
            (
                "{ kind = \"bulyan\", f = 2 }",
                "federation.clients_per_round",
                "at least 11",
            ),
            (
                "{ kind = \"krum\", f = 1, m = 11 }",
                "federation.clients_per_round",
                "at least 11",
            ),
        ];
        for (spec, field, expected) in cases {
            let error = format!("{:#}", with(spec).expect_err(spec));
            assert!(
                error.contains(field) && error.contains(expected),
                "{spec}: {error}"
            );
        }
    }
}
