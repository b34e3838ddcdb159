//! Compressed uplinks (docs/algorithms.md §4): the compressor policies a federation selects by name
//! (`[federation] compressor`), what a task tells the client about its uplink, and the coder
//! that turns a client's training output into bytes and back.
//!
//! Every compressor sees the client's update as one flat message vector: the dense tensors in
//! task order, then per sharded layer the rows of `U'` then of `V'` it holds ([`flatten`]). A
//! host method turns the vector it sent (`sent`) and the vector the client trained (`out`) into
//! a client-only distribution `q` and a global distribution `p` that the server can rebuild from
//! the task alone:
//!
//! | host | symbols | `q_j` | `p_j` | server value |
//! |---|---|---|---|---|
//! | QSGD (s = 1, §4.7) | `{−1, 0, +1}` | `|v_j|/‖v‖` on `sign v_j` | last round's counts smoothed towards their tensor's frequency ([`qsgd`]) | `sent + η_S ‖v‖ y` |
//! | SignSGD (§4.8) | `±1` | `σ(v_j / M)` ([`signsgd`]) | `½` | `sent + η_S y` |
//! | FedPM (§4.6) | mask bit | `θ_local` | `θ_global` | `0.99` or `0.01` |
//! | SGLD (§4.9) | real `y` | `N(H_c, σ²)` | `N(0, σ²)` | `sent − η κ C y` |
//!
//! with `v = out − sent`. Without KLMS the client sends a sample of `q` symbol by symbol (an
//! f32 per value for SGLD); with KLMS it sends one candidate index per block (`⌈log2 K⌉` bits,
//! or an exp-Golomb code with `selection = "ordered"`; and, with
//! `rescale_drift`, the share `ρ` of its drift the candidates carry, which the server divides
//! the decoded drift by: `μ_p + (y − μ_p)/ρ`)
//! ([`fedshard_strategies::compression`]). The server value is a model value like any other, so
//! every aggregator folds it unchanged: FedAvg of FedPM's decoded masks is BayesAgg with
//! `λ₀ = 1` reset every round.
//!
//! SGLD ([`LangevinScaling`]): the client's output is `θ − H_c`, one unit step on its share of
//! the potential (`fedshard_training::train::sgld`), so `H_c = sent − out`; the task carries the
//! step `η` and the round's cohort (`N` clients, `C` asked), which fix `σ² = 2/(η κ² C)`,
//! `κ = N/C`. The server value `sent − η κ C y_c` is meant for the `uniform` aggregator (the
//! config refuses any other): the mean over the `C` participants is the step
//! `θ − η κ Σ_c y_c`, whose noise is exactly `2η` per coordinate, so nothing is added.
//!
//! When only `C' < C` updates arrive (failures, rejections, a deadline), the mean is
//! `θ − η (N/C') Σ_{c ∈ C'} y_c`: the drift stays an unbiased estimate of `η Σ_n H_n` (as long
//! as who fails does not depend on the data) and the noise grows to `2η C/C'`
//! ([`LangevinScaling::aggregate_noise_variance`]); `σ` was fixed when the tasks went out, so
//! the round is not re-scaled after the fact. Below `min_successful` updates the model stays.
//!
//! With KLMS the choice among K candidates of `p` transmits only part of `H_c` (to first order
//! `(1 − 1/K) H_c` for a block of small KL, less near `D_target`: the bias of §4.11's Gaussian
//! toy) while the noise stays `2η`, so the chain moves as if its drift had a smaller step.
//!
//! Each host method is one codec ([`codec::HostCodec`]: [`fedpm::Fedpm`], [`qsgd::Qsgd`],
//! [`signsgd::Signsgd`], [`sgld::Sgld`]), the identity encoding another
//! ([`identity::IdentityCodec`]), and KLMS one wrapper over any host ([`klms::Klms`]);
//! [`Compressor::codec`] maps the config names to them.
//!
//! [`LangevinScaling`]: fedshard_strategies::compression::LangevinScaling
//! [`LangevinScaling::aggregate_noise_variance`]: fedshard_strategies::compression::LangevinScaling::aggregate_noise_variance

pub mod codec;
pub mod compressor;
pub mod fedpm;
pub mod identity;
pub mod klms;
pub mod qsgd;
pub mod requirements;
pub mod settings;
pub mod sgld;
pub mod signsgd;
pub mod state;
pub mod wire;

pub use compressor::{Compressor, Host, UnknownCompressor};
pub use fedpm::{MASK_HIGH, MASK_LOW};
pub use settings::{
    BlockMode, BlockScope, Cohort, CompressionConfig, DRIFT_RATIO_RANGE, KlmsTask, TaskBlocks,
    Temperature, Uplink, UplinkSide, index_code_order,
};

use crate::model::ModelState;
use crate::task::{LayerShard, TrainTask};

/// The message vector of a task or an output: dense tensors, then per shard its left then right
/// factor rows.
pub fn flatten(dense: &ModelState, shards: &[LayerShard]) -> Vec<f32> {
    let mut out = Vec::new();
    for t in &dense.tensors {
        out.extend_from_slice(&t.data);
    }
    for s in shards {
        out.extend_from_slice(&s.left);
        out.extend_from_slice(&s.right);
    }
    out
}

/// The inverse of [`flatten`] on the task's layout.
pub fn unflatten(task: &TrainTask, values: &[f32]) -> (ModelState, Vec<LayerShard>) {
    let mut dense = task.dense.clone();
    let mut at = 0;
    for t in &mut dense.tensors {
        let n = t.data.len();
        t.data.copy_from_slice(&values[at..at + n]);
        at += n;
    }
    let mut shards = task.shards.clone();
    for s in &mut shards {
        for part in [&mut s.left, &mut s.right] {
            let n = part.len();
            part.copy_from_slice(&values[at..at + n]);
            at += n;
        }
    }
    (dense, shards)
}

#[cfg(test)]
mod tests;
