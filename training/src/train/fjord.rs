//! FjORD's local training (docs/algorithms.md §8.2; Horváth et al., NeurIPS 2021, ordered
//! dropout): a client holds the leading units of every width up to its capacity `p_max` (its
//! task's slice); each batch it draws a level `p` uniformly from the levels up to `p_max` and
//! takes one SGD step on the sub-model of the leading units at `p`, without a scaler.
//!
//! The step is taken in the space of the client's whole slice, as PyTorch's SGD takes it in
//! Flower's FjORD baseline, whose ordered-dropout layers slice one full-size parameter: the
//! gradient is the sub-model's and zero on the units the batch dropped, and the momentum (if
//! the recipe has any) is one velocity over the whole slice, so a unit dropped in this batch
//! still moves by its velocity. The Frobenius decay is the sub-model's own. Every batch builds
//! its own sub-model, so a FjORD client trains alone, never in a cohort.

use crate::models::NetError;
use crate::models::builder::{Task, export};
use crate::models::kernels::{Cohort, TrainingBackend};
use crate::models::network::{Forward, Network};
use crate::train::batches::{self, LocalSteps};
use crate::train::cohort::{Member, Trained};
use crate::train::neural::{add_frobenius_decay, cross_entropy};
use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::{ElementConversion, Tensor};
use fedshard_protocol::model::NamedTensor;
use fedshard_protocol::task::{Recipe, TrainError};
use fedshard_protocol::width::{WidthSlice, coordinates, slice_state};
use fedshard_strategies::rng::{Purpose, stream, uniform};

/// Trains `member`, whose task keeps `slice`, by ordered dropout over `levels` (ascending, the
/// last its capacity): one step per batch of its `(seed, round, client)` batch order, each at
/// a level drawn from its [`Purpose::OrderedDropout`] stream.
pub(crate) fn train<B: TrainingBackend, N: Network>(
    network: &N,
    recipe: &Recipe,
    member: &Member<'_>,
    slice: &WidthSlice,
    levels: &[f64],
    device: &B::Device,
) -> Result<Trained, TrainError>
where
    N::Module<B>: AutodiffModule<B>,
{
    let batches = LocalSteps::new(
        member.examples,
        recipe,
        member.seed,
        member.round,
        member.client,
    )?
    .batches();
    let groups = network.width_groups();
    let sent = &member.dense.tensors;
    // The client's slice as it trains: sliced each batch, stepped in place.
    let mut state = member.dense.clone();
    let mut velocity: Vec<Vec<f32>> = sent.iter().map(|t| vec![0.0; t.data.len()]).collect();
    let mut draws = stream(
        member.seed,
        member.round,
        member.client,
        Purpose::OrderedDropout,
    );
    let (lr, momentum) = (recipe.learning_rate as f32, recipe.momentum as f32);
    let mu = recipe.proximal_mu as f32;
    let mut loss_sum = 0.0;
    for samples in &batches {
        let pick = (uniform(&mut draws) * levels.len() as f64) as usize;
        let level = levels[pick.min(levels.len() - 1)];
        let (local, prefix) = slice.ordered_prefix(&groups, level).map_err(model)?;
        let sub = slice_state(&state, &local, &prefix).map_err(model)?;
        let task: Task<'_> = (&sub, &[], Some(&prefix));
        let (net, layout) = network.load_cohort::<B>(std::slice::from_ref(&task), device)?;
        let (inputs, targets) = batches::batch::<B>(member.examples, samples, device);
        let rows = inputs.dims()[0];
        let loss = cross_entropy(net.forward(inputs, &Cohort::single(rows)), targets);
        loss_sum += loss.clone().into_scalar().elem::<f64>();
        let mut grads = GradientsParams::from_grads(loss.backward(), &net);
        add_frobenius_decay(&net, &mut grads, recipe.weight_decay).add_to(&net, &mut grads);
        let gradient = export(
            &net.map(&mut Gradient { grads: &mut grads }),
            &layout,
            &[task],
        )?
        .pop()
        .ok_or_else(|| NetError::Lost("the gradient of the batch".into()))?
        .0;
        for (((t, v), g), w0) in state
            .tensors
            .iter_mut()
            .zip(&mut velocity)
            .zip(&gradient.tensors)
            .zip(sent)
        {
            let at = coordinates(t, &local, &prefix.kept).map_err(model)?;
            step(t, v, g, at, (&w0.data, mu), lr, momentum)?;
        }
    }
    let mean_loss = loss_sum / batches.len().max(1) as f64;
    if !mean_loss.is_finite() {
        return Err(TrainError::Diverged { mean_loss });
    }
    Ok(Trained {
        dense: state,
        shards: Vec::new(),
        loss: mean_loss,
        control: None,
    })
}

/// A task whose tensors do not fit its slice, as a training error.
fn model(e: impl std::fmt::Display) -> TrainError {
    TrainError::Model(e.to_string().into())
}

/// One SGD step of `tensor` (velocity `velocity`) whose sub-model gradient `gradient` sits at
/// `coordinates` (all of it when `None`); the gradient is zero elsewhere, plus FedProx's
/// `μ (w − w⁰)` over the whole slice (`sent` is `w⁰`), as PyTorch's FedProx takes it over a
/// full-size parameter.
fn step(
    tensor: &mut NamedTensor,
    velocity: &mut [f32],
    gradient: &NamedTensor,
    coordinates: Option<Vec<usize>>,
    (sent, mu): (&[f32], f32),
    lr: f32,
    momentum: f32,
) -> Result<(), NetError> {
    let at = coordinates.unwrap_or_else(|| (0..tensor.data.len()).collect());
    if gradient.name != tensor.name || gradient.data.len() != at.len() {
        return Err(NetError::Lost(format!(
            "the gradient of `{}` ({} values) for {} coordinates",
            tensor.name,
            gradient.data.len(),
            at.len()
        )));
    }
    for ((v, &w), &w0) in velocity.iter_mut().zip(&tensor.data).zip(sent) {
        *v = *v * momentum + mu * (w - w0);
    }
    for (&i, &g) in at.iter().zip(&gradient.data) {
        velocity[i] += g;
    }
    for (w, &v) in tensor.data.iter_mut().zip(velocity.iter()) {
        *w -= lr * v;
    }
    Ok(())
}

/// Replaces every parameter of a module by its gradient (zero where it has none), so the
/// builder's [`export`] reads the gradient in the server's tensor form.
struct Gradient<'g> {
    grads: &'g mut GradientsParams,
}

impl<B: TrainingBackend> ModuleMapper<B> for Gradient<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let gradient = match self.grads.remove::<B::InnerBackend, D>(id) {
            Some(g) => Tensor::from_inner(g),
            None => tensor.zeros_like(),
        };
        Param::from_mapped_value(id, gradient, mapper)
    }
}
