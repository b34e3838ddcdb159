//! DP-FedAvg (McMahan et al. 2018, Algorithm 1; docs/algorithms.md §6.1) as a wrapper over the
//! run's aggregator ([`Private`]): each accepted update becomes its change in the full weight
//! space, clipped to the clip norm; the clipped changes are summed, Gaussian noise of `z_Δ · C`
//! is added to every coordinate of the sum, and the model moves by the sum over the fixed
//! denominator of expected updates. The same for a synchronous round and an asynchronous buffer
//! (a stale update's staleness weight `s(τ) ≤ 1` scales its clipped change, which keeps it
//! inside the ball), and for a secure round, whose clients clipped their own changes and whose
//! sum the wrapper only noises.
//!
//! The wrapper is an [`Aggregator`] like any other, so the engine folds a private run through
//! the same seam as a plain one; it asks the aggregator it wraps how that one weighs an update
//! ([`Aggregator::sum_weight`]), and DP-FedAvg's bound on one client's influence holds for
//! equal weights only ([`Private::wraps`]).

use crate::privacy::{Clipping, PrivacyRecord, PrivacySettings};
use fedshard_strategies::StrategyError;
use fedshard_strategies::aggregation::{
    Aggregator, ChangeRound, Fit, FitRound, SumRound, SumWeight, WeightChange, check_sum,
};
use fedshard_strategies::privacy::{Epsilon, add_gaussian_noise, clip_factor};
use fedshard_strategies::rng::{Purpose, stream};
use std::sync::Mutex;

/// What one release needs besides the updates.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    pub settings: &'a PrivacySettings,
    /// This release's clip norm.
    pub clip_norm: f64,
    /// The run's seed and this release's number (round or model version), which key the noise
    /// streams: the same seed gives the same noise, hence the same model.
    pub seed: u64,
    pub release: u64,
    /// ε after this release (from the run's accountant).
    pub epsilon: Epsilon,
    /// Below this many updates nothing is released and the model stays.
    pub min_successful: usize,
}

impl Release<'_> {
    /// What a release that did not happen spent: nothing new (ε stays what the accountant
    /// says).
    fn unreleased(&self) -> PrivacyRecord {
        PrivacyRecord {
            epsilon: self.epsilon.epsilon,
            delta: self.settings.delta,
            clip_norm: self.clip_norm,
            next_clip_norm: self.clip_norm,
            clipped: 0,
            unclipped_fraction: None,
        }
    }
}

/// DP-FedAvg around the aggregator `A` for one release: built by the engine for each fold, read
/// back for what the release spent ([`Private::spent`]).
#[derive(Debug)]
pub struct Private<'a, A: ?Sized> {
    inner: &'a A,
    release: Release<'a>,
    spent: Mutex<Option<PrivacyRecord>>,
}

impl<'a, A: Aggregator + ?Sized> Private<'a, A> {
    /// Whether DP-FedAvg can wrap `inner`, or why not: the sensitivity of the release is one
    /// clip norm only when every clipped change counts once over a fixed denominator, which is
    /// the equal weight ([`SumWeight::Uniform`]); data-dependent weights would need their own
    /// bound.
    pub fn wraps(inner: &A) -> Result<(), &'static str> {
        match inner.sum_weight() {
            Ok(SumWeight::Uniform) => Ok(()),
            _ => Err(
                "DP-FedAvg weighs every clipped update equally over the expected number of \
                 updates, so that one client's influence is bounded; this aggregator weighs \
                 them otherwise",
            ),
        }
    }

    pub fn new(inner: &'a A, release: Release<'a>) -> Self {
        Self {
            inner,
            release,
            spent: Mutex::new(None),
        }
    }

    /// What this release spent and clipped; when no fold released anything, nothing new.
    pub fn spent(&self) -> PrivacyRecord {
        let spent = *self.spent.lock().unwrap_or_else(|e| e.into_inner());
        spent.unwrap_or_else(|| self.release.unreleased())
    }

    /// Releases `sum` into `global` (one f64 vector per block, the blocks the model's tensors):
    /// the sum of `count` clipped weight-space changes of which `clipped` had to be scaled.
    /// Gaussian noise of `z_Δ · C` is added to every coordinate, adaptive clipping takes its
    /// next norm from the noised count of unclipped updates, and the model moves by the sum over
    /// `m̄`. The noise of the sum comes from the stream `(seed, release, 0, PrivacyNoise)`, that
    /// of adaptive clipping's count from `(seed, release, 1, PrivacyNoise)`. Below
    /// `min_successful` updates nothing is released. A non-finite result is left for the fold's
    /// frame to refuse; a finite one is projected into the settings' domain.
    fn release(
        &self,
        global: &mut [&mut [f32]],
        mut sum: Vec<Vec<f64>>,
        (count, clipped): (usize, usize),
    ) -> fedshard_strategies::Result<Fit> {
        let r = self.release;
        let settings = r.settings;
        if count < r.min_successful.max(1) {
            let why = format!(
                "{count} accepted updates, the minimum is {}",
                r.min_successful.max(1)
            );
            return Ok(Fit::NoUpdate(why));
        }
        let mut record = r.unreleased();
        record.clipped = clipped;
        let z = settings
            .update_noise_multiplier()
            .map_err(|e| StrategyError::invalid("privacy", e.to_string()))?;
        let std = z * r.clip_norm;
        let mut noise = stream(r.seed, r.release, 0, Purpose::PrivacyNoise);
        for s in sum.iter_mut() {
            add_gaussian_noise(s, std, &mut noise);
        }
        if let Clipping::Adaptive { rule, .. } = settings.clipping {
            let mut count_noise = stream(r.seed, r.release, 1, Purpose::PrivacyNoise);
            let unclipped = count - clipped;
            let (next, fraction) = rule.next(
                r.clip_norm,
                unclipped,
                settings.expected_updates,
                &mut count_noise,
            );
            record.next_clip_norm = next;
            record.unclipped_fraction = Some(fraction);
        }
        let denominator = settings.expected_updates;
        for (block, s) in global.iter_mut().zip(&sum) {
            for (w, d) in block.iter_mut().zip(s) {
                *w = (f64::from(*w) + d / denominator) as f32;
            }
        }
        let finite = global.iter().all(|b| b.iter().all(|w| w.is_finite()));
        if let (Some((low, high)), true) = (settings.domain, finite) {
            global
                .iter_mut()
                .flat_map(|b| b.iter_mut())
                .for_each(|w| *w = w.clamp(low, high));
        }
        *self.spent.lock().unwrap_or_else(|e| e.into_inner()) = Some(record);
        Ok(Fit::Updated)
    }
}

/// `change`'s weight-space change (one f64 vector per block of `lens` values) scaled into the
/// ball of radius `clip_norm`, then by `scale` clamped to `[0, 1]`; and whether it had to be
/// clipped. For a sharded layer the change is `Σ_i (u'_i v'_iᵀ − ū'_i v̄'_iᵀ)` over the terms it
/// held ([`super::weight_change`]), so the bound holds for what the update does to the model,
/// not for its factors.
pub fn clipped_change(
    change: &dyn WeightChange,
    lens: &[usize],
    clip_norm: f64,
    scale: f64,
) -> fedshard_strategies::Result<(Vec<Vec<f64>>, bool)> {
    let mut values: Vec<Vec<f64>> = lens.iter().map(|&n| vec![0.0; n]).collect();
    change.add_scaled(&mut values, 1.0)?;
    let norm = values.iter().flatten().map(|c| c * c).sum::<f64>().sqrt();
    let factor = clip_factor(norm, clip_norm);
    let scale = factor * scale.clamp(0.0, 1.0);
    if scale != 1.0 {
        values.iter_mut().flatten().for_each(|c| *c *= scale);
    }
    Ok((values, factor < 1.0))
}

impl<A: Aggregator + ?Sized> Aggregator for Private<'_, A> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// Never: a private round's updates come as changes ([`Aggregator::folds_blocks`]).
    fn aggregate_fit(
        &self,
        _global: &mut [&mut [f32]],
        _round: &FitRound,
    ) -> fedshard_strategies::Result<Fit> {
        Err(StrategyError::invalid(
            "private release",
            "DP-FedAvg clips each update's weight-space change; block values cannot be clipped",
        ))
    }

    fn folds_blocks(&self) -> bool {
        false
    }

    fn folds_changes(&self) -> bool {
        true
    }

    fn sum_weight(&self) -> Result<SumWeight, &'static str> {
        self.inner.sum_weight()
    }

    /// `W ← W + (Σ_c s_c clip(ΔW_c) + N(0, (z_Δ C)² I)) / m̄`, the clipped changes summed in
    /// results order.
    fn aggregate_changes(
        &self,
        global: &mut [&mut [f32]],
        round: &ChangeRound,
    ) -> fedshard_strategies::Result<Fit> {
        Self::wraps(self.inner).map_err(|why| StrategyError::invalid("aggregator", why))?;
        let lens: Vec<usize> = global.iter().map(|b| b.len()).collect();
        let mut sum: Vec<Vec<f64>> = lens.iter().map(|&n| vec![0.0; n]).collect();
        let mut clipped = 0;
        for (change, &scale) in round.changes.iter().zip(round.scales) {
            let (change, was_clipped) =
                clipped_change(*change, &lens, self.release.clip_norm, scale)?;
            clipped += usize::from(was_clipped);
            for (s, c) in sum.iter_mut().zip(change) {
                s.iter_mut().zip(c).for_each(|(s, c)| *s += c);
            }
        }
        self.release(global, sum, (round.changes.len(), clipped))
    }

    /// A secure round's sum of the clients' own clipped changes, released: noised, over `m̄`.
    /// Only a weight-space sum can be released (an unsharded model's blocks are its weights).
    fn aggregate_sum(
        &self,
        global: &mut [&mut [f32]],
        round: &SumRound,
    ) -> fedshard_strategies::Result<Fit> {
        Self::wraps(self.inner).map_err(|why| StrategyError::invalid("aggregator", why))?;
        if !round.weight_space {
            return Err(StrategyError::invalid(
                "secure sum",
                "a secure sum over factor columns is not a weight-space change",
            ));
        }
        check_sum(global, round)?;
        let mut sum: Vec<Vec<f64>> = global.iter().map(|b| vec![0.0; b.len()]).collect();
        for s in round.blocks {
            sum[s.block].copy_from_slice(s.sum);
        }
        let count = round.count;
        let unclipped = round.unclipped.unwrap_or(count).min(count);
        self.release(global, sum, (count, count - unclipped))
    }
}
