//! The private fold (DP-FedAvg, McMahan et al. 2018, Algorithm 1; docs/algorithms.md §6.1):
//! each accepted update becomes its change in the full weight space, clipped to the clip norm;
//! the clipped changes are summed, Gaussian noise of `z_Δ · C` is added to every coordinate of
//! the sum, and the model moves by the sum over the fixed denominator of expected updates.
//! The same for a synchronous round and an asynchronous buffer: a stale update's staleness
//! weight `s(τ) ≤ 1` scales its clipped change, which keeps it inside the ball.

use super::{Accepted, Folded, weight_change};
use crate::error::Result;
use crate::privacy::{Clipping, PrivacyRecord, PrivacySettings};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::TrainTask;
use fedshard_strategies::privacy::{Epsilon, add_gaussian_noise, clip_factor};
use fedshard_strategies::rng::{Purpose, stream};

/// One accepted update as the private fold takes it.
#[derive(Debug, Clone, Copy)]
pub struct PrivateUpdate<'a> {
    pub accepted: &'a Accepted,
    /// The task it answers: the change is measured against what was sent.
    pub task: &'a TrainTask,
    /// FedBuff's staleness weight `s(τ)` in async mode, 1 in a round.
    pub weight: f64,
}

/// What the private fold needs besides the updates.
#[derive(Debug, Clone, Copy)]
pub struct Private<'a> {
    pub settings: &'a PrivacySettings,
    /// This release's clip norm.
    pub clip_norm: f64,
    /// The run's seed and this release's number (round or model version), which key the noise
    /// streams: the same seed gives the same noise, hence the same model.
    pub seed: u64,
    pub release: u64,
    /// ε after this release (from the run's accountant).
    pub epsilon: Epsilon,
    /// Below this many accepted updates nothing is released and the model stays.
    pub min_successful: usize,
}

/// `update`'s weight-space change against `global` scaled into the ball of radius
/// `clip_norm` (one f64 vector per tensor of `global`), and whether it had to be scaled: for a
/// sharded layer the change is `Σ_i (u'_i v'_iᵀ − ū'_i v̄'_iᵀ)` over the terms it held
/// ([`weight_change`]), so the bound holds for what the update does to the model, not for its
/// factors.
pub fn clipped_change(
    global: &ModelState,
    update: &PrivateUpdate<'_>,
    clip_norm: f64,
) -> Result<(Vec<Vec<f64>>, bool)> {
    let mut change: Vec<Vec<f64>> = global
        .tensors
        .iter()
        .map(|t| vec![0.0; t.data.len()])
        .collect();
    weight_change(&mut change, global, update.accepted, update.task, 1.0)?;
    let norm = change.iter().flatten().map(|c| c * c).sum::<f64>().sqrt();
    let factor = clip_factor(norm, clip_norm);
    let scale = factor * update.weight.clamp(0.0, 1.0);
    if scale != 1.0 {
        change.iter_mut().flatten().for_each(|c| *c *= scale);
    }
    Ok((change, factor < 1.0))
}

/// Folds `updates` into `global` privately: `W ← W + (Σ_k clip(ΔW_k) + N(0, (z_Δ C)² I)) / m̄`
/// with `m̄` the expected number of updates ([`release`]).
pub fn fold_private(
    global: &mut ModelState,
    updates: &[PrivateUpdate<'_>],
    private: Private<'_>,
) -> Result<(Folded, PrivacyRecord)> {
    let mut sum: Vec<Vec<f64>> = global
        .tensors
        .iter()
        .map(|t| vec![0.0; t.data.len()])
        .collect();
    let mut clipped = 0;
    for update in updates {
        let (change, was_clipped) = clipped_change(global, update, private.clip_norm)?;
        clipped += usize::from(was_clipped);
        for (s, c) in sum.iter_mut().zip(change) {
            s.iter_mut().zip(c).for_each(|(s, c)| *s += c);
        }
    }
    release(global, sum, (updates.len(), clipped), private)
}

/// What a release that did not happen spent: nothing new (ε stays what the accountant says).
pub fn unreleased(private: Private<'_>) -> PrivacyRecord {
    PrivacyRecord {
        epsilon: private.epsilon.epsilon,
        delta: private.settings.delta,
        clip_norm: private.clip_norm,
        next_clip_norm: private.clip_norm,
        clipped: 0,
        unclipped_fraction: None,
    }
}

/// Releases `sum`, the sum of `count` clipped weight-space changes of which `clipped` had to be
/// scaled (one f64 vector per tensor of `global`): Gaussian noise of `z_Δ · C` is added to
/// every coordinate, adaptive clipping takes its next norm from the noised count of unclipped
/// updates, and the model moves by the sum over `m̄`. The noise of the sum comes from the stream
/// `(seed, release, 0, PrivacyNoise)`, that of adaptive clipping's count from
/// `(seed, release, 1, PrivacyNoise)`. The sum is made by the server ([`fold_private`]) or by a
/// secure aggregation of the clients' own clipped changes; below `min_successful` updates
/// nothing is released. `global` changes only when every value is finite.
pub fn release(
    global: &mut ModelState,
    mut sum: Vec<Vec<f64>>,
    (count, clipped): (usize, usize),
    private: Private<'_>,
) -> Result<(Folded, PrivacyRecord)> {
    let settings = private.settings;
    let clip_norm = private.clip_norm;
    let mut record = unreleased(private);
    if count < private.min_successful.max(1) {
        let why = format!(
            "{count} accepted updates, the minimum is {}",
            private.min_successful.max(1)
        );
        return Ok((Folded::Unchanged(why), record));
    }
    record.clipped = clipped;
    let std = settings.update_noise_multiplier()? * clip_norm;
    let mut noise = stream(private.seed, private.release, 0, Purpose::PrivacyNoise);
    for s in sum.iter_mut() {
        add_gaussian_noise(s, std, &mut noise);
    }
    if let Clipping::Adaptive { rule, .. } = settings.clipping {
        let mut count_noise = stream(private.seed, private.release, 1, Purpose::PrivacyNoise);
        let unclipped = count - clipped;
        let (next, fraction) = rule.next(
            clip_norm,
            unclipped,
            settings.expected_updates,
            &mut count_noise,
        );
        record.next_clip_norm = next;
        record.unclipped_fraction = Some(fraction);
    }
    let mut next = global.clone();
    let denominator = settings.expected_updates;
    for (t, s) in next.tensors.iter_mut().zip(&sum) {
        for (w, d) in t.data.iter_mut().zip(s) {
            *w = (f64::from(*w) + d / denominator) as f32;
        }
    }
    if !next.is_finite() {
        return Ok((Folded::NonFinite, record));
    }
    if let Some((low, high)) = settings.domain {
        next.tensors
            .iter_mut()
            .flat_map(|t| t.data.iter_mut())
            .for_each(|w| *w = w.clamp(low, high));
    }
    *global = next;
    Ok((Folded::Updated, record))
}
