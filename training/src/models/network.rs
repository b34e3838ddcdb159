//! The model seam: what local training and evaluation need from a network, so that a program
//! can bring its own network (`examples/custom_model.rs`) and train it exactly as the shipped
//! ones are trained, sharded by every strategy, without editing this crate.
//!
//! A [`Network`] is a description (sizes, no tensors) that builds its burn module through a
//! [`Builder`]: in init mode for the server's initial model, in load mode from a cohort's
//! tasks. Because every layer comes from the builder, the runtime learns the tensors' names and
//! which weights are shardable from the build itself, and reads a trained module back with
//! [`export`](crate::models::builder::export) without any per-model code. The built module is a
//! [`Forward`]: logits for a batch, and its affine and convolutional weights (the Frobenius
//! decay and ClipLR act on them). [`Architecture`] is the shipped models' `Network`.
//!
//! Why two traits: the description is shared by the server and every client (cloned into each
//! trainer), the module is built afresh on each backend for each task; burn modules are generic
//! over their backend, so the description names its module type per backend (a generic
//! associated type).

use crate::models::NetError;
use crate::models::builder::{Builder, InitialState, Layout, Task};
use crate::models::kernels::{Cohort, Kernels};
use crate::models::layers::Weight;
use crate::models::net::{Architecture, Net};
use crate::models::widths::cohort_width;
use burn::module::Module;
use burn::tensor::Tensor;
use fedshard_protocol::width::WidthGroup;
use std::fmt;

/// A network's description: builds its [`Network::Module`] through a [`Builder`].
pub trait Network: fmt::Debug + Clone + Send + Sync + 'static {
    /// The burn module this network builds on backend `B` (`#[derive(Module)]` over layers
    /// the builder made: [`Affine`](crate::models::layers::Affine),
    /// [`Conv`](crate::models::layers::Conv), the norms of [`crate::models::blocks`]).
    type Module<B: Kernels>: Forward<B>;

    /// Features per input row; the data's rows must have this width.
    fn input_width(&self) -> usize;

    /// Builds the module, asking `builder` for every trainable tensor by name (init or load
    /// mode); a layer built with `shardable = true` is one spectral sharding may factorise.
    fn build<B: Kernels>(&self, builder: &mut Builder<B>) -> Result<Self::Module<B>, NetError>;

    /// The initial global model drawn from `seed`, and the names of the weights built
    /// shardable, in build order.
    fn initial_state(&self, seed: u64) -> Result<InitialState, NetError> {
        let device = Default::default();
        let mut builder = Builder::<burn::backend::NdArray>::init(seed, &device);
        self.build(&mut builder)?;
        let (_, init) = builder.finish()?;
        Ok(init.expect("an init-mode builder always records its state"))
    }

    /// The hidden widths a width strategy (HeteroFL, FedRolex) may narrow, and the tensor axes
    /// that follow each. The default, none, is a network without a width description: the
    /// server refuses width strategies for it. A network that describes widths asks its
    /// [`Builder`] for each of them ([`Builder::units`]) under the same names.
    fn width_groups(&self) -> Vec<WidthGroup> {
        Vec::new()
    }

    /// The sub-models of a cohort's clients (one sub-model shape) as one stacked module, and
    /// its layout for reading the trained tensors back; tasks that carry a width slice (all or
    /// none, of equal widths) build the narrowed model, with HeteroFL's scaler.
    fn load_cohort<B: Kernels>(
        &self,
        tasks: &[Task<'_>],
        device: &B::Device,
    ) -> Result<(Self::Module<B>, Layout), NetError> {
        let mut builder = Builder::load(tasks, device);
        if let Some(slice) = cohort_width(tasks)? {
            let groups = self.width_groups();
            if let Some(name) = slice
                .kept
                .keys()
                .find(|n| groups.iter().all(|g| &g.name != *n))
            {
                return Err(NetError::Unsupported(format!(
                    "the task slices width `{name}`, which this network does not describe"
                )));
            }
            builder = builder.with_width(slice, &groups);
        }
        let module = self.build(&mut builder)?;
        let (layout, _) = builder.finish()?;
        Ok((module, layout))
    }
}

/// A built network: what the training loop and the evaluator call (the evaluator shares it
/// between its threads, hence `Sync`).
pub trait Forward<B: Kernels>: Module<B> + Sync {
    /// Logits, one row per prediction, for the rows of `x` (`cohort` says which rows are
    /// whose: a layer built by the builder takes it in its own `forward`).
    fn forward(&self, x: Tensor<B, 2>, cohort: &Cohort) -> Tensor<B, 2>;

    /// Every affine and convolutional weight: the Frobenius-decay terms and the ClipLR targets.
    fn weights(&self) -> Vec<&Weight<B>>;
}

impl Network for Architecture {
    type Module<B: Kernels> = Net<B>;

    fn input_width(&self) -> usize {
        Architecture::input_width(self)
    }

    fn build<B: Kernels>(&self, builder: &mut Builder<B>) -> Result<Net<B>, NetError> {
        Architecture::build(self, builder)
    }

    fn width_groups(&self) -> Vec<WidthGroup> {
        Architecture::width_groups(self)
    }

    /// An ONNX model's initial values are its file's initializers, not draws.
    fn initial_state(&self, seed: u64) -> Result<InitialState, NetError> {
        Architecture::initial_state(self, seed)
    }
}

impl<B: Kernels> Forward<B> for Net<B> {
    fn forward(&self, x: Tensor<B, 2>, cohort: &Cohort) -> Tensor<B, 2> {
        Net::forward(self, x, cohort)
    }

    fn weights(&self) -> Vec<&Weight<B>> {
        Net::weights(self)
    }
}
