//! KLMS for a vector of signs against the fair coin: SignSGD's message (docs/algorithms.md §4.8),
//! whose `p` puts ½ on each sign of every value.
//!
//! The generic coder ([`super::klms`]) draws a candidate value by value, one 32-bit word and one
//! log-ratio look-up each, so its cost grows as `K · S` words a block: the `K = 2^(D + r)` that a
//! block needs to carry its drift (see [`super::klms::drift_ratio`]) makes it the slowest part of
//! a SignSGD-KLMS client. Under the fair coin a candidate is just random bits, so here a candidate of `S` signs is `⌈S/32⌉` words of the
//! shared stream, bit `i` giving sign `i` (1 ↦ +1), and its log-weight is a sum of `⌈S/8⌉`
//! look-ups in per-byte tables `T_g[b] = Σ_{i<8} ln q_{8g+i}(sign of bit i of b) − ln ½`, built
//! once per block: eight values per look-up instead of one per word.
//!
//! The protocol is otherwise the generic one: the same shared seed and block streams, the same
//! weights and private selection ([`super::klms::select`]), and the decoder
//! jumps straight to candidate `k*` (`k* · ⌈S/32⌉` words into the block's stream).

use super::blocks::Partition;
use super::distribution::Bernoulli;
use super::klms::{
    Selection, SharedSeed, check_candidate_count, check_index, check_index_count, check_partition,
    select,
};
use crate::error::Result;
use crate::rng::ChaCha20Rng;
use rand::Rng;

/// The 32-bit words of the stream a candidate of `block_len` signs consumes.
fn words_per_sign_candidate(block_len: usize) -> usize {
    block_len.div_ceil(32)
}

/// What [`FairSignEncoder::encode`] sends and what it knows about it.
#[derive(Debug, Clone, PartialEq)]
pub struct SignMessage {
    /// The candidate index `k*` of every block.
    pub indices: Vec<u32>,
    /// The signs the server will decode, `±1` per value.
    pub signs: Vec<i8>,
    /// With drift tracking, the share of the drift `μ_q − μ_p = 2q − 1` the candidates carry
    /// on average, `ρ = Σ_blocks Σ_k P(k* = k) ⟨y_k, Δ⟩ / ‖Δ‖²` (what [`super::drift_ratio`]
    /// computes from the conditional means); `None` without tracking or when `q` is the fair
    /// coin.
    pub drift_ratio: Option<f64>,
}

/// The client side, with its tables and buffers reused across blocks and rounds.
#[derive(Debug, Default)]
pub struct FairSignEncoder {
    /// How `k*` is picked.
    selection: Selection,
    /// Per byte-group of the block: the log-weight of each of the 256 bit patterns.
    weight_tables: Vec<[f64; 256]>,
    /// Per byte-group: `⟨y, Δ⟩` of each bit pattern (drift tracking only).
    drift_tables: Vec<[f64; 256]>,
    weights: Vec<f64>,
    alongs: Vec<f64>,
    bytes: Vec<u8>,
}

/// Candidates whose stream bytes are generated at once: 64 KiB for 256-value blocks, so the
/// keystream stays in L2 while its candidates are weighed.
const CANDIDATES_PER_FILL: usize = 2048;

impl FairSignEncoder {
    /// An encoder with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// This encoder, picking `k*` by `selection` (default [`Selection::Importance`]).
    pub fn with_selection(self, selection: Selection) -> Self {
        Self { selection, ..self }
    }

    /// Encodes the signs with `P(+1) = plus[j]` in the blocks of `partition`, `k` candidates
    /// each; block `m` uses the candidate stream `m` of `shared`, `k*` is picked with the
    /// private stream `selection`. With `track_drift` it also measures the drift ratio (twice
    /// the look-ups).
    pub fn encode(
        &mut self,
        plus: &[f64],
        partition: &Partition,
        k: usize,
        shared: &SharedSeed,
        selection: &mut ChaCha20Rng,
        track_drift: bool,
    ) -> Result<SignMessage> {
        Bernoulli::new(plus)?;
        check_candidate_count(k)?;
        check_partition(partition, plus.len())?;
        let mut signs = vec![0i8; plus.len()];
        let mut indices = Vec::with_capacity(partition.num_blocks());
        let (mut along, mut norm) = (0.0, 0.0);
        for (m, block) in partition.blocks().enumerate() {
            let q = &plus[block.clone()];
            self.build_tables(q, track_drift);
            let mut rng = shared.candidate_stream(m as u64);
            self.weigh_candidates(q.len(), k, &mut rng, track_drift);
            let mut repeats = track_drift.then(|| shared.drift_estimate_stream(m as u64));
            let index = select(
                &mut self.weights,
                self.selection,
                selection,
                repeats.as_mut(),
            );
            if track_drift {
                along += self
                    .weights
                    .iter()
                    .zip(&self.alongs)
                    .filter(|(w, _)| **w > 0.0)
                    .map(|(w, a)| w * a)
                    .sum::<f64>();
                norm += q.iter().map(|x| (2.0 * x - 1.0).powi(2)).sum::<f64>();
            }
            decode_candidate(shared, m as u64, index as u32, &mut signs[block]);
            indices.push(index as u32);
        }
        let drift_ratio = (track_drift && norm > 0.0 && along.is_finite()).then(|| along / norm);
        Ok(SignMessage {
            indices,
            signs,
            drift_ratio,
        })
    }

    /// The byte tables of one block: `T_g[b] = Σ_i ln(2 q_i)` over the set bits `i` of `b` plus
    /// `Σ_i ln(2 (1 − q_i))` over the clear ones (`−∞` where `q` cannot draw that sign; summed
    /// term by term, so no `∞ − ∞`), and with `track_drift` `D_g[b] = Σ_i ±(2 q_i − 1)`. Each
    /// byte table is the sum of two nibble tables: two logarithms a value and 384 additions a
    /// group, far below the `K · ⌈S/8⌉` look-ups that follow.
    fn build_tables(&mut self, q: &[f64], track_drift: bool) {
        self.weight_tables.clear();
        self.drift_tables.clear();
        for chunk in q.chunks(8) {
            let weight = |x: f64, plus: bool| (2.0 * if plus { x } else { 1.0 - x }).ln();
            let drift = |x: f64, plus: bool| if plus { 2.0 * x - 1.0 } else { 1.0 - 2.0 * x };
            self.weight_tables.push(byte_table(chunk, weight));
            if track_drift {
                self.drift_tables.push(byte_table(chunk, drift));
            }
        }
    }

    /// Draws the `k` candidates of a block of `len` signs from `rng` and fills `weights` (and
    /// `alongs`) with their log-weights (and `⟨y_k, Δ⟩`).
    fn weigh_candidates(&mut self, len: usize, k: usize, rng: &mut ChaCha20Rng, track: bool) {
        let stride = 4 * words_per_sign_candidate(len);
        let groups = len.div_ceil(8);
        self.weights.clear();
        self.alongs.clear();
        let mut left = k;
        while left > 0 {
            let n = left.min(CANDIDATES_PER_FILL);
            self.bytes.resize(n * stride, 0);
            rng.fill_bytes(&mut self.bytes);
            for candidate in self.bytes.chunks_exact(stride) {
                let bytes = &candidate[..groups];
                self.weights.push(table_sum(&self.weight_tables, bytes));
                if track {
                    self.alongs.push(table_sum(&self.drift_tables, bytes));
                }
            }
            left -= n;
        }
    }
}

/// The table over the 256 bit patterns `b` of up to 8 values, `Σ_i term(values[i], bit i of b)`
/// (a value beyond `values` adds nothing), as `low[b & 15] + high[b >> 4]`.
fn byte_table(values: &[f64], term: impl Fn(f64, bool) -> f64) -> [f64; 256] {
    let terms: Vec<[f64; 2]> = values
        .iter()
        .map(|&x| [term(x, false), term(x, true)])
        .collect();
    let nibble = |part: &[[f64; 2]]| {
        let mut table = [0.0f64; 16];
        for (n, t) in table.iter_mut().enumerate() {
            *t = part
                .iter()
                .enumerate()
                .map(|(i, pair)| pair[n >> i & 1])
                .sum();
        }
        table
    };
    let split = terms.len().min(4);
    let (low, high) = (nibble(&terms[..split]), nibble(&terms[split..]));
    let mut table = [0.0f64; 256];
    for (b, t) in table.iter_mut().enumerate() {
        *t = low[b & 15] + high[b >> 4];
    }
    table
}

/// `Σ_g T_g[bytes[g]]`: a candidate's value under per-byte tables.
#[inline]
fn table_sum(tables: &[[f64; 256]], bytes: &[u8]) -> f64 {
    tables
        .iter()
        .zip(bytes)
        .map(|(t, &b)| t[usize::from(b)])
        .sum()
}

/// Writes candidate `index` of block `block_index` as signs into `out` (one per value).
fn decode_candidate(shared: &SharedSeed, block_index: u64, index: u32, out: &mut [i8]) {
    let words = words_per_sign_candidate(out.len());
    let mut rng = shared.candidate_stream(block_index);
    rng.set_word_pos(u128::from(index) * words as u128);
    let mut bytes = vec![0u8; 4 * words];
    rng.fill_bytes(&mut bytes);
    for (i, s) in out.iter_mut().enumerate() {
        *s = if bytes[i / 8] >> (i % 8) & 1 == 1 {
            1
        } else {
            -1
        };
    }
}

/// The decoder of [`FairSignEncoder::encode`]: regenerates the selected candidate of every
/// block into `out` (one sign per value). An index `≥ K` (a corrupted message) is an error.
pub fn decode_fair_signs(
    partition: &Partition,
    k: usize,
    indices: &[u32],
    shared: &SharedSeed,
    out: &mut [i8],
) -> Result<()> {
    check_candidate_count(k)?;
    check_partition(partition, out.len())?;
    check_index_count(partition, indices)?;
    for ((m, block), &index) in partition.blocks().enumerate().zip(indices) {
        check_index(m as u64, index, k)?;
        decode_candidate(shared, m as u64, index, &mut out[block]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::klms::{importance_weights, normalise_log_weights};
    use crate::compression::{Categorical, drift_ratio};
    use crate::rng::{Purpose, stream, uniform};

    fn shared() -> SharedSeed {
        SharedSeed {
            seed: 11,
            round: 3,
            client: 5,
        }
    }

    /// Encodes `plus` with a fresh encoder and the test's selection stream.
    fn encode(plus: &[f64], partition: &Partition, k: usize, track: bool) -> SignMessage {
        FairSignEncoder::new()
            .encode(
                plus,
                partition,
                k,
                &shared(),
                &mut shared().selection_stream(),
                track,
            )
            .unwrap()
    }

    /// The candidates of a block as the generic coder would see them: bit `i` of candidate `k`.
    fn candidates(len: usize, k: usize, block: u64) -> Vec<i8> {
        let mut out = Vec::with_capacity(len * k);
        for index in 0..k {
            let mut signs = vec![0; len];
            decode_candidate(&shared(), block, index as u32, &mut signs);
            out.extend(signs);
        }
        out
    }

    #[test]
    fn weights_equal_the_generic_importance_weights() {
        // 21 values: two whole byte groups and a partial one, inside one 32-bit word.
        let mut rng = stream(1, 0, 0, Purpose::Experiment);
        let plus: Vec<f64> = (0..21).map(|_| 0.1 + 0.8 * uniform(&mut rng)).collect();
        let k = 64;
        let mut encoder = FairSignEncoder::new();
        encoder.build_tables(&plus, true);
        encoder.weigh_candidates(plus.len(), k, &mut shared().candidate_stream(0), true);
        normalise_log_weights(&mut encoder.weights);
        let q: Vec<[f64; 3]> = plus.iter().map(|&x| [1.0 - x, 0.0, x]).collect();
        let p = vec![[0.5, 0.0, 0.5]; plus.len()];
        let generic = importance_weights(
            &Categorical::new(&q).unwrap(),
            &Categorical::new(&p).unwrap(),
            0..plus.len(),
            &candidates(plus.len(), k, 0),
        )
        .unwrap();
        for (a, b) in encoder.weights.iter().zip(&generic) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    fn decoder_reproduces_the_encoded_signs_and_rejects_bad_indices() {
        let mut rng = stream(2, 0, 0, Purpose::Experiment);
        let plus: Vec<f64> = (0..300).map(|_| uniform(&mut rng)).collect();
        let partition = Partition::from_sizes(&[40, 33, 200, 27], 256).unwrap();
        let k = 1 << 10;
        let message = encode(&plus, &partition, k, false);
        let mut decoded = vec![0; plus.len()];
        decode_fair_signs(&partition, k, &message.indices, &shared(), &mut decoded).unwrap();
        assert_eq!(decoded, message.signs);
        assert!(decoded.iter().all(|&s| s == 1 || s == -1));
        let mut bad = message.indices.clone();
        bad[2] = k as u32;
        let e = decode_fair_signs(&partition, k, &bad, &shared(), &mut decoded).unwrap_err();
        assert!(e.to_string().contains("block 2 has index 1024"), "{e}");
    }

    #[test]
    fn certain_signs_are_always_selected() {
        // q puts all its mass on + for value 0 and on − for value 9: every candidate that
        // disagrees has weight 0, so with enough candidates the selection follows q there.
        let mut plus = vec![0.5; 12];
        plus[0] = 1.0;
        plus[9] = 0.0;
        let partition = Partition::fixed(12, 12).unwrap();
        let message = encode(&plus, &partition, 256, true);
        assert_eq!((message.signs[0], message.signs[9]), (1, -1));
    }

    #[test]
    fn tracked_drift_equals_the_ratio_of_conditional_means() {
        let mut rng = stream(3, 0, 0, Purpose::Experiment);
        let plus: Vec<f64> = (0..40).map(|_| 0.3 + 0.4 * uniform(&mut rng)).collect();
        let k = 32;
        let partition = Partition::fixed(40, 40).unwrap();
        let message = encode(&plus, &partition, k, true);
        let q: Vec<[f64; 3]> = plus.iter().map(|&x| [1.0 - x, 0.0, x]).collect();
        let p = vec![[0.5, 0.0, 0.5]; plus.len()];
        let cands = candidates(40, k, 0);
        let pi = importance_weights(
            &Categorical::new(&q).unwrap(),
            &Categorical::new(&p).unwrap(),
            0..40,
            &cands,
        )
        .unwrap();
        let mut means = vec![0.0; 40];
        for (y, w) in cands.chunks_exact(40).zip(&pi) {
            for (m, &s) in means.iter_mut().zip(y) {
                *m += w * f64::from(s);
            }
        }
        let target: Vec<f64> = plus.iter().map(|x| 2.0 * x - 1.0).collect();
        let want = drift_ratio(&means, &target, &[0.0; 40]).unwrap();
        let got = message.drift_ratio.unwrap();
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn rejects_bad_input() {
        let partition = Partition::fixed(4, 2).unwrap();
        let mut encoder = FairSignEncoder::new();
        let mut sel = shared().selection_stream();
        let e = encoder
            .encode(
                &[0.5, 1.5, 0.5, 0.5],
                &partition,
                4,
                &shared(),
                &mut sel,
                false,
            )
            .unwrap_err();
        assert!(e.to_string().contains("outside [0, 1]"), "{e}");
        let e = encoder
            .encode(&[0.5; 5], &partition, 4, &shared(), &mut sel, false)
            .unwrap_err();
        assert!(e.to_string().contains("covers 4 coordinates"), "{e}");
        let e = encoder
            .encode(&[0.5; 4], &partition, 0, &shared(), &mut sel, false)
            .unwrap_err();
        assert!(e.to_string().contains("K = 0"), "{e}");
    }
}
