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
//!
//! Under a width strategy (HeteroFL, FedRolex) load mode builds the narrowed sub-model the
//! task's sliced tensors describe ([`Builder::with_width`]): the model's constructor asks the
//! builder how many units of each width to build ([`Builder::units`]), so one constructor
//! builds the global model and every sub-model.
//!
//! Every tensor carries a leading client axis: load mode takes the tasks of a cohort (clients
//! with one sub-model shape, trained as one computation; `kernels/cohort.rs`) and stacks their
//! values, one client after another; a single task is a cohort of one.

use crate::models::NetError;
use crate::models::kernels::{ConvGeometry, Kernels};
use crate::models::layers::{Affine, Conv, Factors, Weight, param};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use fedshard_protocol::model::{ModelState, NamedTensor};
use fedshard_protocol::task::LayerShard;
use fedshard_protocol::width::{WidthGroup, WidthSlice};
use fedshard_protocol::work::{Arithmetic, WeightUse};
use fedshard_strategies::rng::{ChaCha20Rng, Purpose, stream, uniform};
use std::collections::{BTreeMap, BTreeSet, HashMap};

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
        /// Initial values by name instead of draws (a model file's initializers).
        given: Option<&'a ModelState>,
        tensors: Vec<NamedTensor>,
        shardable: Vec<String>,
    },
    Load {
        tasks: &'a [Task<'a>],
        used: BTreeSet<String>,
        /// The cohort's sub-model widths ([`Builder::with_width`]); `None` builds full widths.
        width: Option<Narrowed>,
    },
}

/// A narrowed build: the kept units of every width, and HeteroFL's scaler.
struct Narrowed {
    widths: BTreeMap<String, usize>,
    /// The ratio every layer in `scaled` divides its output by (HeteroFL's scaler), if any.
    scaler: Option<f64>,
    /// The affine and convolutional weights whose outputs are sliced (axis 0 of a width).
    scaled: BTreeSet<String>,
}

/// Builds a model's layers by name; see the module documentation.
pub struct Builder<'a, B: Backend> {
    device: B::Device,
    mode: Mode<'a>,
    roles: HashMap<ParamId, Role>,
    /// Positions of a sample at which the layers built next apply ([`Builder::at_positions`]).
    positions: usize,
    /// Where the layers built so far multiply, for the multiply-add count.
    arithmetic: Arithmetic,
}

/// One client's tensors in load mode: a task's dense tensors and shards, and the units of
/// every width it keeps under a width strategy (its dense tensors are then the sliced ones).
pub type Task<'a> = (&'a ModelState, &'a [LayerShard], Option<&'a WidthSlice>);

/// What init mode records: the initial global state and the names of the shardable weights.
pub type InitialState = (ModelState, Vec<String>);

/// The parameter → tensor map of a built model, needed by [`export`].
#[derive(Debug)]
pub struct Layout {
    roles: HashMap<ParamId, Role>,
}

impl Layout {
    /// For each parameter of this layout, the parameter of `other` that holds the same named
    /// tensor (a model rebuilt from the same description).
    pub fn matching(&self, other: &Layout) -> HashMap<ParamId, ParamId> {
        let by_role: HashMap<&Role, ParamId> =
            other.roles.iter().map(|(id, role)| (role, *id)).collect();
        self.roles
            .iter()
            .filter_map(|(id, role)| Some((*id, *by_role.get(role)?)))
            .collect()
    }
}

impl<'a, B: Backend> Builder<'a, B> {
    /// A builder that draws fresh initial values from the run's `Init` stream.
    pub fn init(seed: u64, device: &B::Device) -> Self {
        Self {
            device: device.clone(),
            mode: Mode::Init {
                rng: Box::new(stream(seed, 0, 0, Purpose::Init)),
                given: None,
                tensors: Vec::new(),
                shardable: Vec::new(),
            },
            roles: HashMap::new(),
            positions: 1,
            arithmetic: Arithmetic::default(),
        }
    }

    /// An init-mode builder that takes each tensor's initial value from `given` by name (an
    /// imported model's initializers) instead of drawing it; a name `given` lacks is an error.
    pub fn given(given: &'a ModelState, device: &B::Device) -> Self {
        let mut builder = Self::init(0, device);
        if let Mode::Init { given: g, .. } = &mut builder.mode {
            *g = Some(given);
        }
        builder
    }

    /// A builder that reads the dense tensors and shards of a cohort's tasks (at least one),
    /// stacking them along the leading client axis.
    pub fn load(tasks: &'a [Task<'a>], device: &B::Device) -> Self {
        assert!(!tasks.is_empty(), "a cohort has at least one task");
        Self {
            device: device.clone(),
            mode: Mode::Load {
                tasks,
                used: BTreeSet::new(),
                width: None,
            },
            roles: HashMap::new(),
            positions: 1,
            arithmetic: Arithmetic::default(),
        }
    }

    /// A load-mode builder that builds the sub-model `slice` cuts out of a model whose widths
    /// are `groups` (the network's [`width_groups`](crate::models::network::Network::width_groups)):
    /// every width the model asks for through [`Builder::units`] is the slice's, and every
    /// affine or convolutional layer whose outputs a width slices divides them by the slice's
    /// [`scaler`](WidthSlice::scaler) (HeteroFL's, so the narrowed layers' activations keep
    /// the full model's scale; none at r = 1 or under FjORD's ordered dropout). No effect in
    /// init mode: the global model is never narrowed.
    pub fn with_width(mut self, slice: &WidthSlice, groups: &[WidthGroup]) -> Self {
        if let Mode::Load { width, .. } = &mut self.mode {
            let scaled = groups
                .iter()
                .flat_map(|g| &g.axes)
                .filter(|a| a.axis == 0)
                .map(|a| a.tensor.clone())
                .collect();
            *width = Some(Narrowed {
                widths: slice.widths(),
                scaler: slice.scaler(),
                scaled,
            });
        }
        self
    }

    /// How many units of width `group` (full, `full` units) to build: `full` in init mode or
    /// without a width, else the kept count. Model constructors ask this for every width they
    /// build, so one constructor builds the global model and every sub-model.
    pub fn units(&self, group: &str, full: usize) -> usize {
        match &self.mode {
            Mode::Load { width: Some(n), .. } => n.widths.get(group).copied().unwrap_or(full),
            _ => full,
        }
    }

    /// HeteroFL's scaler of the layer whose weight is `weight`: the keep ratio its output is
    /// divided by during local training, `None` for a layer whose outputs are whole.
    fn scaler(&self, weight: &str) -> Option<f64> {
        match &self.mode {
            Mode::Load { width: Some(n), .. } if n.scaled.contains(weight) => n.scaler,
            _ => None,
        }
    }

    /// The number of clients C the tensors are stacked for.
    pub fn clients(&self) -> usize {
        match &self.mode {
            Mode::Init { .. } => 1,
            Mode::Load { tasks, .. } => tasks.len(),
        }
    }

    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The layers built from here on apply at `positions` places of each sample: a
    /// convolution's output H · W, a transformer's tokens (1 until set: a feature vector). Only
    /// the multiply-add count ([`Builder::arithmetic`]) reads it.
    pub fn at_positions(&mut self, positions: usize) {
        self.positions = positions;
    }

    /// The positions set by [`Builder::at_positions`].
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Counts `per_position` multiply-adds of products between two activations (attention's
    /// scores and weighted values, a pooling's weighted sum) at each of the positions set by
    /// [`Builder::at_positions`].
    pub fn between_activations(&mut self, per_position: usize) {
        self.arithmetic.between_activations += (self.positions * per_position) as u64;
    }

    /// Where the layers built so far multiply in one sample's forward pass.
    pub fn arithmetic(&self) -> &Arithmetic {
        &self.arithmetic
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
            Mode::Load { tasks, used, .. } => {
                let names: BTreeSet<String> = tasks
                    .iter()
                    .flat_map(|(dense, shards, _)| {
                        let dense = dense.tensors.iter().map(|t| t.name.as_str());
                        dense.chain(shards.iter().map(|s| s.name.as_str()))
                    })
                    .filter(|n| !used.contains(*n))
                    .map(str::to_string)
                    .collect();
                let names: Vec<String> = names.into_iter().collect();
                if names.is_empty() {
                    Ok((layout, None))
                } else {
                    Err(NetError::UnknownTensors { names })
                }
            }
        }
    }

    /// A dense trainable vector of `len` values per client (`C × len`: norm scales and
    /// shifts, biases).
    pub fn vector(
        &mut self,
        name: &str,
        len: usize,
        init: Init,
    ) -> Result<Param<Tensor<B, 2>>, NetError> {
        let data = self.values(name, &[len], init)?;
        let p = param(data, [self.clients(), len], &self.device);
        self.roles.insert(p.id, Role::Dense(name.to_string()));
        Ok(p)
    }

    /// A dense trainable tensor of any `shape` per client, held flat (`C × len`).
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        init: Init,
    ) -> Result<Param<Tensor<B, 2>>, NetError> {
        let data = self.values(name, shape, init)?;
        let len = shape.iter().product();
        let p = param(data, [self.clients(), len], &self.device);
        self.roles.insert(p.id, Role::Dense(name.to_string()));
        Ok(p)
    }

    /// A dense trainable matrix per client (`C × rows × cols`: embeddings, positional tables).
    pub fn matrix(
        &mut self,
        name: &str,
        [rows, cols]: [usize; 2],
        init: Init,
    ) -> Result<Param<Tensor<B, 3>>, NetError> {
        let data = self.values(name, &[rows, cols], init)?;
        let p = param(data, [self.clients(), rows, cols], &self.device);
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
        let bias = bias.then(|| format!("{name}.bias"));
        let weight = format!("{name}.weight");
        self.affine_named(&weight, bias.as_deref(), c_in, c_out, shardable)
    }

    /// [`Builder::affine`] with the weight's and bias's names given in full (an imported
    /// model's initializer names).
    pub fn affine_named(
        &mut self,
        weight: &str,
        bias: Option<&str>,
        c_in: usize,
        c_out: usize,
        shardable: bool,
    ) -> Result<Affine<B>, NetError> {
        let fan_in = c_in as f64;
        let scaler = self.scaler(weight);
        let weight = self.weight(weight, &[c_out, c_in], (6.0 / fan_in).sqrt(), shardable)?;
        let bias = self.bias(bias, c_out, 1.0 / fan_in.sqrt())?;
        Ok(Affine {
            weight,
            bias,
            scaler,
        })
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
        let bias = bias.then(|| format!("{name}.bias"));
        let geometry = ConvGeometry {
            kernel: [kernel, kernel],
            stride: [stride, stride],
            padding: [padding, padding],
        };
        let weight = format!("{name}.weight");
        self.conv_named(&weight, bias.as_deref(), c_in, c_out, geometry, shardable)
    }

    /// [`Builder::conv`] with the weight's and bias's names given in full (an imported
    /// model's initializer names) and any rectangular geometry.
    pub fn conv_named(
        &mut self,
        weight: &str,
        bias: Option<&str>,
        c_in: usize,
        c_out: usize,
        geometry: ConvGeometry,
        shardable: bool,
    ) -> Result<Conv<B>, NetError> {
        let [kh, kw] = geometry.kernel;
        let fan_in = (c_in * kh * kw) as f64;
        let shape = [c_out, c_in, kh, kw];
        let scaler = self.scaler(weight);
        let weight = self.weight(weight, &shape, (6.0 / fan_in).sqrt(), shardable)?;
        let bias = self.bias(bias, c_out, 1.0 / fan_in.sqrt())?;
        Ok(Conv {
            weight,
            bias,
            scaler,
            in_channels: c_in,
            kernel: geometry.kernel,
            stride: geometry.stride,
            padding: geometry.padding,
        })
    }

    fn bias(
        &mut self,
        name: Option<&str>,
        c_out: usize,
        bound: f64,
    ) -> Result<Option<Param<Tensor<B, 2>>>, NetError> {
        let Some(name) = name else {
            return Ok(None);
        };
        self.vector(name, c_out, Init::Uniform(bound)).map(Some)
    }

    fn weight(
        &mut self,
        name: &str,
        shape: &[usize],
        bound: f64,
        shardable: bool,
    ) -> Result<Weight<B>, NetError> {
        let name = name.to_string();
        self.arithmetic.weights.insert(
            name.clone(),
            WeightUse {
                positions: self.positions as u64,
                convolution: shape.len() == 4,
            },
        );
        let rows = shape[0];
        let cols: usize = shape[1..].iter().product();
        let clients = self.clients();
        if let Mode::Load { tasks, used, .. } = &mut self.mode
            && let Some(shards) = cohort_shards(tasks, &name)?
        {
            if !shardable {
                return Err(NetError::NeverSharded { name });
            }
            let (mut left, mut right, mut multipliers) = (Vec::new(), Vec::new(), Vec::new());
            for shard in shards {
                if shard.shape != shape {
                    return Err(NetError::ShardShape {
                        name,
                        found: shard.shape.clone(),
                        expected: shape.to_vec(),
                    });
                }
                left.extend_from_slice(&shard.left);
                right.extend_from_slice(&shard.right);
                multipliers.extend_from_slice(&shard.multipliers);
            }
            let factors = Factors::from_rows(
                left,
                right,
                multipliers,
                [clients, rows, cols],
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
        let p = param(data, [clients, rows, cols], &self.device);
        self.roles.insert(p.id, Role::Dense(name));
        Ok(Weight::Dense(p))
    }

    /// The values of a dense tensor: drawn (init) or looked up and shape-checked (load).
    fn values(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Vec<f32>, NetError> {
        match &mut self.mode {
            Mode::Init {
                rng,
                given,
                tensors,
                ..
            } => {
                let len = shape.iter().product();
                let data = match given {
                    None => draw(rng, init, len),
                    Some(given) => {
                        let t = given.get(name).ok_or_else(|| NetError::MissingTensor {
                            name: name.to_string(),
                        })?;
                        if t.data.len() != len {
                            return Err(NetError::TensorShape {
                                name: name.to_string(),
                                found: t.shape.clone(),
                                expected: shape.to_vec(),
                            });
                        }
                        t.data.clone()
                    }
                };
                // The recorded initial state keeps its own copy; init runs once per run.
                tensors.push(NamedTensor {
                    name: name.to_string(),
                    shape: shape.to_vec(),
                    data: data.clone(),
                });
                Ok(data)
            }
            Mode::Load { tasks, used, .. } => {
                let mut data = Vec::new();
                for (dense, _, _) in tasks.iter() {
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
                    data.extend_from_slice(&t.data);
                }
                used.insert(name.to_string());
                Ok(data)
            }
        }
    }
}

/// The shards named `name` of every task of a cohort, or `None` when no task shards the layer;
/// an error when only some do, or their term counts differ.
fn cohort_shards<'t>(
    tasks: &'t [Task<'t>],
    name: &str,
) -> Result<Option<Vec<&'t LayerShard>>, NetError> {
    let found: Vec<Option<&LayerShard>> = tasks
        .iter()
        .map(|(_, shards, _)| shards.iter().find(|s| s.name == name))
        .collect();
    if found.iter().all(Option::is_none) {
        return Ok(None);
    }
    let shards: Option<Vec<&LayerShard>> = found.into_iter().collect();
    let Some(shards) = shards else {
        return Err(NetError::Cohort {
            name: name.to_string(),
            what: "sharded for some clients, dense for others".into(),
        });
    };
    let terms = shards[0].multipliers.len();
    if shards.iter().any(|s| s.multipliers.len() != terms) {
        return Err(NetError::Cohort {
            name: name.to_string(),
            what: "shards of different term counts".into(),
        });
    }
    Ok(Some(shards))
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

/// Reads a trained module back into the server's form, one result per task of the cohort it
/// was loaded from: the task's dense tensors and shards (same names, shapes, indices and ω)
/// with the client's trained values.
pub fn export<B: Kernels, M: Module<B>>(
    module: &M,
    layout: &Layout,
    tasks: &[Task<'_>],
) -> Result<Vec<(ModelState, Vec<LayerShard>)>, NetError> {
    let mut collector = Collector {
        layout,
        values: HashMap::new(),
        error: None,
    };
    module.visit(&mut collector);
    if let Some(e) = collector.error {
        return Err(e);
    }
    let clients = tasks.len();
    let mut values = collector.values;
    // Client c's part of a stacked tensor.
    let mut take = |role: Role, c: usize| -> Result<Vec<f32>, NetError> {
        let all = values
            .get(&role)
            .ok_or_else(|| NetError::Lost(format!("{role:?}")))?;
        let len = all.len() / clients;
        let part = all[c * len..(c + 1) * len].to_vec();
        if c + 1 == clients {
            values.remove(&role);
        }
        Ok(part)
    };
    let mut out = Vec::with_capacity(clients);
    for (c, (dense, shards, _)) in tasks.iter().enumerate() {
        let mut tensors = Vec::with_capacity(dense.tensors.len());
        for t in &dense.tensors {
            tensors.push(NamedTensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                data: take(Role::Dense(t.name.clone()), c)?,
            });
        }
        let mut out_shards = Vec::with_capacity(shards.len());
        for s in shards.iter() {
            out_shards.push(LayerShard {
                name: s.name.clone(),
                shape: s.shape.clone(),
                indices: s.indices.clone(),
                left: take(Role::Left(s.name.clone()), c)?,
                right: take(Role::Right(s.name.clone()), c)?,
                multipliers: s.multipliers.clone(),
            });
        }
        out.push((ModelState::new(tensors)?, out_shards));
    }
    Ok(out)
}

struct Collector<'l> {
    layout: &'l Layout,
    values: HashMap<Role, Vec<f32>>,
    error: Option<NetError>,
}

impl<B: Kernels> ModuleVisitor<B> for Collector<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(role) = self.layout.roles.get(&param.id) else {
            return;
        };
        match B::read_values(param.val()) {
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
