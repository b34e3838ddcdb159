//! Folding accepted updates into the global model, always through the [`Aggregator`] seam: a
//! round's updates share the round's model version and fold as block values ([`fold`]); a
//! buffer's were trained from several versions and fold as weight-space changes scaled by their
//! staleness ([`fold_buffered`]), as a round's do for an aggregator that must see each change
//! ([`fold_changes`]); a secure round's sum folds block by block too
//! ([`crate::secure::fold_sum`]).

use super::sliced::fold_sliced;
use super::{Accepted, ClientFailure, term_factors};
use crate::coordinator::Registry;
use crate::error::{Error, Result};
use crate::schedule::Staleness;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_protocol::width::{WidthGroup, coordinates};
use fedshard_strategies::StrategyError;
use fedshard_strategies::aggregation::{
    Aggregator, BlockUpdate, ChangeRound, Contribution, Failure, Fit, FitRound, RoundOutcome,
    WeightChange,
};
use fedshard_strategies::svd::{Factors, apply_term_changes};
use std::collections::BTreeMap;

/// What folding a round did to the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Folded {
    /// The global model is the aggregate.
    Updated,
    /// The model is unchanged; the text says why (too few updates, the policy declined).
    Unchanged(String),
    /// The aggregate overflowed f32 (finite updates can sum past its range); the model is
    /// unchanged.
    NonFinite,
}

/// Everything the aggregation policy is told about the round besides the updates.
#[derive(Debug, Clone, Copy)]
pub struct FoldContext<'a> {
    pub registry: &'a Registry,
    /// p_k of each participant (1 when every client takes part).
    pub probabilities: &'a BTreeMap<ClientId, f64>,
    pub failures: &'a BTreeMap<ClientId, ClientFailure>,
    /// Below this many accepted updates the model stays.
    pub min_successful: usize,
}

/// Folds the accepted updates into `global` through `aggregator`.
///
/// Under a width strategy (the plan has a [`WidthPlan`](fedshard_protocol::shard_plan::WidthPlan))
/// every value moves to the weighted mean of the clients whose slice kept it
/// (`round/sliced.rs`). Otherwise:
/// The model is laid out as blocks ([`fold_blocks`]): every dense tensor, then each singular
/// vector of each sharded layer's factors `U'` and `V'` (the round's SVD in `plan`). A client's
/// update covers the dense blocks and the vectors it held, so the policy's fold is the
/// per-singular-vector average of docs/algorithms.md §1.1 step 5 (vectors nobody held stay),
/// and the sharded layers' recomposition `W = Σ u'_i v'_iᵀ` is applied as the change of their
/// terms. Results go to the policy in client-id order with the registry's D_c as their sample
/// count, never a client's own claim.
pub fn fold(
    global: &mut ModelState,
    plan: Option<&ShardPlan>,
    accepted: &[Accepted],
    aggregator: &dyn Aggregator,
    ctx: FoldContext<'_>,
) -> Result<Folded> {
    if accepted.len() < ctx.min_successful.max(1) {
        return Ok(Folded::Unchanged(format!(
            "{} accepted updates, the minimum is {}",
            accepted.len(),
            ctx.min_successful.max(1)
        )));
    }
    let mut order: Vec<&Accepted> = accepted.iter().collect();
    order.sort_by_key(|a| a.client);
    let samples = |id: ClientId| registry_samples(ctx.registry, id);
    let results = order
        .iter()
        .map(|a| {
            Ok(Contribution {
                client: a.client,
                samples: samples(a.client)?,
                inclusion_probability: ctx.probabilities.get(&a.client).copied().unwrap_or(1.0),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let failures: Vec<Failure> = ctx
        .failures
        .iter()
        .map(|(id, f)| Failure {
            client: *id,
            reason: format!("{}: {}", f.kind.label(), f.reason),
        })
        .collect();
    let population_samples = ctx
        .registry
        .clients
        .values()
        .map(|c| c.samples as f64)
        .sum();

    if let Some(width) = plan.and_then(|p| p.width.as_ref()) {
        return fold_sliced(global, width, &order, |blocks, updates| {
            let round = FitRound {
                outcome: RoundOutcome {
                    results: &results,
                    failures: &failures,
                    population_samples,
                },
                updates,
            };
            declined(aggregator, aggregator.aggregate_fit(blocks, &round))
        });
    }
    let factors: &[(String, Factors<f32>)] = plan.map_or(&[], |p| p.factors.as_slice());
    let dense_index: BTreeMap<&str, usize> = global
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let starts = layer_starts(global, plan);
    let updates = order
        .iter()
        .map(|a| blocks_of(a, &dense_index, factors, &starts))
        .collect::<Result<Vec<_>>>()?;
    let round = FitRound {
        outcome: RoundOutcome {
            results: &results,
            failures: &failures,
            population_samples,
        },
        updates: &updates,
    };
    fold_blocks(global, plan, |blocks, _, _| {
        declined(aggregator, aggregator.aggregate_fit(blocks, &round))
    })
}

/// What `aggregator` answered, as a fold takes it: why it declined to move the blocks, or
/// `None` when it moved them; its error, named.
pub(crate) fn declined(
    aggregator: &dyn Aggregator,
    fit: fedshard_strategies::Result<Fit>,
) -> Result<Option<String>> {
    let fit = fit.map_err(|source| Error::Aggregator {
        name: aggregator.name(),
        source,
    })?;
    Ok(match fit {
        Fit::NoUpdate(why) => Some(why),
        Fit::Updated => None,
    })
}

/// Where each sharded layer's blocks start: after the tensors, layer by layer, `U'` terms then
/// `V'` terms.
fn layer_starts(global: &ModelState, plan: Option<&ShardPlan>) -> Vec<usize> {
    let mut start = global.tensors.len();
    plan.map_or(&[][..], |p| p.factors.as_slice())
        .iter()
        .map(|(_, f)| {
            let s = start;
            start += 2 * f.singular_values.len();
            s
        })
        .collect()
}

/// The model as blocks, moved by `fit`, then the sharded layers recomposed: the one frame of
/// every round's fold, in the clear ([`fold`]) or from a secure sum
/// ([`crate::secure::fold_sum`]).
///
/// Block `b <` tensors is tensor `b` of `global` (`fit` gets their names), then layer by layer
/// (from the offsets `fit` gets) each term's `u'` vector, then each term's `v'` vector, of the
/// round's SVD in `plan`. Sharded layers then move by the change of their terms,
/// `W ← W + Σ_i (u'_i v'_iᵀ − ū'_i v̄'_iᵀ)` ([`apply_term_changes`]). `fit` answers why it left
/// the model as it was, or `None` when it moved it. The blocks are a copy: `global` changes only
/// when `fit` moved them and every value is finite.
pub fn fold_blocks(
    global: &mut ModelState,
    plan: Option<&ShardPlan>,
    fit: impl FnOnce(&mut [&mut [f32]], &[String], &[usize]) -> Result<Option<String>>,
) -> Result<Folded> {
    let names: Vec<String> = global.tensors.iter().map(|t| t.name.clone()).collect();
    let starts = layer_starts(global, plan);
    let mut next = global.clone();
    let mut factors: Vec<_> = plan
        .map(|p| p.factors.iter().map(|(_, f)| f.clone()).collect())
        .unwrap_or_default();
    let mut blocks: Vec<&mut [f32]> = next
        .tensors
        .iter_mut()
        .map(|t| t.data.as_mut_slice())
        .collect();
    for f in factors.iter_mut() {
        let (rows, cols) = (f.rows, f.cols);
        blocks.extend(f.left.chunks_mut(rows));
        blocks.extend(f.right.chunks_mut(cols));
    }
    if let Some(why) = fit(&mut blocks, &names, &starts)? {
        return Ok(Folded::Unchanged(why));
    }
    if let Some(plan) = plan {
        for ((name, sent), f) in plan.factors.iter().zip(&factors) {
            if let Some(tensor) = next.get_mut(name) {
                apply_term_changes(&mut tensor.data, sent, f);
            }
        }
    }
    if !next.is_finite() {
        return Ok(Folded::NonFinite);
    }
    *global = next;
    Ok(Folded::Updated)
}

/// The blocks one accepted update trained: its dense tensors by name, and for each sharded layer
/// the U' and V' vectors of the terms it held.
fn blocks_of<'a>(
    a: &'a Accepted,
    dense_index: &BTreeMap<&str, usize>,
    factors: &[(String, Factors<f32>)],
    layer_start: &[usize],
) -> Result<Vec<BlockUpdate<'a>>> {
    let mut blocks = Vec::new();
    for t in &a.update.dense.tensors {
        let b = dense_index
            .get(t.name.as_str())
            .ok_or_else(|| update_error(a.client, format!("unknown tensor `{}`", t.name)))?;
        blocks.push((*b, t.data.as_slice()));
    }
    if a.update.shards.len() != factors.len() {
        return Err(update_error(
            a.client,
            format!(
                "{} sharded layers in the update, {} in the plan",
                a.update.shards.len(),
                factors.len()
            ),
        ));
    }
    for ((shard, (_, f)), &start) in a.update.shards.iter().zip(factors).zip(layer_start) {
        let terms = f.singular_values.len();
        for (j, &term) in shard.indices.iter().enumerate() {
            let left = shard.left.get(j * f.rows..(j + 1) * f.rows);
            let right = shard.right.get(j * f.cols..(j + 1) * f.cols);
            let (Some(left), Some(right)) = (left, right) else {
                return Err(update_error(
                    a.client,
                    format!("short factors of `{}`", shard.name),
                ));
            };
            blocks.push((start + term, left));
            blocks.push((start + terms + term, right));
        }
    }
    Ok(blocks)
}

/// D_c of `client`, from the registry (never the client's own claim).
fn registry_samples(registry: &Registry, client: ClientId) -> Result<f64> {
    registry
        .clients
        .get(&client)
        .map(|c| c.samples as f64)
        .ok_or(Error::UnknownClient(client))
}

fn update_error(client: ClientId, reason: String) -> Error {
    Error::Update { client, reason }
}

/// An accepted update waiting in an asynchronous buffer.
#[derive(Debug, Clone)]
pub struct Buffered {
    pub accepted: Accepted,
    /// The task it answers, whose values it is measured against.
    pub task: TrainTask,
    /// The model version its client trained from.
    pub version: u64,
}

/// Adds `scale` × the weight-space change `update` asks for against `task` to `change` (one f64
/// vector per tensor of `global`, in its order): `values − sent` for a dense tensor (under a
/// width strategy, at the coordinates the task's slice of `groups` kept, zero elsewhere), and for
/// a sharded layer `Σ_{i∈I} (u'_i v'_iᵀ − u_i v_iᵀ)` over the terms it held, on the task's basis.
///
/// That is exactly how a round moves a sharded layer ([`fold`] applies
/// `W ← W + Σ_i (u'_i v'_iᵀ − ū'_i v̄'_iᵀ)`), so the sharding paper's recomposition needs no
/// basis once the change is formed: re-projecting it onto a newer version's singular vectors
/// would only drop the part outside the terms kept, and averaging singular vectors of different
/// versions term by term has no meaning (term i of two SVDs are different vectors).
pub fn weight_change(
    change: &mut [Vec<f64>],
    global: &ModelState,
    update: &Accepted,
    (task, groups): (&TrainTask, &[WidthGroup]),
    scale: f64,
) -> Result<()> {
    let index = |name: &str| {
        global
            .tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| update_error(update.client, format!("unknown tensor `{name}`")))
    };
    for t in &update.update.dense.tensors {
        let i = index(&t.name)?;
        let sent = task
            .dense
            .get(&t.name)
            .ok_or_else(|| update_error(update.client, format!("`{}` was not sent", t.name)))?;
        // A width slice's values sit at its coordinates of the global tensor (§8.3).
        let coords = match &task.width {
            Some(slice) => {
                coordinates(&global.tensors[i], groups, &slice.kept).map_err(Error::Plan)?
            }
            None => None,
        };
        let held = coords.as_ref().map_or(change[i].len(), Vec::len);
        if t.data.len() != held || sent.data.len() != held {
            return Err(update_error(
                update.client,
                format!("{} values of `{}`, {held} expected", t.data.len(), t.name),
            ));
        }
        let moved = t.data.iter().zip(&sent.data);
        match coords {
            Some(coords) => {
                for (&k, (&new, &old)) in coords.iter().zip(moved) {
                    change[i][k] += scale * (f64::from(new) - f64::from(old));
                }
            }
            None => {
                for (c, (&new, &old)) in change[i].iter_mut().zip(moved) {
                    *c += scale * (f64::from(new) - f64::from(old));
                }
            }
        }
    }
    for (got, sent) in update.update.shards.iter().zip(&task.shards) {
        let i = index(&got.name)?;
        let (rows, cols) = global.tensors[i].matrix_shape();
        for j in 0..got.indices.len() {
            let Some([ul, ur, sl, sr]) = term_factors(got, sent, j, (rows, cols)) else {
                return Err(update_error(
                    update.client,
                    format!("short factors of `{}`", got.name),
                ));
            };
            for r in 0..rows {
                let (un, us) = (scale * f64::from(ul[r]), scale * f64::from(sl[r]));
                let row = &mut change[i][r * cols..(r + 1) * cols];
                for ((c, &vn), &vs) in row.iter_mut().zip(ur).zip(sr) {
                    *c += un * f64::from(vn) - us * f64::from(vs);
                }
            }
        }
    }
    Ok(())
}

/// An accepted update as an aggregator folds its change: its [`weight_change`] against
/// `global`, measured on the task it answers.
pub struct Change<'a> {
    pub global: &'a ModelState,
    pub accepted: &'a Accepted,
    pub task: &'a TrainTask,
    /// The model's widths, under a width strategy (else empty).
    pub groups: &'a [WidthGroup],
}

impl WeightChange for Change<'_> {
    fn add_scaled(&self, change: &mut [Vec<f64>], scale: f64) -> fedshard_strategies::Result<()> {
        let task = (self.task, self.groups);
        weight_change(change, self.global, self.accepted, task, scale)
            .map_err(|e| StrategyError::invalid("update", e.to_string()))
    }
}

/// Applies the buffer to `global`, which is version `current`, through `aggregator`
/// ([`fold_changes`]): FedBuff's `W ← W + Σ_i w_i s(current − version_i) ΔW_i` with the
/// aggregator's weights `w_i` (for FedAvg `D_i / Σ_j D_j`, D from the registry) over the buffer
/// in arrival order. Returns what happened and the staleness of each update, in buffer order.
pub fn fold_buffered(
    global: &mut ModelState,
    buffer: &[Buffered],
    (aggregator, groups): (&dyn Aggregator, &[WidthGroup]),
    registry: &Registry,
    (staleness, current): (Staleness, u64),
) -> Result<(Folded, Vec<u64>)> {
    let taus: Vec<u64> = buffer
        .iter()
        .map(|b| current.saturating_sub(b.version))
        .collect();
    let updates: Vec<(&Accepted, &TrainTask, f64)> = buffer
        .iter()
        .zip(&taus)
        .map(|(b, &tau)| (&b.accepted, &b.task, staleness.weight(tau)))
        .collect();
    let folded = fold_changes(global, &updates, (aggregator, groups), registry)?;
    Ok((folded, taus))
}

/// Folds `updates`, each an accepted update with the task it answers and its factor `s_c`, into
/// `global` as weight-space changes through `aggregator` ([`Aggregator::aggregate_changes`]),
/// every tensor one block: `W ← W + Σ_c w_c s_c ΔW_c`, in the order given. A buffer's updates
/// fold this way ([`fold_buffered`]), and so do a round's when the aggregator must see each
/// change ([`Aggregator::folds_blocks`] says no: differential privacy clips it). `global` changes
/// only when every value of the result is finite.
pub fn fold_changes(
    global: &mut ModelState,
    updates: &[(&Accepted, &TrainTask, f64)],
    (aggregator, groups): (&dyn Aggregator, &[WidthGroup]),
    registry: &Registry,
) -> Result<Folded> {
    let results = updates
        .iter()
        .map(|(accepted, _, _)| {
            Ok(Contribution {
                client: accepted.client,
                samples: registry_samples(registry, accepted.client)?,
                inclusion_probability: 1.0,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let scales: Vec<f64> = updates.iter().map(|(_, _, s)| *s).collect();
    let changes: Vec<Change<'_>> = updates
        .iter()
        .map(|&(accepted, task, _)| Change {
            global,
            accepted,
            task,
            groups,
        })
        .collect();
    let changes: Vec<&dyn WeightChange> = changes.iter().map(|c| c as &dyn WeightChange).collect();
    let round = ChangeRound {
        outcome: RoundOutcome {
            results: &results,
            failures: &[],
            population_samples: registry.clients.values().map(|c| c.samples as f64).sum(),
        },
        scales: &scales,
        changes: &changes,
    };
    let mut next = global.clone();
    let mut blocks: Vec<&mut [f32]> = next
        .tensors
        .iter_mut()
        .map(|t| t.data.as_mut_slice())
        .collect();
    let fit = aggregator.aggregate_changes(&mut blocks, &round);
    if let Some(why) = declined(aggregator, fit)? {
        return Ok(Folded::Unchanged(why));
    }
    if !next.is_finite() {
        return Ok(Folded::NonFinite);
    }
    *global = next;
    Ok(Folded::Updated)
}
