//! KLMS — KL minimisation with side information (docs/algorithms.md §4; the KLMS paper (Isik, Pase et al.)):
//! uplink compression of a stochastic message whose client-only distribution `q` is close to a
//! global distribution `p` that client and server both know.
//!
//! Instead of the sample `x ~ q`, a client sends which of `K` shared candidates to use:
//!
//! 1. both sides draw `y_1..y_K ~ p_I` i.i.d. over a block `I` from the stream `sd(t, c, m)`
//!    ([`SharedSeed::candidate_stream`], §4.2);
//! 2. the client weighs them, `l_k = Σ_{j ∈ I} ln q_j(y_kj) − ln p_j(y_kj)`,
//!    `π(k) = exp(l_k − max l) / Σ_k' exp(l_k' − max l)` ([`importance_weights`], §4.1);
//! 3. the client draws `k* ~ π` privately and sends it in `⌈log2 K⌉` bits ([`index_bits`]), or
//!    picks it by ordered random coding and sends it in a variable-length code
//!    ([`Selection`]); the server outputs `y_{k*}` ([`decode`]).
//!
//! With `K ≈ exp(KL(q_I ‖ p_I))` the decoded `y_{k*}` is close to a sample of `q` (Theorem 4.1),
//! so blocks are cut to carry about `D_target` bits of KL each and `K = 2^D_target`
//! ([`Partition::adaptive`], [`candidates_for_target`], §4.4), or fixed at `S` coordinates with
//! a K schedule ([`Partition::fixed`], [`KSchedule`], §4.3). The exact uplink bits, indices plus
//! block boundaries plus reports, are [`uplink_bits`] (§4.5).
//!
//! The coordinates are Bernoulli (FedPM masks), categorical over `{−1, 0, +1}` (QSGD, SignSGD) or
//! Gaussian (SGLD); see [`distribution`]. Signs against the fair coin (SignSGD) have their own
//! fast coder, [`fair_signs`], whose candidates are bits of the stream. FedPM's server step on
//! the decoded masks, BayesAgg (§4.6), is [`bayes_agg()`]; SGLD's scaling rule (§4.9) is
//! [`sgld`]. Not here: the host methods, the wire format and the protocol state (`UPDATE`, the
//! broadcast of boundaries); those live with the compressor policies that use this module.

pub mod bayes_agg;
pub mod bits;
pub mod blocks;
pub mod distribution;
pub mod fair_signs;
pub mod klms;
pub mod sgld;

pub use bayes_agg::{BetaPosterior, bayes_agg};
pub use bits::{KL_REPORT_BITS, UplinkBits, UplinkLayout, boundary_bits, index_bits, uplink_bits};
pub use blocks::{KSchedule, KlBand, Partition, candidates_for_target};
pub use distribution::{
    Bernoulli, Categorical, Gaussian, ProductDistribution, TERNARY_SUPPORT, block_kl_bits,
    block_log_likelihood, kl_bits_per_coordinate,
};
pub use fair_signs::{FairSignEncoder, SignMessage, decode_fair_signs};
pub use klms::{
    KlmsEncoder, Selection, SharedSeed, decode, decode_block, drift_ratio, importance_weights,
    select,
};
pub use sgld::LangevinScaling;
