//! FedProx's proximal term (docs/algorithms.md §11; Li et al., *Federated Optimization in
//! Heterogeneous Networks*, MLSys 2020, Eq. (2)): a client minimises
//! `F_k(w) + (μ/2) ‖w − w⁰‖²`, where `w⁰` is what its task sent, so local steps are held near
//! the global model on skewed data. Its gradient `μ (w − w⁰)` is added to every trained
//! parameter's, in the space the client trains: a dense tensor's values, a spectral shard's
//! factors `U` and `V` as sent (the client never holds the global weight `W`, only the terms it
//! was sent, so the term holds those terms near their sent values), a width slice's kept units.

use crate::models::NetError;
use crate::models::builder::{Layout, Task};
use crate::models::kernels::TrainingBackend;
use crate::models::network::Network;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use std::collections::HashMap;

/// The sent value `w⁰` of every parameter of a cohort's model, under that model's parameter
/// ids.
pub(crate) struct Anchor<B: TrainingBackend> {
    values: HashMap<ParamId, FloatTensor<B::InnerBackend>>,
}

impl<B: TrainingBackend> Anchor<B> {
    /// Loads `sent` (the cohort's tasks as their clients received them) as a model of its own
    /// and keys its values by the ids of the model being trained, whose layout is `layout`.
    pub(crate) fn of<N: Network>(
        network: &N,
        sent: &[Task<'_>],
        layout: &Layout,
        device: &B::Device,
    ) -> Result<Self, NetError>
    where
        N::Module<B>: AutodiffModule<B>,
    {
        let (module, sent_layout) = network.load_cohort::<B>(sent, device)?;
        let ids = sent_layout.matching(layout);
        let mut collect = Collect::<B> {
            ids: &ids,
            values: HashMap::new(),
        };
        module.visit(&mut collect);
        Ok(Self {
            values: collect.values,
        })
    }

    /// Adds `μ (w − w⁰)` to the gradient of every parameter of `module` that has one.
    pub(crate) fn add_gradient<M: Module<B>>(
        &self,
        module: &M,
        grads: &mut GradientsParams,
        mu: f64,
    ) {
        if mu == 0.0 {
            return;
        }
        module.visit(&mut Add {
            anchor: self,
            grads,
            mu,
        });
    }

    /// The held value of parameter `id`: SCAFFOLD's correction `c − c_i`
    /// (`train/scaffold.rs`) is held per parameter like FedProx's anchor, and the optimizer
    /// adds it to each step.
    pub(crate) fn value(&self, id: &ParamId) -> Option<&FloatTensor<B::InnerBackend>> {
        self.values.get(id)
    }
}

struct Collect<'i, B: TrainingBackend> {
    ids: &'i HashMap<ParamId, ParamId>,
    values: HashMap<ParamId, FloatTensor<B::InnerBackend>>,
}

impl<B: TrainingBackend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(&id) = self.ids.get(&param.id) {
            let value = param.val().inner().into_primitive().tensor();
            self.values.insert(id, value);
        }
    }
}

struct Add<'a, B: TrainingBackend> {
    anchor: &'a Anchor<B>,
    grads: &'a mut GradientsParams,
    mu: f64,
}

impl<B: TrainingBackend> ModuleVisitor<B> for Add<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(sent) = self.anchor.values.get(&param.id) else {
            return;
        };
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let sent =
            Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(sent.clone()));
        let pull = (param.val().inner() - sent).mul_scalar(self.mu);
        self.grads.register(param.id, grad + pull);
    }
}

#[cfg(test)]
#[path = "proximal_tests.rs"]
pub(crate) mod tests;
