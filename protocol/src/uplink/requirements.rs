//! What each compressor needs of the rest of a run, and the ranges of the `[compression]`
//! settings: the rules live here, next to [`Compressor`] and [`CompressionConfig`], and a run
//! configuration only checks its other sections against them.

use super::{BlockMode, BlockScope, CompressionConfig, Compressor, Host};

/// A `[compression]` setting outside its domain, or one the compressor cannot honour.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("field `{field}`: expected {expected}, found {found}")]
pub struct Error {
    /// The setting, as the run configuration names it (`compression.d_target`).
    pub field: &'static str,
    /// The accepted form.
    pub expected: String,
    pub found: String,
}

/// The model values a compressor can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// Any model's (the identity encoding).
    Any,
    /// FedPM's mask probabilities only (the FedPM hosts, whose symbols are mask bits).
    MaskProbabilities,
    /// Weights, never mask probabilities (every other host).
    Weights,
}

/// What a compressor needs of the run beyond its own settings; each `Some` holds the reason,
/// for the error that names the conflicting field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirements {
    pub values: Values,
    /// Synchronous rounds, not buffered asynchronous aggregation.
    pub rounds: Option<&'static str>,
    /// The equal-weight (`uniform`) aggregator.
    pub equal_weights: Option<&'static str>,
    /// A classifier trained by gradient steps (softmax or neural on a burn backend).
    pub gradient_classifier: Option<&'static str>,
    /// A labelled dataset, whose loss is a sum over examples.
    pub labelled_data: Option<&'static str>,
    /// Every client holding the whole model: keep ratio 1 and no sharded layer.
    pub whole_model: Option<&'static str>,
}

impl Compressor {
    /// What this compressor needs of the run: SGLD (docs/algorithms.md §4.9) needs rounds, the
    /// `uniform` aggregator (the equal-weight mean of the decoded `θ − η κ C y_c` is the
    /// Langevin step; any other weighting moves the model by the wrong drift and noise), every
    /// client holding the whole model (the step is one gradient of the full potential) and a
    /// classifier on labelled data; FedPM sends mask probabilities, and nothing else does.
    pub fn requirements(self) -> Requirements {
        let values = match self.host() {
            None => Values::Any,
            Some(Host::Fedpm) => Values::MaskProbabilities,
            Some(_) => Values::Weights,
        };
        let sgld = self.host() == Some(Host::Sgld);
        let when = |reason| sgld.then_some(reason);
        Requirements {
            values,
            rounds: when(
                "the Langevin step is the equal-weight mean of one round's fresh gradients, \
                 θ − η κ Σ y_c, its noise scaled for those C clients; a staleness-weighted \
                 buffer of stale ones would move the chain by another drift and noise",
            ),
            equal_weights: when(
                "the equal-weight mean of the decoded values is the Langevin step θ − η κ Σ y_c",
            ),
            gradient_classifier: when("its clients take a gradient step of a burn classifier"),
            labelled_data: when("its potential sums one loss per example"),
            whole_model: when("the step needs the whole model's gradient"),
        }
    }

    /// Whether the norm of this compressor's decoded update depends on what the client
    /// trained, so that `max_update_norm` can tell updates apart. A SignSGD update moves every
    /// value it carries by `±server_lr`: its norm is `server_lr · √(values sent)` whatever the
    /// client trained, so a bound would reject every update or none. Only with KLMS and
    /// `rescale_drift`, where the server divides by the client's drift ratio, does it vary.
    pub fn update_norm_varies(self, compression: Option<&CompressionConfig>) -> bool {
        self.host() != Some(Host::Signsgd)
            || (self.klms() && compression.is_some_and(|c| c.rescale_drift))
    }
}

impl CompressionConfig {
    /// Checks every setting against its domain and against `compressor`: a table is refused
    /// with the identity encoding (it would configure nothing), and `rescale_drift` with FedPM
    /// (its decoded values are mask probabilities, which a rescaled drift would push out of
    /// [0, 1]).
    pub fn validate(&self, compressor: Compressor) -> Result<(), Error> {
        let check = |field, ok: bool, expected: &str, found: String| {
            if ok {
                Ok(())
            } else {
                Err(Error {
                    field,
                    expected: expected.to_string(),
                    found,
                })
            }
        };
        if compressor == Compressor::Identity {
            return Err(Error {
                field: "compression",
                expected: "no [compression] table with `federation.compressor = \"identity\"` \
                           (set a compressor such as \"fedpm-klms\")"
                    .to_string(),
                found: "a [compression] table".to_string(),
            });
        }
        check(
            "compression.d_target",
            (1..=16).contains(&self.d_target),
            "whole bits per block in 1..=16 (K = 2^d_target candidates)",
            self.d_target.to_string(),
        )?;
        check(
            "compression.max_block_size",
            (1..=1 << 16).contains(&self.max_block_size),
            "a block size in 1..=65536",
            self.max_block_size.to_string(),
        )?;
        check(
            "compression.block_size",
            self.block_size >= 1,
            "at least 1",
            self.block_size.to_string(),
        )?;
        if let Some(k) = self.candidates {
            check(
                "compression.candidates",
                (1..=1 << 16).contains(&k),
                "a number of candidates K in 1..=65536",
                k.to_string(),
            )?;
        }
        check(
            "compression.server_lr",
            self.server_lr > 0.0 && self.server_lr.is_finite(),
            "a positive number",
            self.server_lr.to_string(),
        )?;
        check(
            "compression.temperature_group",
            self.temperature_group >= 1,
            "at least 1",
            self.temperature_group.to_string(),
        )?;
        check(
            "compression.temperature_scale",
            self.temperature_scale > 0.0 && self.temperature_scale.is_finite(),
            "a positive number (SignSGD's M = temperature_scale × rms(v))",
            self.temperature_scale.to_string(),
        )?;
        check(
            "compression.margin_bits",
            self.d_target + self.margin_bits <= 20,
            "d_target + margin_bits ≤ 20 (K = 2^(d_target + margin_bits) candidates)",
            self.margin_bits.to_string(),
        )?;
        check(
            "compression.block_scope",
            self.block_scope == BlockScope::Global || self.blocks == BlockMode::Adaptive,
            "\"client\" only with `blocks = \"adaptive\"` (fixed blocks are the same for every \
             client)",
            "\"client\" with `blocks = \"fixed\"`".into(),
        )?;
        check(
            "compression.recut_below_drift",
            (0.0..=1.0).contains(&self.recut_below_drift),
            "a drift ratio in [0, 1] (0: re-cut only when the mean block KL leaves its band)",
            self.recut_below_drift.to_string(),
        )?;
        check(
            "compression.prior_weight",
            self.prior_weight > 0.0 && self.prior_weight.is_finite(),
            "a positive number of pseudo-counts β",
            self.prior_weight.to_string(),
        )?;
        // Without KLMS nothing shrinks the drift: the flag is ignored there (a compare grid
        // shares one table between a host and its KLMS version).
        check(
            "compression.rescale_drift",
            !self.rescale_drift || compressor.host() != Some(Host::Fedpm),
            "`true` only with qsgd-klms, signsgd-klms or sgld-klms (FedPM's decoded values are \
             mask probabilities, which a rescaled drift would push out of [0, 1])",
            format!("`true` with `{compressor}`"),
        )
    }
}
