//! The settings of the compressors: `[compression]` as configured, and what one task tells its
//! client about its uplink.

use super::Compressor;
use crate::error::Error;
use fedshard_strategies::compression::{LangevinScaling, Selection, index_bits};
use serde::{Deserialize, Serialize};

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
    pub(crate) fn sends_drift(&self) -> bool {
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
pub fn index_code_order(klms: &KlmsTask) -> Result<Option<u32>, Error> {
    Ok(match klms.selection {
        Selection::Importance => None,
        Selection::Ordered => Some(match &klms.blocks {
            TaskBlocks::Adaptive { d_target, .. } => d_target / 2,
            TaskBlocks::Fixed { .. } => index_bits(klms.candidates)? as u32 / 2,
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

/// The range of drift ratios a client may report, so the server never multiplies a drift by
/// more than 10. Inside it the rescaling is exact along the drift: `ρ` is the least-squares
/// ratio of the block means given the candidates, so `⟨(ȳ − μ_p)/ρ, Δ⟩ = ‖Δ‖²` for every draw
/// of candidates, and the selection draws `y` with mean `ȳ`; a clamped `ρ` (a short message,
/// few blocks) loses that.
pub const DRIFT_RATIO_RANGE: (f64, f64) = (0.1, 2.0);
