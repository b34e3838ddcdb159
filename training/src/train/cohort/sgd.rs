//! SGD with momentum over a cohort's stacked parameters.

use super::index;
use crate::models::builder::Layout;
use crate::models::kernels::{Kernels, TrainingBackend};
use crate::train::neural::DenseDecay;
use crate::train::proximal::Anchor;
use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{Tensor, TensorPrimitive};
use std::collections::HashMap;

/// SGD with momentum over a cohort's stacked parameters, the same arithmetic as burn's `Sgd`
/// with `Momentum` (no dampening, no Nesterov), so a client's steps are those it takes alone.
/// Its own because a cohort shrinks: when clients leave, each velocity keeps the rows of the
/// clients that stay, under the rebuilt model's parameter ids.
pub(super) struct CohortSgd<B: TrainingBackend> {
    momentum: f64,
    velocity: HashMap<ParamId, FloatTensor<B::InnerBackend>>,
}

impl<B: TrainingBackend> CohortSgd<B> {
    pub(super) fn new(momentum: f64) -> Self {
        Self {
            momentum,
            velocity: HashMap::new(),
        }
    }

    /// One step of every parameter that has a gradient, its dense weights' `decay` joining
    /// the gradient (after FedProx's term), moved further by `−lr · shift` where `shift` holds
    /// a value for it: SCAFFOLD's correction `c − c_i` joins the step outside the momentum, as
    /// the SCAFFOLD optimizer of Flower's baseline (niid_bench) adds it, so that the momentum
    /// amplifies the gradient alone (docs/algorithms.md §12).
    pub(super) fn step<M: Module<B>>(
        &mut self,
        (lr, decay): (f64, &DenseDecay),
        module: M,
        mut grads: GradientsParams,
        shift: Option<&Anchor<B>>,
    ) -> M {
        module.map(&mut Stepper {
            optimizer: self,
            grads: &mut grads,
            lr,
            decay,
            shift,
        })
    }

    /// Keeps the velocity rows of the clients `keep` (indices into the old cohort) under the
    /// ids of the same tensors in `new`.
    pub(super) fn keep(&mut self, old: &Layout, new: &Layout, keep: &[usize], device: &B::Device) {
        let ids = old.matching(new);
        let rows = index::<B::InnerBackend>(keep, device);
        self.velocity = std::mem::take(&mut self.velocity)
            .into_iter()
            .filter_map(|(id, v)| {
                let new_id = *ids.get(&id)?;
                let kept = B::InnerBackend::float_select(v, 0, rows.clone().into_primitive());
                Some((new_id, kept))
            })
            .collect();
    }
}

struct Stepper<'o, B: TrainingBackend> {
    optimizer: &'o mut CohortSgd<B>,
    grads: &'o mut GradientsParams,
    lr: f64,
    decay: &'o DenseDecay,
    shift: Option<&'o Anchor<B>>,
}

impl<B: TrainingBackend> ModuleMapper<B> for Stepper<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let decay = self.decay.of(&id);
        // A dense weight without a gradient still decays: its gradient is the decay alone.
        let grad = match self.grads.remove::<B::InnerBackend, D>(id) {
            Some(grad) => grad,
            None if decay != 0.0 => tensor.clone().inner().zeros_like(),
            None => return Param::from_mapped_value(id, tensor, mapper),
        };
        let require_grad = tensor.is_require_grad();
        let momentum = self.optimizer.momentum;
        let velocity = (momentum > 0.0)
            .then(|| self.optimizer.velocity.remove(&id))
            .flatten();
        let [stepped, velocity] = B::InnerBackend::sgd_step(
            tensor.inner().into_primitive().tensor(),
            grad.into_primitive().tensor(),
            velocity,
            self.lr,
            momentum,
            decay,
        );
        if momentum > 0.0 {
            self.optimizer.velocity.insert(id, velocity);
        }
        let mut stepped =
            Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(stepped));
        if let Some(shift) = self.shift.and_then(|s| s.value(&id)) {
            let shift =
                Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(shift.clone()));
            stepped = stepped - shift.mul_scalar(self.lr);
        }
        let mut tensor = Tensor::from_inner(stepped);
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}
