//! The TOML run configuration: parsed with `deny_unknown_fields`, then validated as a whole
//! before anything starts, with errors that name the file, the field and what was expected.

use crate::models::net::Architecture;
use anyhow::{Context, bail};
use fedshard_actors::faults::FaultPlan;
use fedshard_actors::payload::Encoding;
use fedshard_strategies::aggregation::AggregatorName;
use fedshard_strategies::sampling::SamplerName;
use fedshard_strategies::selection::SelectorName;
use fedshard_strategies::sharding::plan::StrategySpec;
use serde::{Deserialize, Serialize};
use std::path::Path;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetName {
    /// The 8×8 handwritten digits embedded in smartcore (1797 × 64, 10 classes).
    Digits,
    /// y = xᵀθ* + ε with x ~ N(0, I), θ* ~ U[0,1]^d, the one-shot setting of ALGORITHMS.md §3.3.
    SyntheticLinear,
    /// LEAF-style Shakespeare: one client per (play, role), next-character prediction; run
    /// `fedshard data shakespeare` once to fetch the texts.
    Shakespeare,
    /// CIFAR-10, binary version, from the local folder `data.path`; 3 × 32 × 32, 10 classes.
    Cifar10,
    /// CIFAR-100, binary version, from `data.path`; 100 fine classes under 20 coarse ones.
    Cifar100,
    /// MNIST in IDX format (optionally gzipped) from `data.path`; 28 × 28, 10 classes.
    Mnist,
}

impl DatasetName {
    /// Whether the data comes from files the user downloaded (`data.path`).
    pub fn reads_local_files(self) -> bool {
        matches!(self, Self::Cifar10 | Self::Cifar100 | Self::Mnist)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    pub dataset: DatasetName,
    /// Number of clients K (shakespeare: drawn from the roles with `min_lines` lines).
    pub clients: usize,
    /// Held-out fraction for evaluation (digits).
    #[serde(default = "default_test_fraction")]
    pub test_fraction: f64,
    /// Dirichlet(α·p) label skew (digits); omit for iid.
    pub alpha: Option<f64>,
    /// Log-standard deviation of the lognormal client sizes (digits); 0 = equal sizes.
    #[serde(default)]
    pub size_sigma: f64,
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
    /// Dimension d (synthetic-linear).
    #[serde(default = "default_dim")]
    pub dim: usize,
    /// Client sizes ⌊LogNormal(γ ln K − ½, 1)⌋ (synthetic-linear), mean K^γ.
    #[serde(default = "default_gamma")]
    pub gamma: f64,
    /// Held-out samples (synthetic-linear); test windows evaluated, drawn from all clients'
    /// test texts (shakespeare).
    #[serde(default = "default_test_samples")]
    pub test_samples: usize,
    /// Shakespeare: the most training windows per client (a seeded random subset); omit for all.
    pub max_samples: Option<usize>,
    /// Shakespeare: the least lines a role must speak to become a client.
    #[serde(default = "default_min_lines")]
    pub min_lines: usize,
    /// Shakespeare: where `fedshard data shakespeare` cached the texts (default: the user cache).
    pub cache: Option<std::path::PathBuf>,
    /// CIFAR-10/100, MNIST: the folder holding the downloaded files (required for them).
    pub path: Option<std::path::PathBuf>,
    /// CIFAR-100: the two-stage Pachinko split, `alpha` over the 20 coarse labels and
    /// `fine_alpha` over the fine labels of each (the paper: 1 and 10); omit for a Dirichlet
    /// split over the 100 fine labels.
    pub fine_alpha: Option<f64>,
}

fn default_min_lines() -> usize {
    crate::data::shakespeare::DEFAULT_MIN_LINES
}

fn default_test_fraction() -> f64 {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// Multinomial logistic regression trained by SGD.
    Softmax,
    /// Ridge regression fitted in closed form per client (mean-loss form, λ = 1/√n).
    Ridge,
    /// A burn network (`[model.network]`) trained by SGD on the clients.
    Neural,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub kind: ModelKind,
    /// Tensors trained as spectral shards (softmax: `weight`; neural: weight names such as
    /// `fc0.weight`, or `["all"]` for every weight but the first and last layer's).
    #[serde(default)]
    pub sharded_layers: Vec<String>,
    /// The architecture of a neural model.
    pub network: Option<Architecture>,
}

impl ModelSection {
    /// The sharded tensor names with `all` expanded to the architecture's shardable weights.
    pub fn resolved_sharded_layers(&self) -> anyhow::Result<Vec<String>> {
        match (&self.network, self.sharded_layers.as_slice()) {
            (Some(net), [all]) if all == "all" => {
                let (_, shardable) = net
                    .initial_state(0)
                    .map_err(|e| anyhow::anyhow!("field `model.network`: {e}"))?;
                Ok(shardable)
            }
            _ => Ok(self.sharded_layers.clone()),
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSection {
    #[serde(default = "default_lr")]
    pub learning_rate: f64,
    #[serde(default = "default_epochs")]
    pub epochs: usize,
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    #[serde(default = "default_decay")]
    pub weight_decay: f64,
    #[serde(default = "default_true")]
    pub cosine_schedule: bool,
    /// ClipLR threshold τ (used by strategies that clip).
    #[serde(default = "default_tau")]
    pub clip_tau: f64,
    /// Backend of neural local training.
    #[serde(default)]
    pub device: Device,
}

impl Default for TrainingSection {
    fn default() -> Self {
        Self {
            learning_rate: default_lr(),
            epochs: default_epochs(),
            batch_size: default_batch(),
            momentum: default_momentum(),
            weight_decay: default_decay(),
            cosine_schedule: true,
            clip_tau: default_tau(),
            device: Device::Cpu,
        }
    }
}

fn default_lr() -> f64 {
    0.1
}
fn default_epochs() -> usize {
    1
}
fn default_batch() -> usize {
    32
}
fn default_momentum() -> f64 {
    0.9
}
fn default_decay() -> f64 {
    1e-4
}
fn default_true() -> bool {
    true
}
fn default_tau() -> f64 {
    10.0
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
    #[serde(default)]
    pub encoding: Encoding,
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

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text, path)
    }

    /// Parses and validates config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Self> {
        let config: Config = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim_end()))?;
        config
            .validate()
            .with_context(|| format!("{}: invalid config", path.display()))?;
        Ok(config)
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
        let d = &self.data;
        field(
            "data.clients",
            d.clients >= 1,
            "at least 1 client",
            d.clients.to_string(),
        )?;
        field(
            "data.test_fraction",
            d.test_fraction > 0.0 && d.test_fraction < 1.0,
            "a fraction in (0, 1)",
            d.test_fraction.to_string(),
        )?;
        if let Some(alpha) = d.alpha {
            field(
                "data.alpha",
                alpha > 0.0 && alpha.is_finite(),
                "a positive number",
                alpha.to_string(),
            )?;
        }
        field(
            "data.size_sigma",
            d.size_sigma >= 0.0 && d.size_sigma.is_finite(),
            "a non-negative number",
            d.size_sigma.to_string(),
        )?;
        if let Some(alpha) = d.fine_alpha {
            field(
                "data.fine_alpha",
                d.dataset == DatasetName::Cifar100 && alpha > 0.0 && alpha.is_finite(),
                "a positive number, and only for cifar100",
                format!("{alpha} for {:?}", d.dataset),
            )?;
        }
        if d.dataset.reads_local_files() {
            let path = d.path.as_deref();
            field(
                "data.path",
                path.is_some_and(std::path::Path::is_dir),
                "the folder holding the downloaded dataset files",
                path.map_or("nothing".into(), |p| {
                    format!("{} (not a folder)", p.display())
                }),
            )?;
        }
        field("data.dim", d.dim >= 1, "at least 1", d.dim.to_string())?;
        field(
            "data.gamma",
            d.gamma.is_finite() && d.gamma > 0.0,
            "a positive number",
            d.gamma.to_string(),
        )?;
        let t = &self.training;
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
        field(
            "training.clip_tau",
            t.clip_tau > 0.0,
            "a positive number",
            t.clip_tau.to_string(),
        )?;
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
            "model.sharded_layers",
            !partial || !self.model.sharded_layers.is_empty(),
            "at least one sharded layer when a keep ratio is below 1",
            "none".into(),
        )?;
        if self.model.kind != ModelKind::Neural {
            field(
                "model.network",
                self.model.network.is_none(),
                "no network unless `model.kind = \"neural\"`",
                "a [model.network] table".into(),
            )?;
        }
        match self.model.kind {
            ModelKind::Neural => self.validate_neural()?,
            ModelKind::Softmax => {
                field(
                    "data.dataset",
                    d.dataset == DatasetName::Digits,
                    "digits for the softmax model",
                    format!("{:?}", d.dataset),
                )?;
                for l in &self.model.sharded_layers {
                    field(
                        "model.sharded_layers",
                        l == "weight",
                        "only `weight` for the softmax model",
                        l.clone(),
                    )?;
                }
            }
            ModelKind::Ridge => {
                field(
                    "data.dataset",
                    d.dataset == DatasetName::SyntheticLinear,
                    "synthetic-linear for the ridge model",
                    format!("{:?}", d.dataset),
                )?;
                field(
                    "model.sharded_layers",
                    self.model.sharded_layers.is_empty(),
                    "no sharded layers for ridge (a 1 × d weight has rank 1)",
                    format!("{:?}", self.model.sharded_layers),
                )?;
            }
        }
        if self.model.kind != ModelKind::Neural {
            field(
                "data.dataset",
                d.dataset != DatasetName::Shakespeare,
                "a neural model (`model.kind = \"neural\"`, char-transformer) for shakespeare",
                format!("{:?} model", self.model.kind),
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
        }
        Ok(())
    }

    /// The neural-model part of [`Config::validate`]: an architecture that fits the dataset,
    /// and sharded layers that the architecture can shard.
    fn validate_neural(&self) -> anyhow::Result<()> {
        let Some(net) = &self.model.network else {
            bail!(
                "field `model.network`: expected a [model.network] table for `kind = \"neural\"`, found none"
            );
        };
        let fits = match (self.data.dataset, net) {
            (
                DatasetName::Digits,
                Architecture::Mlp {
                    inputs: 64,
                    classes: 10,
                    ..
                },
            ) => true,
            (DatasetName::Digits, Architecture::DigitsCnn { classes: 10 }) => true,
            (DatasetName::Shakespeare, Architecture::CharTransformer(s)) => {
                s.vocab == crate::models::char_transformer::CharShape::default().vocab
            }
            (DatasetName::Cifar10 | DatasetName::Cifar100, net) => {
                let classes = if self.data.dataset == DatasetName::Cifar10 {
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
                    } => *inputs == crate::data::cifar::IMAGE_DIM && *c == classes,
                    _ => false,
                }
            }
            (
                DatasetName::Mnist,
                Architecture::Mlp {
                    inputs: 784,
                    classes: 10,
                    ..
                },
            ) => true,
            _ => false,
        };
        if !fits {
            bail!(
                "field `model.network`: expected an architecture for {:?} (digits: mlp with inputs = 64 and classes = 10, or digits-cnn with classes = 10; shakespeare: char-transformer with the default vocab; cifar10/cifar100: resnet18 or cct with classes = 10/100, or mlp with inputs = 3072; mnist: mlp with inputs = 784 and classes = 10), found {net:?}",
                self.data.dataset
            );
        }
        if self.training.device == Device::Cuda && !cfg!(feature = "cuda") {
            bail!(CUDA_NOT_BUILT);
        }
        let (_, shardable) = net
            .initial_state(0)
            .map_err(|e| anyhow::anyhow!("field `model.network`: {e}"))?;
        if self.model.sharded_layers == ["all"] {
            return Ok(());
        }
        for layer in &self.model.sharded_layers {
            if !shardable.contains(layer) {
                bail!(
                    "field `model.sharded_layers`: expected `all` or names among {shardable:?}, found {layer:?}"
                );
            }
        }
        Ok(())
    }
}
