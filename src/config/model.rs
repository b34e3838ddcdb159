//! The `[model]` and `[training]` sections, and the model they resolve to against the data:
//! the one place that says which model kind reads which dataset (the architectures' own rules
//! are `fedshard_training::models::accepts`).

use super::check;
use super::data::DataSection;
use anyhow::bail;
use fedshard_protocol::model::{ModelState, NamedTensor};
use fedshard_protocol::task::Recipe;
use fedshard_protocol::work::Arithmetic;
use fedshard_strategies::sharding::strategy::Strategy;
use fedshard_training::models::masked::MaskedNetwork;
use fedshard_training::models::net::Architecture;
use fedshard_training::models::onnx::OnnxFile;
use fedshard_training::train::neural::LocalMethod;
use serde::{Deserialize, Serialize};

/// The error for `device = "cuda"` in a build without the `cuda` feature.
pub const CUDA_NOT_BUILT: &str = "field `training.device`: expected `cpu`: this fedshard was built without CUDA (rebuild with `cargo build --release --features cuda`)";

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
    /// A model exported to ONNX (docs/onnx.md), read from `path` when the config is: every
    /// Gemm/MatMul and Conv weight is a shardable layer, its initial values the file's.
    Onnx {
        /// The ONNX file (relative to the working directory).
        path: OnnxFile,
        /// Tensors trained as spectral shards: weight (initializer) names, or `["all"]` for
        /// every Gemm/MatMul and Conv weight but the first and last layer's.
        #[serde(default)]
        sharded_layers: Vec<String>,
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
            ModelSection::Onnx { .. } => "onnx",
            ModelSection::Fedpm { .. } => "fedpm",
        }
    }

    /// The burn network trained: `[model.network]` for a neural model, the MLP 64 → 10 without
    /// hidden layers for softmax, none for ridge and fedpm (see [`Model::Masked`]).
    pub fn architecture(&self) -> Option<Architecture> {
        match self {
            ModelSection::Neural { network, .. } => Some(network.clone()),
            ModelSection::Onnx { path, .. } => Some(Architecture::Onnx { path: path.clone() }),
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
            | ModelSection::Neural { sharded_layers, .. }
            | ModelSection::Onnx { sharded_layers, .. } => sharded_layers,
            ModelSection::Ridge {} | ModelSection::Fedpm { .. } => &[],
        }
    }

    /// Trains every tensor densely (the reference arm of `fedshard compare`).
    pub fn clear_sharded_layers(&mut self) {
        if let ModelSection::Softmax { sharded_layers }
        | ModelSection::Neural { sharded_layers, .. }
        | ModelSection::Onnx { sharded_layers, .. } = self
        {
            sharded_layers.clear();
        }
    }

    /// The sharded tensor names with `all` expanded to the architecture's shardable weights
    /// (read off its description, nothing is built).
    pub fn resolved_sharded_layers(&self) -> Vec<String> {
        match (&self.architecture(), self.sharded_layers()) {
            (Some(net), [all]) if all == "all" => net.sharded_by_all(),
            (_, layers) => layers.to_vec(),
        }
    }

    /// The model this section trains on `data` on `device`, or an error naming the field when
    /// they do not fit: softmax reads the digits, ridge the synthetic-linear data, fedpm the
    /// digits or MNIST (its inputs and classes taken from them), and a neural network the
    /// datasets its architecture accepts, with sharded layers it can shard.
    pub fn resolve(
        &self,
        data: &DataSection,
        device: Device,
        method: LocalMethod,
    ) -> anyhow::Result<Model> {
        let refuse = |expected: &str| {
            anyhow::anyhow!(
                "field `data.dataset`: expected {expected} for the {} model, found {}",
                self.kind(),
                data.name()
            )
        };
        match self {
            ModelSection::Ridge {} => {
                let DataSection::SyntheticLinear { dim, .. } = data else {
                    return Err(refuse("synthetic-linear"));
                };
                Ok(Model::Ridge { dim: *dim })
            }
            ModelSection::Fedpm { conv, hidden } => {
                let network = data
                    .inputs()
                    .and_then(|inputs| MaskedNetwork::for_inputs(inputs, conv, hidden));
                let Some(network) = network else {
                    return Err(refuse("digits or mnist"));
                };
                if let Some(at) = hidden.iter().position(|&h| h == 0) {
                    bail!(
                        "field `model.hidden`: expected widths of at least 1, found 0 at index {at}"
                    );
                }
                if let Some(at) = conv.iter().position(|&c| c == 0) {
                    bail!(
                        "field `model.conv`: expected channels of at least 1, found 0 at index {at}"
                    );
                }
                network
                    .layers()
                    .map_err(|e| anyhow::anyhow!("field `model.conv`: {e}"))?;
                check(
                    "training.device",
                    device == Device::Cpu,
                    "`cpu` for the fedpm model (its masked layers train on the CPU backend)",
                    "`cuda`".into(),
                )?;
                Ok(Model::Masked(network))
            }
            ModelSection::Softmax { .. }
            | ModelSection::Neural { .. }
            | ModelSection::Onnx { .. } => {
                if matches!(self, ModelSection::Softmax { .. })
                    && !matches!(data, DataSection::Digits { .. })
                {
                    return Err(refuse("digits"));
                }
                let architecture = self
                    .architecture()
                    .unwrap_or_else(|| unreachable!("softmax, neural and onnx have a network"));
                self.check_network(&architecture, data)?;
                if device == Device::Cuda && !cfg!(feature = "cuda") {
                    bail!(CUDA_NOT_BUILT);
                }
                Ok(Model::Network {
                    architecture,
                    device,
                    method,
                })
            }
        }
    }

    /// An architecture that accepts the dataset and builds, and sharded layers it can shard.
    fn check_network(&self, net: &Architecture, data: &DataSection) -> anyhow::Result<()> {
        let expected = match data.inputs() {
            Some(inputs) if net.accepts(inputs) => None,
            Some(inputs) => Some(Architecture::accepted_for(inputs)),
            // Checked against the rows once they are read (federation::loaded).
            None if matches!(data, DataSection::Files(_)) => match net.table_shape() {
                Some(_) => None,
                None => Some("a network that reads rows of features: mlp, digits-cnn, mnist-cnn, resnet18 or cct".into()),
            },
            None => Some("no network: synthetic-linear data is for the ridge model".into()),
        };
        if let Some(expected) = expected {
            if let Architecture::Onnx { path } = net {
                let plan = &path.model.plan;
                bail!(
                    "field `model.path`: expected a model of {:?}'s examples, found {} with input \
                     [N, {:?}] and {} classes",
                    data.name(),
                    path.path.display(),
                    plan.input_tail,
                    plan.classes
                );
            }
            bail!(
                "field `model.network`: expected an architecture for {:?} ({expected}), found \
                 {net:?}",
                data.name()
            );
        }
        net.check_sizes().map_err(|e| {
            anyhow::anyhow!(
                "field `model.network`: expected a width that splits into the heads: {e}"
            )
        })?;
        if self.sharded_layers() == ["all"] {
            return Ok(());
        }
        let shardable = net.shardable_layers();
        if let Some(layer) = self
            .sharded_layers()
            .iter()
            .find(|layer| !shardable.contains(layer))
        {
            bail!(
                "field `model.sharded_layers`: expected `all` or names among {shardable:?}, found \
                 {layer:?}"
            );
        }
        Ok(())
    }
}

/// The model a config trains, resolved once against its data ([`ModelSection::resolve`]) and
/// handed down to everything the run builds.
#[derive(Debug, Clone, PartialEq)]
pub enum Model {
    /// A burn network (neural, or softmax: the MLP without hidden layers) trained on `device`.
    Network {
        architecture: Architecture,
        device: Device,
        /// SGD local training, or one SGLD step (the `sgld` compressors' clients).
        method: LocalMethod,
    },
    /// FedPM's masked network (docs/algorithms.md §4.6), on the CPU backend.
    Masked(MaskedNetwork),
    /// Ridge regression on `dim` features, fitted in closed form.
    Ridge { dim: usize },
}

impl Model {
    /// The hidden widths a width strategy slices (docs/algorithms.md §8): the network's own
    /// description; none for the masked and ridge models.
    pub fn width_groups(&self) -> Vec<fedshard_protocol::width::WidthGroup> {
        match self {
            Model::Network { architecture, .. } => {
                fedshard_training::models::network::Network::width_groups(architecture)
            }
            Model::Masked(_) | Model::Ridge { .. } => Vec::new(),
        }
    }

    /// The initial global model: the network's seeded initialisation (fedpm: the mask
    /// probabilities θ = sigmoid(N(0, 1)) of its masked layers); ridge at zero.
    pub fn initial_state(&self, seed: u64) -> anyhow::Result<ModelState> {
        let built = match self {
            Model::Network { architecture, .. } => architecture
                .initial_state(seed)
                .map(|s| s.0)
                .map_err(anyhow::Error::from),
            Model::Masked(network) => network.initial_state(seed).map_err(anyhow::Error::from),
            Model::Ridge { dim } => {
                ModelState::new(vec![NamedTensor::zeros("weight", vec![1, *dim])])
                    .map_err(anyhow::Error::from)
            }
        };
        built.map_err(|e| anyhow::anyhow!("field `model`: building the initial model: {e}"))
    }

    /// Where a network multiplies in one sample's forward pass, for simulated time's
    /// multiply-add count; nothing for FedPM and ridge, which are never sharded (their every
    /// task is the whole model).
    pub fn arithmetic(&self) -> anyhow::Result<Arithmetic> {
        match self {
            Model::Network { architecture, .. } => architecture
                .arithmetic()
                .map_err(|e| anyhow::anyhow!("field `model`: building the model: {e}")),
            Model::Masked(_) | Model::Ridge { .. } => Ok(Arithmetic::default()),
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

impl Device {
    /// On the CPU, the micro-kernels its matrix products run on in this process
    /// ([`product_kernels`](fedshard_training::models::kernels::product_kernels)); none on CUDA.
    pub fn products(self) -> Option<&'static str> {
        match self {
            Device::Cpu => Some(fedshard_training::models::kernels::product_kernels()),
            Device::Cuda => None,
        }
    }

    /// The device as a benchmark names it beside its figures: the CPU with its products' path,
    /// since a figure and a seed's model bytes belong to that path.
    pub fn label(self) -> String {
        match self.products() {
            Some(products) => format!("Cpu ({products} products)"),
            None => "Cuda".into(),
        }
    }
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
    /// Whether the clients a process trains at once that share a sub-model shape train as one
    /// computation (cohorts, docs/design.md). Off by default: measured slower than one client
    /// per core on the CPU and than concurrent clients on a GPU (docs/performance.md,
    /// "Cohorts"). A client's trained bytes on the CPU are the same either way.
    #[serde(default)]
    pub cohorts: bool,
    /// The most clients one cohort trains at once (its activations and gradients grow with
    /// it); a larger queue makes several cohorts.
    #[serde(default = "default_cohort_size")]
    pub cohort_size: usize,
}

fn default_cohort_size() -> usize {
    16
}

/// The most local epochs per round. FedAvg runs from 1 to 20 (McMahan et al. 2017); far more
/// and each client fits its own data alone (client drift) while a round takes days. 1000 leaves
/// room for any experiment and refuses a typo that would run for ever.
pub const MAX_EPOCHS: usize = 1000;

impl TrainingSection {
    /// The recipe's ranges, and a ClipLR threshold only under a `strategy` that clips.
    pub(super) fn validate(&self, strategy: Strategy) -> anyhow::Result<()> {
        check(
            "training.cohort_size",
            self.cohort_size >= 1,
            "at least 1",
            self.cohort_size.to_string(),
        )?;
        let t = &self.recipe;
        check(
            "training.learning_rate",
            t.learning_rate > 0.0 && t.learning_rate.is_finite(),
            "a positive number",
            t.learning_rate.to_string(),
        )?;
        check(
            "training.epochs",
            (1..=MAX_EPOCHS).contains(&t.epochs),
            &format!("local epochs per round in 1..={MAX_EPOCHS}"),
            t.epochs.to_string(),
        )?;
        check(
            "training.batch_size",
            t.batch_size >= 1,
            "at least 1",
            t.batch_size.to_string(),
        )?;
        check(
            "training.momentum",
            (0.0..1.0).contains(&t.momentum),
            "a number in [0, 1)",
            t.momentum.to_string(),
        )?;
        check(
            "training.proximal_mu",
            t.proximal_mu >= 0.0 && t.proximal_mu.is_finite(),
            "a non-negative number (FedProx's μ; 0 is plain local SGD)",
            t.proximal_mu.to_string(),
        )?;
        check(
            "training.weight_decay",
            t.weight_decay >= 0.0,
            "a non-negative number",
            t.weight_decay.to_string(),
        )?;
        if let Some(tau) = t.clip_lr {
            check(
                "training.clip_lr",
                tau > 0.0 && tau.is_finite(),
                "a positive number",
                tau.to_string(),
            )?;
            check(
                "training.clip_lr",
                strategy.uses_clip_lr(),
                "no value: only the +ClipLR strategies clip, and `federation.strategy` is",
                format!("{tau} with strategy `{strategy}`"),
            )?;
        }
        Ok(())
    }
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
