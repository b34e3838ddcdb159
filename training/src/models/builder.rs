//! One description of a model, two ways to build it, one way back.
//!
//! A model's constructor asks a [`Builder`] for its layers by name (`fc1`, `block0.attn.q`, …).
//! In [`Builder::init`] mode the builder draws each tensor's initial value from a ChaCha stream
//! and records it, which gives the server's initial [`ModelState`]; in [`Builder::load`] mode it
//! takes the tensors of a [`TrainTask`](fedshard_protocol::task::TrainTask): dense tensors from
//! the task's state and, for every layer the task sends as a [`LayerShard`], the factors and ω.
//! Either way the builder remembers which burn parameter holds which named tensor, so
//! [`export`] can turn a trained module back into the server's tensors without any per-model
//! code, and the names can never drift apart between building and exporting.

use crate::models::NetError;
use crate::models::layers::{Affine, Conv, Factors, Weight, param};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use fedshard_protocol::model::{ModelState, NamedTensor};
use fedshard_protocol::task::LayerShard;
use fedshard_strategies::rng::{ChaCha20Rng, Purpose, stream, uniform};
use std::collections::{BTreeSet, HashMap};

/// How a tensor is initialised in [`Builder::init`] mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    Zeros,
    Ones,
    /// U(−b, b): weights use He's b = √(6/fan_in), which keeps the activations' scale through
    /// ReLU layers (PyTorch's default b = 1/√fan_in shrinks it ~2.4× per layer, and the digits
    /// CNN then barely moves in its first epochs); biases use b = 1/√fan_in.
    Uniform(f64),
    /// N(0, σ²), e.g. σ = 0.02 for GPT-2 embeddings.
    Normal(f64),
}

/// Which named tensor (and which half of a shard) a burn parameter holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Role {
    Dense(String),
    Left(String),
    Right(String),
}

enum Mode<'a> {
    Init {
        rng: Box<ChaCha20Rng>,
        tensors: Vec<NamedTensor>,
        shardable: Vec<String>,
    },
    Load {
        dense: &'a ModelState,
        shards: &'a [LayerShard],
        used: BTreeSet<String>,
    },
}

/// Builds a model's layers by name; see the module documentation.
pub struct Builder<'a, B: Backend> {
    device: B::Device,
    mode: Mode<'a>,
    roles: HashMap<ParamId, Role>,
}

/// What init mode records: the initial global state and the names of the shardable weights.
pub type InitialState = (ModelState, Vec<String>);

/// The parameter → tensor map of a built model, needed by [`export`].
#[derive(Debug)]
pub struct Layout {
    roles: HashMap<ParamId, Role>,
}

impl<'a, B: Backend> Builder<'a, B> {
    /// A builder that draws fresh initial values from the run's `Init` stream.
    pub fn init(seed: u64, device: &B::Device) -> Self {
        Self {
            device: device.clone(),
            mode: Mode::Init {
                rng: Box::new(stream(seed, 0, 0, Purpose::Init)),
                tensors: Vec::new(),
                shardable: Vec::new(),
            },
            roles: HashMap::new(),
        }
    }

    /// A builder that reads a task's dense tensors and shards.
    pub fn load(dense: &'a ModelState, shards: &'a [LayerShard], device: &B::Device) -> Self {
        Self {
            device: device.clone(),
            mode: Mode::Load {
                dense,
                shards,
                used: BTreeSet::new(),
            },
            roles: HashMap::new(),
        }
    }

    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// In init mode: the recorded initial state and the names of the shardable weights.
    /// In load mode: an error if the task carried a tensor or shard the model never asked
    /// for (a config naming a layer the model does not have), else the layout for [`export`].
    pub fn finish(self) -> Result<(Layout, Option<InitialState>), NetError> {
        let layout = Layout { roles: self.roles };
        match self.mode {
            Mode::Init {
                tensors, shardable, ..
            } => Ok((layout, Some((ModelState::new(tensors)?, shardable)))),
            Mode::Load {
                dense,
                shards,
                used,
            } => {
                let names: Vec<String> = dense
                    .tensors
                    .iter()
                    .map(|t| t.name.as_str())
                    .chain(shards.iter().map(|s| s.name.as_str()))
                    .filter(|n| !used.contains(*n))
                    .map(str::to_string)
                    .collect();
                if names.is_empty() {
                    Ok((layout, None))
                } else {
                    Err(NetError::UnknownTensors { names })
                }
            }
        }
    }

    /// A dense trainable tensor (norm scales and shifts, embeddings, positional tables).
    pub fn tensor<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        init: Init,
    ) -> Result<Param<Tensor<B, D>>, NetError> {
        let data = self.values(name, &shape, init)?;
        let p = param(data, shape, &self.device);
        self.roles.insert(p.id, Role::Dense(name.to_string()));
        Ok(p)
    }

    /// A linear layer `c_in → c_out`: weight `{name}.weight` (`c_out × c_in`), optional bias
    /// `{name}.bias`. `shardable` marks the weight as one spectral sharding may factorise.
    pub fn affine(
        &mut self,
        name: &str,
        c_in: usize,
        c_out: usize,
        bias: bool,
        shardable: bool,
    ) -> Result<Affine<B>, NetError> {
        let fan_in = c_in as f64;
        let weight = self.weight(name, &[c_out, c_in], (6.0 / fan_in).sqrt(), shardable)?;
        let bias = self.bias(name, c_out, bias, 1.0 / fan_in.sqrt())?;
        Ok(Affine { weight, bias })
    }

    /// A convolution `c_in → c_out` with a square `kernel`, weight `{name}.weight`
    /// (`c_out × c_in × k × k`) and optional bias.
    #[allow(clippy::too_many_arguments)]
    pub fn conv(
        &mut self,
        name: &str,
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        bias: bool,
        shardable: bool,
    ) -> Result<Conv<B>, NetError> {
        let fan_in = (c_in * kernel * kernel) as f64;
        let shape = [c_out, c_in, kernel, kernel];
        let weight = self.weight(name, &shape, (6.0 / fan_in).sqrt(), shardable)?;
        let bias = self.bias(name, c_out, bias, 1.0 / fan_in.sqrt())?;
        Ok(Conv {
            weight,
            bias,
            in_channels: c_in,
            kernel: [kernel, kernel],
            stride: [stride, stride],
            padding: [padding, padding],
        })
    }

    fn bias(
        &mut self,
        layer: &str,
        c_out: usize,
        present: bool,
        bound: f64,
    ) -> Result<Option<Param<Tensor<B, 1>>>, NetError> {
        if !present {
            return Ok(None);
        }
        self.tensor(&format!("{layer}.bias"), [c_out], Init::Uniform(bound))
            .map(Some)
    }

    fn weight(
        &mut self,
        layer: &str,
        shape: &[usize],
        bound: f64,
        shardable: bool,
    ) -> Result<Weight<B>, NetError> {
        let name = format!("{layer}.weight");
        let rows = shape[0];
        let cols: usize = shape[1..].iter().product();
        if let Mode::Load { shards, used, .. } = &mut self.mode
            && let Some(shard) = shards.iter().find(|s| s.name == name)
        {
            if !shardable {
                return Err(NetError::NeverSharded { name });
            }
            if shard.shape != shape {
                return Err(NetError::ShardShape {
                    name,
                    found: shard.shape.clone(),
                    expected: shape.to_vec(),
                });
            }
            let factors = Factors::from_rows(
                &shard.left,
                &shard.right,
                &shard.multipliers,
                rows,
                cols,
                &self.device,
            )
            .map_err(|source| NetError::Factors {
                name: name.clone(),
                source,
            })?;
            used.insert(name.clone());
            self.roles.insert(factors.u.id, Role::Left(name.clone()));
            self.roles.insert(factors.v.id, Role::Right(name));
            return Ok(Weight::Factorized(factors));
        }
        if shardable && let Mode::Init { shardable, .. } = &mut self.mode {
            shardable.push(name.clone());
        }
        let data = self.values(&name, shape, Init::Uniform(bound))?;
        let p = param(data, [rows, cols], &self.device);
        self.roles.insert(p.id, Role::Dense(name));
        Ok(Weight::Dense(p))
    }

    /// The values of a dense tensor: drawn (init) or looked up and shape-checked (load).
    fn values(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Vec<f32>, NetError> {
        match &mut self.mode {
            Mode::Init { rng, tensors, .. } => {
                let len = shape.iter().product();
                let data = draw(rng, init, len);
                // The recorded initial state keeps its own copy; init runs once per run.
                tensors.push(NamedTensor {
                    name: name.to_string(),
                    shape: shape.to_vec(),
                    data: data.clone(),
                });
                Ok(data)
            }
            Mode::Load { dense, used, .. } => {
                let t = dense.get(name).ok_or_else(|| NetError::MissingTensor {
                    name: name.to_string(),
                })?;
                if t.shape != shape {
                    return Err(NetError::TensorShape {
                        name: name.to_string(),
                        found: t.shape.clone(),
                        expected: shape.to_vec(),
                    });
                }
                used.insert(name.to_string());
                Ok(t.data.clone())
            }
        }
    }
}

fn draw(rng: &mut ChaCha20Rng, init: Init, len: usize) -> Vec<f32> {
    match init {
        Init::Zeros => vec![0.0; len],
        Init::Ones => vec![1.0; len],
        Init::Uniform(b) => (0..len)
            .map(|_| ((2.0 * uniform(rng) - 1.0) * b) as f32)
            .collect(),
        Init::Normal(sigma) => (0..len)
            .map(|_| {
                // Box–Muller; 1 − u keeps the logarithm finite.
                let (u1, u2) = (1.0 - uniform(rng), uniform(rng));
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (z * sigma) as f32
            })
            .collect(),
    }
}

/// Reads a trained module back into the server's form: the task's dense tensors and shards
/// (same names, shapes, indices and ω) with the trained values.
pub fn export<B: Backend, M: Module<B>>(
    module: &M,
    layout: &Layout,
    dense: &ModelState,
    shards: &[LayerShard],
) -> Result<(ModelState, Vec<LayerShard>), NetError> {
    let mut collector = Collector {
        layout,
        values: HashMap::new(),
        error: None,
    };
    module.visit(&mut collector);
    if let Some(e) = collector.error {
        return Err(e);
    }
    let mut values = collector.values;
    let mut take = |role: Role| {
        values
            .remove(&role)
            .ok_or_else(|| NetError::Lost(format!("{role:?}")))
    };
    let mut tensors = Vec::with_capacity(dense.tensors.len());
    for t in &dense.tensors {
        tensors.push(NamedTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            data: take(Role::Dense(t.name.clone()))?,
        });
    }
    let mut out_shards = Vec::with_capacity(shards.len());
    for s in shards {
        out_shards.push(LayerShard {
            left: take(Role::Left(s.name.clone()))?,
            right: take(Role::Right(s.name.clone()))?,
            ..s.clone()
        });
    }
    Ok((ModelState::new(tensors)?, out_shards))
}

struct Collector<'l> {
    layout: &'l Layout,
    values: HashMap<Role, Vec<f32>>,
    error: Option<NetError>,
}

impl<B: Backend> ModuleVisitor<B> for Collector<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(role) = self.layout.roles.get(&param.id) else {
            return;
        };
        match param.val().into_data().into_vec::<f32>() {
            Ok(v) => {
                self.values.insert(role.clone(), v);
            }
            Err(e) => {
                self.error = Some(NetError::Read {
                    what: format!("{role:?}"),
                    cause: format!("{e:?}"),
                })
            }
        }
    }
}
