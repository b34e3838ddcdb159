//! Local training of a cohort (docs/design.md, "Cohorts"): clients whose tasks share one
//! sub-model shape and one recipe train as one computation. Their parameters are stacked along
//! a leading client axis, each step's batch holds every client's own mini-batch one after
//! another, and each operation runs once for all of them (`models/kernels/cohort.rs`). A client
//! trained alone is a cohort of one: there is one training loop.
//!
//! Each client keeps its own examples, order of batches (its `(seed, round, client)` stream),
//! number of steps, loss and optimiser state. When a client's steps are done it leaves: its
//! trained tensors are read out, and the others continue in a model rebuilt without it, their
//! momentum carried over. On the CPU each client's numbers are those it gets alone, bit for
//! bit (the cohort kernels run the one-client kernels on each client's slice).

use crate::models::NetError;
use crate::models::builder::{Layout, Task, export};
use crate::models::kernels::{Cohort, TrainingBackend};
use crate::models::network::{Forward, Network};
use crate::train::batches::LocalSteps;
use crate::train::fjord;
use crate::train::neural::{Examples, add_frobenius_decay, clip_lr, cross_entropy};
use crate::train::proximal::Anchor;
use crate::train::scaffold;
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::{LayerShard, Recipe, TrainError, Variates};
use fedshard_protocol::width::{LocalWidth, WidthSlice};
use sgd::CohortSgd;

mod sgd;

/// One client of a cohort: the tensors its task sends, its examples and the ids of its
/// batch-order stream.
pub struct Member<'a> {
    pub dense: &'a ModelState,
    pub shards: &'a [LayerShard],
    /// Under a width strategy, the units this client keeps: `dense` holds the sliced tensors
    /// and it trains the narrowed model with HeteroFL's scaler.
    pub width: Option<&'a WidthSlice>,
    pub examples: &'a dyn Examples,
    pub seed: u64,
    pub round: u64,
    pub client: u64,
    /// Under SCAFFOLD, the variates that correct this client's steps (`train/scaffold.rs`).
    pub variates: Option<&'a Variates>,
}

impl Member<'_> {
    /// FjORD's levels when this member trains its slice by ordered dropout
    /// (`train/fjord.rs`), alone.
    pub fn ordered_dropout(&self) -> Option<&[f64]> {
        match self.width.map(|w| &w.local) {
            Some(LocalWidth::OrderedDropout { levels }) => Some(levels),
            _ => None,
        }
    }
}

/// A client's trained tensors in the server's form and its mean training loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Trained {
    pub dense: ModelState,
    pub shards: Vec<LayerShard>,
    pub loss: f64,
    /// Under SCAFFOLD, the client's `Δc_i`.
    pub control: Option<ModelState>,
}

/// Trains `members` (one sub-model shape) under `recipe` as one computation on `device`; one
/// result per member, in order. Members that train by ordered dropout (FjORD) train one at a
/// time, each batch at its own width. A member refused before training (no samples) or diverged gets
/// its own error; a cohort whose tasks do not load together is trained one client at a time,
/// so each gets its own verdict.
pub fn train<B: TrainingBackend, N: Network>(
    network: &N,
    recipe: &Recipe,
    members: &[Member<'_>],
    device: &B::Device,
) -> Vec<Result<Trained, TrainError>>
where
    N::Module<B>: AutodiffModule<B>,
{
    if members.iter().any(|m| m.ordered_dropout().is_some()) {
        return members
            .iter()
            .map(|m| match (m.width, m.ordered_dropout()) {
                (Some(slice), Some(levels)) => {
                    fjord::train::<B, N>(network, recipe, m, slice, levels, device)
                }
                _ => train::<B, N>(network, recipe, std::slice::from_ref(m), device)
                    .pop()
                    .expect("one result per member"),
            })
            .collect();
    }
    let mut results: Vec<Option<Result<Trained, TrainError>>> =
        members.iter().map(|_| None).collect();
    let mut schedules = Vec::new();
    for (i, m) in members.iter().enumerate() {
        match LocalSteps::new(m.examples, recipe, m.seed, m.round, m.client) {
            Ok(steps) => schedules.push((i, steps.batches())),
            Err(e) => results[i] = Some(Err(e)),
        }
    }
    if !schedules.is_empty() {
        let tasks: Vec<Task<'_>> = schedules
            .iter()
            .map(|&(i, _)| (members[i].dense, members[i].shards, members[i].width))
            .collect();
        match network.load_cohort::<B>(&tasks, device) {
            Ok(loaded) => {
                let run = Run {
                    network,
                    recipe,
                    members,
                    device,
                };
                for (i, result) in run.steps(loaded, schedules) {
                    results[i] = Some(result);
                }
            }
            Err(e) if schedules.len() == 1 => results[schedules[0].0] = Some(Err(e.into())),
            Err(_) => {
                for (i, _) in schedules {
                    let alone = train::<B, N>(network, recipe, &members[i..=i], device);
                    results[i] = alone.into_iter().next();
                }
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every member has a result"))
        .collect()
}

/// The fixed inputs of one cohort's training.
struct Run<'r, 'm, B: Backend, N> {
    network: &'r N,
    recipe: &'r Recipe,
    members: &'r [Member<'m>],
    device: &'r B::Device,
}

/// A client still training: its member index, its batches and its tensors when the model was
/// last (re)built.
struct Active {
    member: usize,
    batches: Vec<Vec<usize>>,
    state: Option<(ModelState, Vec<LayerShard>)>,
}

impl<B: TrainingBackend, N: Network> Run<'_, '_, B, N>
where
    N::Module<B>: AutodiffModule<B>,
{
    /// The step loop: every active client takes its next batch; clients whose batches are done
    /// leave with their results.
    fn steps(
        &self,
        (mut net, mut layout): (N::Module<B>, Layout),
        schedules: Vec<(usize, Vec<Vec<usize>>)>,
    ) -> Vec<(usize, Result<Trained, TrainError>)> {
        let mut done = Vec::new();
        let mut active: Vec<Active> = schedules
            .into_iter()
            .map(|(member, batches)| Active {
                member,
                batches,
                state: None,
            })
            .collect();
        let mut optimizer = CohortSgd::<B>::new(self.recipe.momentum);
        let mut anchor = match self.anchor(&active, &layout) {
            Ok(anchor) => anchor,
            Err(e) => return fail_all(done, &active, &e),
        };
        let mut correction = match self.correction(&active, &layout) {
            Ok(correction) => correction,
            Err(e) => return fail_all(done, &active, &e),
        };
        let mut loss_sums = Tensor::<B, 1>::zeros([active.len()], self.device);
        let per_row = self.members[active[0].member].examples.targets_per_row();
        for step in 0.. {
            if active.iter().any(|a| a.batches.len() == step) {
                let exported = match self.export(&net, &layout, &active) {
                    Ok(exported) => exported,
                    Err(e) => return fail_all(done, &active, &e),
                };
                let sums: Vec<f32> = loss_sums
                    .clone()
                    .into_data()
                    .into_vec()
                    .unwrap_or_else(|_| vec![f32::NAN; active.len()]);
                let (mut keep, mut staying) = (Vec::new(), Vec::new());
                let leaving = std::mem::take(&mut active)
                    .into_iter()
                    .zip(exported)
                    .zip(sums);
                for (c, ((mut a, state), sum)) in leaving.enumerate() {
                    if a.batches.len() == step {
                        let mean = f64::from(sum) / step.max(1) as f64;
                        let result = if mean.is_finite() {
                            self.trained(a.member, state, mean, step)
                        } else {
                            Err(TrainError::Diverged { mean_loss: mean })
                        };
                        done.push((a.member, result));
                    } else {
                        a.state = Some(state);
                        keep.push(c);
                        staying.push(a);
                    }
                }
                active = staying;
                if active.is_empty() {
                    break;
                }
                let tasks: Vec<Task<'_>> = active
                    .iter()
                    .map(|a| {
                        let (dense, shards) = a.state.as_ref().expect("exported above");
                        (dense, shards.as_slice(), self.members[a.member].width)
                    })
                    .collect();
                let (rebuilt, new_layout) = match self.network.load_cohort::<B>(&tasks, self.device)
                {
                    Ok(loaded) => loaded,
                    Err(e) => return fail_all(done, &active, &e),
                };
                optimizer.keep(&layout, &new_layout, &keep, self.device);
                anchor = match self.anchor(&active, &new_layout) {
                    Ok(anchor) => anchor,
                    Err(e) => return fail_all(done, &active, &e),
                };
                correction = match self.correction(&active, &new_layout) {
                    Ok(correction) => correction,
                    Err(e) => return fail_all(done, &active, &e),
                };
                loss_sums = loss_sums.select(0, index::<B>(&keep, self.device));
                (net, layout) = (rebuilt, new_layout);
            }
            let (inputs, targets, cohort, real) = self.batch(&active, step);
            let logits = net.forward(inputs, &cohort);
            let real: Vec<usize> = real.iter().map(|r| r * per_row).collect();
            let losses = client_losses(logits, targets, &cohort.scaled(per_row), &real);
            let total = if active.len() == 1 {
                losses.clone()
            } else {
                losses.clone().sum()
            };
            let mut grads = GradientsParams::from_grads(total.backward(), &net);
            let decay = add_frobenius_decay(&net, &mut grads, self.recipe.weight_decay);
            if let Some(anchor) = &anchor {
                anchor.add_gradient(&net, &mut grads, self.recipe.proximal_mu);
            }
            if let Some(tau) = self.recipe.clip_lr {
                clip_lr(&net, &mut grads, tau);
            }
            net = optimizer.step(
                (self.recipe.learning_rate, &decay),
                net,
                grads,
                correction.as_ref(),
            );
            loss_sums = loss_sums + losses.detach();
        }
        done
    }

    /// FedProx's anchor of the active clients' model (`None` without a proximal term): their
    /// tasks as sent, keyed by the ids of the model `layout` describes.
    fn anchor(&self, active: &[Active], layout: &Layout) -> Result<Option<Anchor<B>>, NetError> {
        if self.recipe.proximal_mu == 0.0 {
            return Ok(None);
        }
        let sent: Vec<Task<'_>> = active
            .iter()
            .map(|a| {
                let m = &self.members[a.member];
                (m.dense, m.shards, m.width)
            })
            .collect();
        Anchor::of(self.network, &sent, layout, self.device).map(Some)
    }

    /// SCAFFOLD's correction `c − c_i` of the active clients (`None` when none has
    /// variates), keyed like [`Self::anchor`]; a client without variates in a cohort with
    /// some is corrected by zero.
    fn correction(
        &self,
        active: &[Active],
        layout: &Layout,
    ) -> Result<Option<Anchor<B>>, NetError> {
        let members = active.iter().map(|a| &self.members[a.member]);
        if members.clone().all(|m| m.variates.is_none()) {
            return Ok(None);
        }
        let corrections = members
            .map(|m| match m.variates {
                Some(v) => scaffold::correction(v, m.dense),
                None => Ok(m.dense.zeros_like()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tasks: Vec<Task<'_>> = active
            .iter()
            .zip(&corrections)
            .map(|(a, c)| {
                let m = &self.members[a.member];
                (c, m.shards, m.width)
            })
            .collect();
        Anchor::of(self.network, &tasks, layout, self.device).map(Some)
    }

    /// Member `member`'s result after `steps` local steps of mean loss `loss`: its trained
    /// tensors and, under SCAFFOLD, its `Δc_i`.
    fn trained(
        &self,
        member: usize,
        (dense, shards): (ModelState, Vec<LayerShard>),
        loss: f64,
        steps: usize,
    ) -> Result<Trained, TrainError> {
        let m = &self.members[member];
        let control = m
            .variates
            .map(|v| {
                let rate = self.recipe.learning_rate;
                scaffold::control_delta(m.dense, &dense, &v.server, steps, rate)
            })
            .transpose()
            .map_err(|e| TrainError::Model(e.into()))?;
        Ok(Trained {
            dense,
            shards,
            loss,
            control,
        })
    }

    /// The tensors of every active client, in the server's form.
    fn export(
        &self,
        net: &N::Module<B>,
        layout: &Layout,
        active: &[Active],
    ) -> Result<Vec<(ModelState, Vec<LayerShard>)>, NetError> {
        let tasks: Vec<Task<'_>> = active
            .iter()
            .map(|a| {
                let m = &self.members[a.member];
                match &a.state {
                    Some((dense, shards)) => (dense, shards.as_slice(), m.width),
                    None => (m.dense, m.shards, m.width),
                }
            })
            .collect();
        export(net, layout, &tasks)
    }

    /// Step `step`'s batch: every active client's rows one client after another, and how many
    /// of each client's rows are real. On a backend whose cohort kernels batch
    /// ([`Kernels::BATCHED_COHORTS`]), clients with fewer rows (a last, partial batch) are padded
    /// with zero rows to the most any client has, so every operation stays one batched launch;
    /// the padding is left out of the loss, so its gradient is zero and it changes nothing.
    ///
    /// [`Kernels::BATCHED_COHORTS`]: crate::models::kernels::Kernels::BATCHED_COHORTS
    fn batch(
        &self,
        active: &[Active],
        step: usize,
    ) -> (Tensor<B, 2>, Tensor<B, 1, Int>, Cohort, Vec<usize>) {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let examples = self.members[active[0].member].examples;
        let (width, per_row) = (examples.width(), examples.targets_per_row());
        let real: Vec<usize> = active.iter().map(|a| a.batches[step].len()).collect();
        let most = real.iter().copied().max().unwrap_or(0);
        let pad = B::BATCHED_COHORTS && active.len() > 1;
        for a in active {
            let samples = &a.batches[step];
            self.members[a.member]
                .examples
                .fill(samples, &mut x, &mut y);
            if pad {
                let missing = most - samples.len();
                x.resize(x.len() + missing * width, 0.0);
                y.resize(y.len() + missing * per_row, 0);
            }
        }
        let rows = if pad {
            vec![most; active.len()]
        } else {
            real.clone()
        };
        let total: usize = rows.iter().sum();
        let targets = y.len();
        (
            Tensor::from_data(TensorData::new(x, [total, width]), self.device),
            Tensor::from_data(TensorData::new(y, [targets]), self.device),
            Cohort::new(rows),
            real,
        )
    }
}

/// `done` with every client still training failed by `e` (the model could not be read back or
/// rebuilt).
fn fail_all(
    mut done: Vec<(usize, Result<Trained, TrainError>)>,
    active: &[Active],
    e: &NetError,
) -> Vec<(usize, Result<Trained, TrainError>)> {
    let cause = e.to_string();
    done.extend(
        active
            .iter()
            .map(|a| (a.member, Err(TrainError::Model(cause.clone().into())))),
    );
    done
}

/// Each client's mean cross-entropy over the first `real[c]` of its rows of `logits` (`C`
/// values; the rest is padding).
///
/// The log-probabilities are taken over all rows at once and only their per-row values split
/// by client: split first, a client's softmax ran over a view into the middle of the batch,
/// and its gradient then differed from the client's alone in the last bit.
fn client_losses<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    rows: &Cohort,
    real: &[usize],
) -> Tensor<B, 1> {
    if rows.clients() == 1 {
        return cross_entropy(logits, targets);
    }
    let total = rows.total();
    let picked = log_softmax(logits, 1).gather(1, targets.reshape([total, 1]));
    let mut start = 0;
    let losses = rows
        .rows()
        .iter()
        .zip(real)
        .map(|(&r, &used)| {
            let loss = picked.clone().narrow(0, start, used).mean().neg();
            start += r;
            loss
        })
        .collect();
    Tensor::cat(losses, 0)
}

/// `rows` as an index tensor.
fn index<B: Backend>(rows: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let rows: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let len = rows.len();
    Tensor::from_data(TensorData::new(rows, [len]), device)
}

#[cfg(test)]
mod tests;
