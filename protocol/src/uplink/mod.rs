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

pub mod qsgd;
pub mod requirements;
pub mod signsgd;
pub mod state;
pub mod wire;

use crate::model::ModelState;
use crate::task::{LayerShard, TrainOutput, TrainTask};
use fedshard_strategies::compression::{
    Bernoulli, Categorical, FairSignEncoder, Gaussian, KlmsEncoder, LangevinScaling, Partition,
    ProductDistribution, Selection, SharedSeed, boundary_bits, decode as klms_decode,
    decode_fair_signs, drift_ratio, index_bits, kl_bits_per_coordinate,
};
use fedshard_strategies::rng::{ChaCha20Rng, uniform};
use serde::{Deserialize, Serialize};
use wire::{
    BitReader, BitWriter, read_elias_symbols, read_exp_golomb, read_trits, write_elias_symbols,
    write_exp_golomb, write_trits,
};

/// An uplink compressor, selected by name in `[federation] compressor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Compressor {
    /// bincode of the updated tensors, f32: 32 bits per value plus framing.
    #[default]
    Identity,
    /// QSGD with one level: a 32-bit norm and a symbol in `{−1, 0, +1}` per value (1.6 bits).
    Qsgd,
    /// The same QSGD symbols Elias-coded as in the QSGD paper: a 32-bit norm, the number of
    /// non-zero symbols, then per non-zero symbol its gap (Elias gamma) and its sign.
    QsgdElias,
    /// QSGD's symbols coded with KLMS against last round's symbol frequencies.
    QsgdKlms,
    /// Stochastic SignSGD: one sign bit per value.
    Signsgd,
    /// SignSGD's signs coded with KLMS against a fair coin.
    SignsgdKlms,
    /// FedPM: one mask bit per value (the model is mask probabilities).
    Fedpm,
    /// FedPM's mask coded with KLMS against the global mask probabilities.
    FedpmKlms,
    /// SGLD: the client's Gaussian sample `y_c ~ N(H_c, σ² I)` as f32 values (32 bits each).
    Sgld,
    /// SGLD's Gaussian sample coded with KLMS against `N(0, σ² I)`.
    SgldKlms,
}

/// The method a compressor transmits, with or without KLMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Qsgd,
    Signsgd,
    Fedpm,
    Sgld,
}

impl Compressor {
    pub const ALL: [Compressor; 10] = [
        Compressor::Identity,
        Compressor::Qsgd,
        Compressor::QsgdElias,
        Compressor::QsgdKlms,
        Compressor::Signsgd,
        Compressor::SignsgdKlms,
        Compressor::Fedpm,
        Compressor::FedpmKlms,
        Compressor::Sgld,
        Compressor::SgldKlms,
    ];

    /// The host method; `None` for the identity encoding.
    pub fn host(self) -> Option<Host> {
        match self {
            Compressor::Identity => None,
            Compressor::Qsgd | Compressor::QsgdElias | Compressor::QsgdKlms => Some(Host::Qsgd),
            Compressor::Signsgd | Compressor::SignsgdKlms => Some(Host::Signsgd),
            Compressor::Fedpm | Compressor::FedpmKlms => Some(Host::Fedpm),
            Compressor::Sgld | Compressor::SgldKlms => Some(Host::Sgld),
        }
    }

    /// Whether the host's symbols go through KLMS.
    pub fn klms(self) -> bool {
        matches!(
            self,
            Compressor::QsgdKlms
                | Compressor::SignsgdKlms
                | Compressor::FedpmKlms
                | Compressor::SgldKlms
        )
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Compressor::Identity => "identity",
            Compressor::Qsgd => "qsgd",
            Compressor::QsgdElias => "qsgd-elias",
            Compressor::QsgdKlms => "qsgd-klms",
            Compressor::Signsgd => "signsgd",
            Compressor::SignsgdKlms => "signsgd-klms",
            Compressor::Fedpm => "fedpm",
            Compressor::FedpmKlms => "fedpm-klms",
            Compressor::Sgld => "sgld",
            Compressor::SgldKlms => "sgld-klms",
        }
    }
}

/// A compressor name that is not one of [`Compressor::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCompressor(pub String);

impl std::fmt::Display for UnknownCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = Compressor::ALL.iter().map(|c| c.name()).collect();
        write!(
            f,
            "unknown compressor `{}`; expected one of {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownCompressor {}

impl std::str::FromStr for Compressor {
    type Err = UnknownCompressor;

    fn from_str(name: &str) -> Result<Self, UnknownCompressor> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| UnknownCompressor(name.to_string()))
    }
}

impl std::fmt::Display for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How KLMS cuts the message into blocks (`[compression] blocks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BlockMode {
    /// Blocks of about `d_target` bits of KL, `K = 2^d_target`, with the location protocol of
    /// §4.4 (the paper's default).
    #[default]
    Adaptive,
    /// Blocks of `block_size` values with `candidates` per block (§4.3).
    Fixed,
}

/// Whose KL the blocks of adaptive KLMS fit (`[compression] block_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BlockScope {
    /// One partition for every client of a message length, aggregated from the clients' uploads
    /// (§4.4, the paper's): the fewest location bits, but a client whose update is skewed
    /// against the others' finds a few blocks holding far more than `d_target` bits of KL, and
    /// those blocks carry most of its drift and the least of it.
    #[default]
    Global,
    /// Each client keeps the blocks it cut itself: the server remembers them per client and
    /// sends them back with its tasks, and a client re-cuts (uploading its new blocks) when its
    /// mean block KL leaves the band or, with `rescale_drift`, when its candidates carried less
    /// than `recut_below_drift` of its drift.
    Client,
}

/// `[compression]`: the settings of the compressors (every field has a default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressionConfig {
    #[serde(default)]
    pub blocks: BlockMode,
    /// Adaptive blocks: one partition for all clients, or one per client.
    #[serde(default)]
    pub block_scope: BlockScope,
    /// `block_scope = "client"` with `rescale_drift`: a client whose reported drift ratio falls
    /// below this re-cuts its blocks in its next task.
    #[serde(default = "default_recut_below_drift")]
    pub recut_below_drift: f64,
    /// Adaptive blocks: KL bits per block `D_target`; `K = 2^D_target`.
    #[serde(default = "default_d_target")]
    pub d_target: u32,
    /// Adaptive blocks: `MAX_BLOCK_SIZE`.
    #[serde(default = "default_max_block_size")]
    pub max_block_size: usize,
    /// Fixed blocks: values per block `S`.
    #[serde(default = "default_block_size")]
    pub block_size: usize,
    /// Fixed blocks: candidates per block `K`; unset, the reference warm-up schedule
    /// (8,8,8,8,8,7,6,5,4,3, then 2).
    #[serde(default)]
    pub candidates: Option<usize>,
    /// Server learning rate `η_S` of QSGD and SignSGD: the model moves by `η_S` times the mean
    /// decoded update. SGLD's step `η` (§4.9): `θ ← θ − η κ Σ_c y_c`.
    #[serde(default = "default_server_lr")]
    pub server_lr: f64,
    /// SignSGD: values per temperature group of `temperature = "group"`;
    /// `M_b = max_{j ∈ b} |v_j| / 20` (the reference's).
    #[serde(default = "default_block_size")]
    pub temperature_group: usize,
    /// SignSGD: how the temperature `M` of `q_j(+1) = σ(v_j / M)` is chosen (§4.8).
    #[serde(default)]
    pub temperature: Temperature,
    /// SignSGD with `temperature = "rms"`: `M = temperature_scale × rms(v)`.
    #[serde(default = "default_temperature_scale")]
    pub temperature_scale: f64,
    /// Adaptive KLMS: the margin `r` of Theorem 4.1 in bits; blocks still carry about
    /// `d_target` bits of KL but get `K = 2^(d_target + margin_bits)` candidates, so each index
    /// costs `d_target + margin_bits` bits.
    #[serde(default)]
    pub margin_bits: u32,
    /// KLMS: how a client picks its candidate, `importance` (the paper's: `k* ~ π`, an index
    /// costs `⌈log2 K⌉` bits) or `ordered` (ordered random coding: the index in an exp-Golomb
    /// code of order [`index_code_order`], about the block's KL plus 1–3 bits, and more of the
    /// drift carried at the same `K`). Ignored without KLMS, like `rescale_drift` (a compare
    /// grid shares one table between a host and its KLMS version).
    #[serde(default)]
    pub selection: Selection,
    /// KLMS with QSGD, SignSGD or SGLD: the client measures the share `ρ` of its drift that its
    /// candidates carry (32 bits, counted) and the server divides the decoded drift by it.
    /// Ignored without KLMS; refused with FedPM.
    #[serde(default)]
    pub rescale_drift: bool,
    /// KLMS with any host, FedPM included: the client measures `ρ` and sends it (32 bits,
    /// counted) as `rescale_drift` does, but the server only records it (`metrics.jsonl`,
    /// `fedshard_klms_drift_ratio`) and folds the drift as decoded: a run then shows how much of
    /// its drift the candidates carried at its `K`. Implied by `rescale_drift`.
    #[serde(default)]
    pub report_drift: bool,
    /// QSGD-KLMS: `β`, the pseudo-counts of the per-tensor symbol frequency added to last
    /// round's per-value counts: `p_j(s) = (n_j(s) + β f_t(s)) / (n_j + β)`.
    #[serde(default = "default_prior_weight")]
    pub prior_weight: f64,
}

/// SignSGD's temperature rule (`[compression] temperature`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Temperature {
    /// The reference's `M_b = max_{j ∈ b} |v_j| / 20` over groups of `temperature_group`
    /// values: `q` is nearly deterministic, about 0.7 bits of KL per value.
    Group,
    /// `M = max_j |v_j| / 20` over the whole message.
    Vector,
    /// `M = temperature_scale × rms(v)` over the whole message: `E[y_j] ≈ v_j / (2M)`, and a
    /// value's KL is about `(v_j / M)² / (8 ln 2)` bits.
    #[default]
    Rms,
}

impl Default for CompressionConfig {
    fn default() -> Self {
        Self {
            blocks: BlockMode::default(),
            block_scope: BlockScope::default(),
            recut_below_drift: default_recut_below_drift(),
            d_target: default_d_target(),
            max_block_size: default_max_block_size(),
            block_size: default_block_size(),
            candidates: None,
            server_lr: default_server_lr(),
            temperature_group: default_block_size(),
            temperature: Temperature::default(),
            temperature_scale: default_temperature_scale(),
            margin_bits: 0,
            selection: Selection::default(),
            rescale_drift: false,
            report_drift: false,
            prior_weight: default_prior_weight(),
        }
    }
}

fn default_d_target() -> u32 {
    2
}
fn default_recut_below_drift() -> f64 {
    0.85
}
fn default_max_block_size() -> usize {
    256
}
fn default_block_size() -> usize {
    8
}
fn default_server_lr() -> f64 {
    1.0
}
fn default_temperature_scale() -> f64 {
    2.0
}
fn default_prior_weight() -> f64 {
    10.0
}

/// What a task tells a client about its uplink this round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Uplink {
    pub compressor: Compressor,
    /// `η_S` (QSGD, SignSGD; SGLD's `η`).
    pub server_lr: f64,
    /// SignSGD's temperature group size.
    pub temperature_group: usize,
    /// SignSGD's temperature rule and its scale.
    pub temperature: Temperature,
    pub temperature_scale: f64,
    /// The KLMS settings of this round, for the `-klms` compressors.
    pub klms: Option<KlmsTask>,
    /// KLMS: the client sends its drift ratio `ρ` and the server divides the drift by it.
    pub rescale_drift: bool,
    /// KLMS: the client sends its drift ratio `ρ`, which the server only records.
    pub report_drift: bool,
    /// QSGD: last round's counts of `(−1, 0, +1)` at each value of this task's message; `None`
    /// before any round decoded a symbol.
    pub prior_counts: Option<Vec<[u16; 3]>>,
    /// QSGD-KLMS: the tensors of the message (their lengths, in message order) and, once a round
    /// decoded symbols, each tensor's smoothed symbol frequency of that round; without them the
    /// client sends its own tensor means (`qsgd` module).
    pub prior_tensors: Vec<usize>,
    pub prior_means: Option<Vec<[f64; 3]>>,
    /// QSGD-KLMS: `β`.
    pub prior_weight: f64,
    /// SGLD: the step and the round's cohort, which fix `σ²` and the server's scale.
    pub langevin: Option<LangevinScaling>,
}

impl Uplink {
    /// Whether a KLMS payload ends with the client's drift ratio `ρ`: to be divided by
    /// (`rescale_drift`) or only recorded (`report_drift`).
    fn sends_drift(&self) -> bool {
        self.rescale_drift || self.report_drift
    }
}

/// The round's cohort, as the server knows it when it attaches the uplinks: `N` clients in the
/// population and `C` of them asked to train (SGLD's `κ = N / C`, §4.9), and the round whose
/// K schedule fixed blocks follow (§4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cohort {
    pub population: usize,
    pub participants: usize,
    /// The round the update will make: its number in a synchronous run, and in async mode the
    /// model version its aggregate will build, so that a schedule over rounds runs over versions
    /// there (a task's own `round` counts every task handed out, which keys its randomness).
    pub round: u64,
}

/// KLMS for one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KlmsTask {
    /// Candidates per block `K`.
    pub candidates: usize,
    pub blocks: TaskBlocks,
    /// How the client picks `k*`, which fixes how the index is written.
    #[serde(default)]
    pub selection: Selection,
}

/// The exp-Golomb order of [`Selection::Ordered`]'s indices, `None` for importance sampling's
/// fixed `⌈log2 K⌉` bits. The index `k*` of ordered random coding has `log2(k* + 1)` of about
/// the block's KL (Monte Carlo, `strategies/tests/klms.rs`), and an order-`g` code spends `g + 1`
/// bits below `2^g` and two more per doubling: `g = ⌊D_target / 2⌋` for adaptive blocks of
/// about `D_target` bits (a simulation of Bernoulli blocks of 2, 3.8, 7.2 and 11 bits found the
/// shortest mean code at orders 1, 2–3, 4 and 5–6), `⌊log2 K / 2⌋` for fixed blocks.
pub fn index_code_order(klms: &KlmsTask) -> Result<Option<u32>, String> {
    Ok(match klms.selection {
        Selection::Importance => None,
        Selection::Ordered => Some(match &klms.blocks {
            TaskBlocks::Adaptive { d_target, .. } => d_target / 2,
            TaskBlocks::Fixed { .. } => {
                index_bits(klms.candidates).map_err(strategy_error)? as u32 / 2
            }
        }),
    })
}

/// The blocks of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TaskBlocks {
    Fixed {
        size: usize,
    },
    Adaptive {
        d_target: u32,
        max_block_size: usize,
        /// The broadcast block ends; `None` asks the client to cut its own blocks and upload
        /// them (`UPDATE`, §4.4 step 1).
        ends: Option<Vec<usize>>,
    },
}

/// What the server learns from a compressed uplink besides the values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UplinkSide {
    /// The length of the message.
    pub len: usize,
    /// The client's own block ends, when it uploaded them.
    pub ends: Option<Vec<usize>>,
    /// The client's mean KL per block in bits (adaptive blocks with broadcast ends).
    pub mean_kl_bits: Option<f64>,
    /// QSGD's decoded symbols.
    pub symbols: Option<Vec<i8>>,
    /// The drift ratio `ρ` the client reported (`rescale_drift`).
    pub drift_ratio: Option<f64>,
}

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

/// FedPM's decoded probabilities for a mask bit (the reference's clamping, §4.6).
pub const MASK_LOW: f32 = 0.01;
pub const MASK_HIGH: f32 = 0.99;

/// The two distributions of a host over one message.
enum Message {
    Mask {
        q: Vec<f64>,
        p: Vec<f64>,
    },
    Ternary {
        q: Vec<[f64; 3]>,
        p: Vec<[f64; 3]>,
    },
    /// SGLD: `q = N(mean, σ² I)` (`mean` is empty in the server's view), `p = N(0, σ² I)`.
    Gaussian {
        mean: Vec<f64>,
        zero: Vec<f64>,
        std: Vec<f64>,
    },
}

/// What a client chose and the server decodes.
#[derive(Debug, Clone, PartialEq)]
enum Symbols {
    /// Mask bits as 0/1, signs as ±1, QSGD's `{−1, 0, +1}`.
    Discrete(Vec<i8>),
    /// SGLD's sample `y_c`.
    Real(Vec<f64>),
}

/// The range of drift ratios a client may report, so the server never multiplies a drift by
/// more than 10. Inside it the rescaling is exact along the drift: `ρ` is the least-squares
/// ratio of the block means given the candidates, so `⟨(ȳ − μ_p)/ρ, Δ⟩ = ‖Δ‖²` for every draw
/// of candidates, and the selection draws `y` with mean `ȳ`; a clamped `ρ` (a short message,
/// few blocks) loses that.
pub const DRIFT_RATIO_RANGE: (f64, f64) = (0.1, 2.0);

/// QSGD-KLMS's `p` over a message of `len` values from the tensor frequencies `means` (the
/// server's, or the client's own as sent) and the task's counts and `β`.
fn qsgd_prior(uplink: &Uplink, means: &[[f64; 3]], len: usize) -> Result<Vec<[f64; 3]>, String> {
    qsgd::global_distribution(
        &uplink.prior_tensors,
        means,
        uplink.prior_counts.as_deref(),
        uplink.prior_weight,
        len,
    )
}

/// The server's view: `p` from the task alone.
fn prior(uplink: &Uplink, sent: &[f32]) -> Result<Message, String> {
    Ok(match host_of(uplink)? {
        Host::Fedpm => Message::Mask {
            q: Vec::new(),
            p: mask_probabilities(sent, "sent")?,
        },
        // Plain QSGD needs no `p`; QSGD-KLMS without tensor frequencies from the server gets
        // it from the client's own tensor means ([`qsgd`]), filled in once they are known.
        Host::Qsgd => Message::Ternary {
            q: Vec::new(),
            p: match (&uplink.prior_means, &uplink.klms) {
                (Some(means), Some(_)) => qsgd_prior(uplink, means, sent.len())?,
                _ => Vec::new(),
            },
        },
        // SignSGD's `p` is the fair coin, implicit in its bit-candidate coder
        // ([`FairSignEncoder`]).
        Host::Signsgd => Message::Ternary {
            q: Vec::new(),
            p: Vec::new(),
        },
        Host::Sgld => {
            let std = langevin_of(uplink)?.noise_variance().sqrt();
            if !(std > 0.0 && std.is_finite()) {
                return Err(format!("SGLD: the message's σ is {std}"));
            }
            Message::Gaussian {
                mean: Vec::new(),
                zero: vec![0.0; sent.len()],
                std: vec![std; sent.len()],
            }
        }
    })
}

/// SGLD's step and cohort, checked (they come with the task, so over the wire on a client).
fn langevin_of(uplink: &Uplink) -> Result<LangevinScaling, String> {
    let scaling = uplink
        .langevin
        .ok_or_else(|| "SGLD needs the round's step and cohort in the task".to_string())?;
    scaling.check().map_err(|e| e.to_string())?;
    Ok(scaling)
}

fn host_of(uplink: &Uplink) -> Result<Host, String> {
    uplink
        .compressor
        .host()
        .ok_or_else(|| "the identity encoding has no host method".to_string())
}

fn mask_probabilities(values: &[f32], what: &str) -> Result<Vec<f64>, String> {
    values
        .iter()
        .enumerate()
        .map(|(j, &v)| {
            if (0.0..=1.0).contains(&v) {
                Ok(f64::from(v))
            } else {
                Err(format!(
                    "FedPM needs mask probabilities in [0, 1]; {what} value {j} is {v}"
                ))
            }
        })
        .collect()
}

/// The client's view of its message.
struct ClientMessage {
    m: Message,
    /// QSGD's norm as sent.
    norm: Option<f32>,
    /// QSGD-KLMS without the server's tensor frequencies: the client's own tensor means, sent.
    tensor_means: Option<Vec<[f32; 2]>>,
}

/// The client's view: `q` and `p`, plus QSGD's norm and, when it must send them, its tensor
/// means.
fn message(uplink: &Uplink, sent: &[f32], out: &[f32]) -> Result<ClientMessage, String> {
    let mut m = prior(uplink, sent)?;
    let mut norm = None;
    let mut tensor_means = None;
    let v = || -> Vec<f64> {
        out.iter()
            .zip(sent)
            .map(|(o, s)| f64::from(*o) - f64::from(*s))
            .collect()
    };
    match (&mut m, host_of(uplink)?) {
        (Message::Mask { q, .. }, _) => *q = mask_probabilities(out, "trained")?,
        (Message::Ternary { q, p }, Host::Qsgd) => {
            let v = v();
            let full = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            if !full.is_finite() {
                return Err(format!("QSGD: the update's norm is {full}"));
            }
            // The norm travels as f32; q uses the value the server reads.
            let sent_norm = full as f32;
            norm = Some(sent_norm);
            let n = f64::from(sent_norm);
            *q = v
                .iter()
                .map(|&x| {
                    if n == 0.0 {
                        return [0.0, 1.0, 0.0];
                    }
                    let a = (x.abs() / n).min(1.0);
                    if x >= 0.0 {
                        [0.0, 1.0 - a, a]
                    } else {
                        [a, 1.0 - a, 0.0]
                    }
                })
                .collect();
            if uplink.klms.is_some() && uplink.prior_means.is_none() {
                let own = qsgd::own_tensor_means(q, &uplink.prior_tensors);
                *p = qsgd_prior(uplink, &qsgd::means_from_wire(&own)?, sent.len())?;
                tensor_means = Some(own);
            }
        }
        (Message::Ternary { q, .. }, _) => {
            *q = signsgd::sign_probabilities(
                &v(),
                uplink.temperature,
                uplink.temperature_group,
                uplink.temperature_scale,
            )?;
        }
        (Message::Gaussian { mean, .. }, _) => {
            // The SGLD client's output is `θ − H_c` (one unit step on its potential).
            *mean = sent
                .iter()
                .zip(out)
                .map(|(s, o)| f64::from(*s) - f64::from(*o))
                .collect();
            if let Some(j) = mean.iter().position(|m| !m.is_finite()) {
                return Err(format!("SGLD: gradient value {j} is {}", mean[j]));
            }
        }
    }
    Ok(ClientMessage {
        m,
        norm,
        tensor_means,
    })
}

/// Encodes a training output for `task.uplink` (the identity encoding is not handled here).
pub fn encode(task: &TrainTask, output: &TrainOutput) -> Result<Vec<u8>, String> {
    encode_symbols(task, output).map(|(bytes, _)| bytes)
}

/// [`encode`], also returning the symbols the client chose, which the server must decode bit
/// for bit.
fn encode_symbols(task: &TrainTask, output: &TrainOutput) -> Result<(Vec<u8>, Symbols), String> {
    let uplink = &task.uplink;
    let host = host_of(uplink)?;
    let sent = flatten(&task.dense, &task.shards);
    let out = flatten(&output.dense, &output.shards);
    if sent.len() != out.len() {
        return Err(format!(
            "the output has {} values, the task {}",
            out.len(),
            sent.len()
        ));
    }
    let ClientMessage {
        m,
        norm,
        tensor_means,
    } = message(uplink, &sent, &out)?;
    let shared = SharedSeed {
        seed: task.seed,
        round: task.round,
        client: task.client,
    };
    let mut selection = shared.selection_stream();
    let mut w = BitWriter::new();
    if let Some(norm) = norm {
        w.f32(norm);
    }
    for [minus, plus] in tensor_means.iter().flatten() {
        w.f32(*minus);
        w.f32(*plus);
    }
    let rescale = uplink.rescale_drift;
    let err = |e: fedshard_strategies::error::StrategyError| e.to_string();
    let symbols = match &uplink.klms {
        None => match m {
            Message::Mask { q, .. } => {
                let symbols: Vec<i8> = q
                    .iter()
                    .map(|&p| i8::from(uniform(&mut selection) < p))
                    .collect();
                for &s in &symbols {
                    w.bits(s as u32, 1);
                }
                Symbols::Discrete(symbols)
            }
            Message::Ternary { q, .. } => {
                let symbols: Vec<i8> = q
                    .iter()
                    .map(|row| draw_ternary(row, &mut selection))
                    .collect();
                match uplink.compressor {
                    Compressor::Signsgd => {
                        for &s in &symbols {
                            w.bits(u32::from(s > 0), 1);
                        }
                    }
                    Compressor::QsgdElias => write_elias_symbols(&mut w, &symbols),
                    _ => write_trits(&mut w, &symbols),
                }
                Symbols::Discrete(symbols)
            }
            Message::Gaussian { mean, std, .. } => {
                // The host without KLMS: a private sample of q, each value as an f32.
                let q = Gaussian::new(&mean, &std).map_err(err)?;
                let mut y = vec![0.0; q.len()];
                q.sample_block(0..q.len(), &mut selection, &mut y);
                let mut sent_values = Vec::with_capacity(y.len());
                for (j, v) in y.into_iter().enumerate() {
                    let value = v as f32;
                    if !value.is_finite() {
                        return Err(format!("SGLD: sample value {j} ({v}) overflows an f32"));
                    }
                    w.f32(value);
                    sent_values.push(f64::from(value));
                }
                Symbols::Real(sent_values)
            }
        },
        Some(klms) => {
            if rescale && matches!(m, Message::Mask { .. }) {
                return Err("FedPM's decoded masks cannot be rescaled (rescale_drift)".into());
            }
            let mut coder = KlmsUplink {
                klms,
                sends_drift: uplink.sends_drift(),
                shared: &shared,
                selection: &mut selection,
                w: &mut w,
            };
            match &m {
                Message::Mask { q, p } => Symbols::Discrete(
                    coder
                        .encode(
                            &Bernoulli::new(q).map_err(err)?,
                            &Bernoulli::new(p).map_err(err)?,
                        )?
                        .into_iter()
                        .map(i8::from)
                        .collect(),
                ),
                Message::Ternary { q, .. } if host == Host::Signsgd => {
                    let plus: Vec<f64> = q.iter().map(|row| row[2]).collect();
                    Symbols::Discrete(coder.encode_signs(&plus)?)
                }
                Message::Ternary { q, p } => Symbols::Discrete(coder.encode(
                    &Categorical::new(q).map_err(err)?,
                    &Categorical::new(p).map_err(err)?,
                )?),
                Message::Gaussian { mean, zero, std } => Symbols::Real(coder.encode(
                    &Gaussian::new(mean, std).map_err(err)?,
                    &Gaussian::new(zero, std).map_err(err)?,
                )?),
            }
        }
    };
    Ok((w.finish(), symbols))
}

fn strategy_error(e: fedshard_strategies::error::StrategyError) -> String {
    e.to_string()
}

/// What KLMS writes into one client's payload, with its settings.
struct KlmsUplink<'a> {
    klms: &'a KlmsTask,
    /// Whether to append the drift ratio `ρ` (`rescale_drift` or `report_drift`).
    sends_drift: bool,
    shared: &'a SharedSeed,
    selection: &'a mut ChaCha20Rng,
    w: &'a mut BitWriter,
}

impl KlmsUplink<'_> {
    /// KLMS over any product distribution: cuts the blocks (writing the client's own block sizes
    /// in `UPDATE` rounds, or the mean-KL report against broadcast ends), writes one candidate
    /// index per block and, with `sends_drift`, the drift ratio `ρ` of its candidates as an f32,
    /// and returns the symbols the server will decode.
    fn encode<D: ProductDistribution>(&mut self, q: &D, p: &D) -> Result<Vec<D::Symbol>, String> {
        let err = strategy_error;
        let partition = self.partition(q.len(), || kl_bits_per_coordinate(q, p))?;
        let mut selected = vec![D::Symbol::default(); q.len()];
        let mut encoder = if self.sends_drift {
            KlmsEncoder::tracking_means()
        } else {
            KlmsEncoder::new()
        }
        .with_selection(self.klms.selection);
        let indices = encoder
            .encode(
                q,
                p,
                &partition,
                self.klms.candidates,
                self.shared,
                self.selection,
                &mut selected,
            )
            .map_err(err)?;
        let rho = self.sends_drift.then(|| {
            let means = |d: &D| (0..d.len()).map(|j| d.mean(j)).collect::<Vec<_>>();
            drift_ratio(encoder.conditional_means(), &means(q), &means(p))
        });
        self.finish(&indices, rho.flatten())?;
        Ok(selected)
    }

    /// SignSGD's signs with `P(+1) = plus[j]` against the fair coin, through the bit-candidate
    /// coder ([`FairSignEncoder`]): the same payload layout as [`Self::encode`].
    fn encode_signs(&mut self, plus: &[f64]) -> Result<Vec<i8>, String> {
        let err = strategy_error;
        let partition = self.partition(plus.len(), || {
            let half = vec![0.5; plus.len()];
            kl_bits_per_coordinate(&Bernoulli::new(plus)?, &Bernoulli::new(&half)?)
        })?;
        let message = FairSignEncoder::new()
            .with_selection(self.klms.selection)
            .encode(
                plus,
                &partition,
                self.klms.candidates,
                self.shared,
                self.selection,
                self.sends_drift,
            )
            .map_err(err)?;
        self.finish(&message.indices, message.drift_ratio)?;
        Ok(message.signs)
    }

    /// Cuts the blocks: fixed, the client's own adaptive blocks (written: their count and sizes)
    /// or the broadcast ends (written: the mean-KL report), over `len` values; `kl` gives the
    /// per-value KL in bits.
    fn partition(
        &mut self,
        len: usize,
        kl: impl FnOnce() -> fedshard_strategies::error::Result<Vec<f64>>,
    ) -> Result<Partition, String> {
        let err = strategy_error;
        Ok(match &self.klms.blocks {
            TaskBlocks::Fixed { size } => Partition::fixed(len, *size).map_err(err)?,
            TaskBlocks::Adaptive {
                d_target,
                max_block_size,
                ends,
            } => {
                let kl = kl().map_err(err)?;
                match ends {
                    None => {
                        let own = Partition::adaptive(&kl, f64::from(*d_target), *max_block_size)
                            .map_err(err)?;
                        let width = boundary_bits(*max_block_size).map_err(err)? as u32;
                        self.w.u32(own.num_blocks() as u32);
                        for size in own.sizes() {
                            self.w.bits((size - 1) as u32, width);
                        }
                        own
                    }
                    Some(ends) => {
                        let global = Partition::from_ends(ends.clone()).map_err(err)?;
                        self.w
                            .f32(global.mean_block_kl_bits(&kl).map_err(err)? as f32);
                        global
                    }
                }
            }
        })
    }

    /// Writes one index per block, in `⌈log2 K⌉` bits or in the exp-Golomb code of
    /// [`index_code_order`], then, with `sends_drift`, the drift ratio `rho` (`None`: no drift to
    /// carry, sent as 1), clamped to [`DRIFT_RATIO_RANGE`].
    fn finish(&mut self, indices: &[u32], rho: Option<f64>) -> Result<(), String> {
        match index_code_order(self.klms)? {
            Some(order) => indices
                .iter()
                .for_each(|&index| write_exp_golomb(self.w, index, order)),
            None => {
                let width = index_bits(self.klms.candidates).map_err(strategy_error)? as u32;
                indices.iter().for_each(|&index| self.w.bits(index, width));
            }
        }
        if self.sends_drift {
            let rho = rho
                .unwrap_or(1.0)
                .clamp(DRIFT_RATIO_RANGE.0, DRIFT_RATIO_RANGE.1);
            self.w.f32(rho as f32);
        }
        Ok(())
    }
}

/// The server's side of [`KlmsUplink`]: reads one KLMS payload's blocks, indices and drift
/// ratio, recording the side information in `side`.
struct KlmsReader<'a, 'b> {
    klms: &'a KlmsTask,
    /// Whether the payload ends with the drift ratio `ρ` (`rescale_drift` or `report_drift`).
    sends_drift: bool,
    shared: SharedSeed,
    r: &'a mut BitReader<'b>,
    side: &'a mut UplinkSide,
}

impl KlmsReader<'_, '_> {
    /// The decoder of [`KlmsUplink::encode`]: reads the blocks (recording uploaded ends or the
    /// KL report in `side`) and the indices, and regenerates the selected candidates.
    fn decode<D: ProductDistribution>(&mut self, p: &D) -> Result<Vec<D::Symbol>, String> {
        self.read(p.len(), |partition, k, indices, shared, out| {
            klms_decode(p, partition, k, indices, shared, out)
        })
    }

    /// The decoder of [`KlmsUplink::encode_signs`]: `d` signs, `±1`.
    fn decode_signs(&mut self, d: usize) -> Result<Vec<i8>, String> {
        self.read(d, decode_fair_signs)
    }

    /// Reads the blocks and indices of `d` values, has `regenerate` write the selected
    /// candidates (given the partition, `K`, the indices and the shared seed), then reads the
    /// drift ratio.
    fn read<S: Clone + Default>(
        &mut self,
        d: usize,
        regenerate: impl FnOnce(
            &Partition,
            usize,
            &[u32],
            &SharedSeed,
            &mut [S],
        ) -> fedshard_strategies::error::Result<()>,
    ) -> Result<Vec<S>, String> {
        let (partition, indices) = read_blocks(self.klms, d, self.r, self.side)?;
        let mut out = vec![S::default(); d];
        regenerate(
            &partition,
            self.klms.candidates,
            &indices,
            &self.shared,
            &mut out,
        )
        .map_err(strategy_error)?;
        read_drift_ratio(self.sends_drift, self.r, self.side)?;
        Ok(out)
    }
}

/// Reads what [`KlmsUplink::partition`] wrote for a message of `d` values, then one index per
/// block.
fn read_blocks(
    klms: &KlmsTask,
    d: usize,
    r: &mut BitReader,
    side: &mut UplinkSide,
) -> Result<(Partition, Vec<u32>), String> {
    let err = strategy_error;
    let partition = match &klms.blocks {
        TaskBlocks::Fixed { size } => Partition::fixed(d, *size).map_err(err)?,
        TaskBlocks::Adaptive {
            max_block_size,
            ends: None,
            ..
        } => {
            let blocks = r.u32()? as usize;
            if blocks == 0 || blocks > d {
                return Err(format!("{blocks} blocks for a message of {d} values"));
            }
            let width = boundary_bits(*max_block_size).map_err(err)? as u32;
            let sizes = (0..blocks)
                .map(|_| r.bits(width).map(|s| s as usize + 1))
                .collect::<Result<Vec<_>, _>>()?;
            let own = Partition::from_sizes(&sizes, *max_block_size)
                .map_err(|e| format!("block boundaries: {e}"))?;
            if own.len() != d {
                return Err(format!(
                    "block boundaries cover {} values of {d}",
                    own.len()
                ));
            }
            side.ends = Some(own.ends().to_vec());
            own
        }
        TaskBlocks::Adaptive {
            ends: Some(ends), ..
        } => {
            let mean = r.f32()?;
            if !(mean.is_finite() && mean >= 0.0) {
                return Err(format!("mean-KL report {mean}"));
            }
            side.mean_kl_bits = Some(f64::from(mean));
            Partition::from_ends(ends.clone()).map_err(err)?
        }
    };
    let indices = match index_code_order(klms)? {
        Some(order) => (0..partition.num_blocks())
            .map(|_| read_exp_golomb(r, order))
            .collect::<Result<Vec<_>, _>>()?,
        None => {
            let width = index_bits(klms.candidates).map_err(err)? as u32;
            (0..partition.num_blocks())
                .map(|_| r.bits(width))
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    Ok((partition, indices))
}

/// Reads the drift ratio [`KlmsUplink::finish`] wrote, if the task sends one, into `side`.
fn read_drift_ratio(
    sends_drift: bool,
    r: &mut BitReader,
    side: &mut UplinkSide,
) -> Result<(), String> {
    if sends_drift {
        let rho = f64::from(r.f32()?);
        let (low, high) = DRIFT_RATIO_RANGE;
        if !(low as f32 as f64..=high).contains(&rho) {
            return Err(format!("drift ratio {rho}; expected {low} ≤ ρ ≤ {high}"));
        }
        side.drift_ratio = Some(rho);
    }
    Ok(())
}

/// A draw from `[P(−1), P(0), P(+1)]` by inverse CDF in that order.
fn draw_ternary(row: &[f64; 3], rng: &mut ChaCha20Rng) -> i8 {
    let u = uniform(rng);
    if u < row[0] {
        -1
    } else if u < row[0] + row[1] {
        0
    } else {
        1
    }
}

/// Decodes a compressed payload against its task: the values the server folds, and the side
/// information for [`state::UplinkState`]. Every malformed field is an error, never a panic.
pub fn decode(task: &TrainTask, bytes: &[u8]) -> Result<(Vec<f32>, UplinkSide), String> {
    let sent = flatten(&task.dense, &task.shards);
    let Decoded {
        symbols,
        norm,
        mut side,
        prior_mean,
    } = decode_symbols(task, &sent, bytes)?;
    let uplink = &task.uplink;
    let host = host_of(uplink)?;
    let eta = uplink.server_lr;
    // The transmitted drift, rescaled: `μ_p + (y − μ_p) / ρ` (plain `y` without a ratio, or
    // with a ratio only reported).
    let rho = side.drift_ratio.filter(|_| uplink.rescale_drift);
    let drift = |j: usize, y: f64| match rho {
        Some(rho) => {
            let mu = prior_mean.get(j).copied().unwrap_or(0.0);
            mu + (y - mu) / rho
        }
        None => y,
    };
    let values = match (host, &symbols) {
        (Host::Fedpm, Symbols::Discrete(symbols)) => symbols
            .iter()
            .map(|&m| if m > 0 { MASK_HIGH } else { MASK_LOW })
            .collect(),
        (Host::Qsgd, Symbols::Discrete(symbols)) => {
            let step = eta * f64::from(norm.unwrap_or(0.0));
            sent.iter()
                .zip(symbols)
                .enumerate()
                .map(|(j, (s, &y))| (f64::from(*s) + step * drift(j, f64::from(y))) as f32)
                .collect()
        }
        (Host::Signsgd, Symbols::Discrete(symbols)) => sent
            .iter()
            .zip(symbols)
            .enumerate()
            .map(|(j, (s, &y))| (f64::from(*s) + eta * drift(j, f64::from(y))) as f32)
            .collect(),
        // `sent − η κ C y_c`: the equal-weight mean over the C participants is the SGLD step
        // `θ − η κ Σ_c y_c` (`uniform` aggregator, enforced by the config).
        (Host::Sgld, Symbols::Real(y)) => {
            let scale = langevin_of(uplink)?.decoded_scale();
            sent.iter()
                .zip(y)
                .enumerate()
                .map(|(j, (s, &y))| (f64::from(*s) - scale * drift(j, y)) as f32)
                .collect()
        }
        (host, _) => return Err(format!("{host:?} decoded the wrong kind of symbols")),
    };
    if let (Host::Qsgd, Symbols::Discrete(symbols)) = (host, symbols) {
        side.symbols = Some(symbols);
    }
    Ok((values, side))
}

/// What [`decode_symbols`] reads from a payload.
struct Decoded {
    symbols: Symbols,
    /// QSGD's norm.
    norm: Option<f32>,
    side: UplinkSide,
    /// `E_p[y_j]` per value when the drift is rescaled, else empty.
    prior_mean: Vec<f64>,
}

/// The symbols of a payload, QSGD's norm, the side information and, with `rescale_drift`, the
/// prior's means; `sent` is the task's message ([`flatten`]).
fn decode_symbols(task: &TrainTask, sent: &[f32], bytes: &[u8]) -> Result<Decoded, String> {
    let uplink = &task.uplink;
    let host = host_of(uplink)?;
    let d = sent.len();
    let mut p = prior(uplink, sent)?;
    let mut r = BitReader::new(bytes);
    let mut side = UplinkSide {
        len: d,
        ..UplinkSide::default()
    };
    let norm = match host {
        Host::Qsgd => {
            let norm = r.f32()?;
            if !(norm.is_finite() && norm >= 0.0) {
                return Err(format!("QSGD norm {norm}"));
            }
            Some(norm)
        }
        _ => None,
    };
    if let (Host::Qsgd, Some(_), None) = (host, &uplink.klms, &uplink.prior_means) {
        // The client's own tensor means come right after the norm ([`qsgd`]).
        let own = (0..uplink.prior_tensors.len())
            .map(|_| Ok([r.f32()?, r.f32()?]))
            .collect::<Result<Vec<_>, String>>()?;
        p = Message::Ternary {
            q: Vec::new(),
            p: qsgd_prior(uplink, &qsgd::means_from_wire(&own)?, d)?,
        };
    }
    let rescale = uplink.rescale_drift;
    if rescale && (host == Host::Fedpm || uplink.klms.is_none()) {
        return Err("only KLMS with QSGD, SignSGD or SGLD rescales its drift".into());
    }
    if uplink.report_drift && uplink.klms.is_none() {
        return Err("only KLMS reports a drift ratio".into());
    }
    let err = strategy_error;
    let mut prior_mean = Vec::new();
    // Symbols: +1/−1/0 for ternary hosts, 1/0 for masks, reals for SGLD.
    let symbols = match &uplink.klms {
        None => match host {
            Host::Qsgd if uplink.compressor == Compressor::QsgdElias => {
                Symbols::Discrete(read_elias_symbols(&mut r, d)?)
            }
            Host::Qsgd => Symbols::Discrete(read_trits(&mut r, d)?),
            Host::Signsgd => Symbols::Discrete(
                (0..d)
                    .map(|_| r.bits(1).map(|b| if b == 1 { 1 } else { -1 }))
                    .collect::<Result<_, _>>()?,
            ),
            Host::Fedpm => Symbols::Discrete(
                (0..d)
                    .map(|_| r.bits(1).map(|b| b as i8))
                    .collect::<Result<_, _>>()?,
            ),
            Host::Sgld => Symbols::Real(
                (0..d)
                    .map(|j| match r.f32()? {
                        v if v.is_finite() => Ok(f64::from(v)),
                        v => Err(format!("SGLD value {j} is {v}")),
                    })
                    .collect::<Result<_, String>>()?,
            ),
        },
        Some(klms) => {
            let mut reader = KlmsReader {
                klms,
                sends_drift: uplink.sends_drift(),
                shared: SharedSeed {
                    seed: task.seed,
                    round: task.round,
                    client: task.client,
                },
                r: &mut r,
                side: &mut side,
            };
            match &p {
                Message::Mask { p, .. } => Symbols::Discrete(
                    reader
                        .decode(&Bernoulli::new(p).map_err(err)?)?
                        .into_iter()
                        .map(i8::from)
                        .collect(),
                ),
                Message::Ternary { .. } if host == Host::Signsgd => {
                    if rescale {
                        prior_mean = vec![0.0; d];
                    }
                    Symbols::Discrete(reader.decode_signs(d)?)
                }
                Message::Ternary { p, .. } => {
                    let p = Categorical::new(p).map_err(err)?;
                    if rescale {
                        prior_mean = (0..p.len()).map(|j| p.mean(j)).collect();
                    }
                    Symbols::Discrete(reader.decode(&p)?)
                }
                Message::Gaussian { zero, std, .. } => {
                    let p = Gaussian::new(zero, std).map_err(err)?;
                    if rescale {
                        prior_mean = zero.clone();
                    }
                    Symbols::Real(reader.decode(&p)?)
                }
            }
        }
    };
    r.finish()?;
    Ok(Decoded {
        symbols,
        norm,
        side,
        prior_mean,
    })
}

#[cfg(test)]
mod tests;
