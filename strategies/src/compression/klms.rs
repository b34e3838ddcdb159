//! The KLMS coder of one block and of a whole partitioned vector (docs/algorithms.md §4.1–4.2).
//!
//! Encoder (client): draw `K` candidates `y_1..y_K ~ p_I` from the shared stream of the block,
//! weigh them by `l_k = Σ_{j ∈ I} ln q_j(y_kj) − ln p_j(y_kj)`, normalise in log space
//! (`π(k) = exp(l_k − max l) / Σ exp(l_k' − max l)`), draw `k* ~ π` from the client's private
//! stream and send `k*` (or pick `k*` by ordered random coding, [`Selection::Ordered`]).
//! Decoder (server): regenerate the shared stream and read candidate `k*`. Only the index
//! travels; the sample never does.

use std::ops::Range;

use rand_distr::{Distribution, Gamma};
use serde::{Deserialize, Serialize};

use super::blocks::Partition;
use super::distribution::{ProductDistribution, check_block, check_same_len};
use crate::error::{Result, StrategyError};
use crate::rng::{ChaCha20Rng, Purpose, stream, uniform};

/// The largest number of candidates per block: an index must fit in a `u32`.
pub const MAX_CANDIDATES: usize = 1 << 32;

/// The shared seed `sd(t, c, ·)` of one client's uplink in one round (§4.2): client and server
/// both know `(seed, round, client)`, so both derive every block's candidate stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SharedSeed {
    /// The run's base seed, exchanged once with the model initialisation.
    pub seed: u64,
    /// The round `t`.
    pub round: u64,
    /// The client id `c`.
    pub client: u64,
}

impl SharedSeed {
    /// The candidate stream of block `m`: the ChaCha key of `(seed, round, client,
    /// Purpose::KlmsCandidates)` with the block index as the ChaCha stream id, so every block of
    /// every client and round has its own independent stream.
    pub fn candidate_stream(&self, block: u64) -> ChaCha20Rng {
        let mut rng = stream(self.seed, self.round, self.client, Purpose::KlmsCandidates);
        rng.set_stream(block);
        rng
    }

    /// The client's private stream for drawing `k*` (§4.1 step 3). Any independent stream
    /// serves; this one makes a client's uplink reproducible under a seed.
    pub fn selection_stream(&self) -> ChaCha20Rng {
        stream(self.seed, self.round, self.client, Purpose::KlmsSelection)
    }

    /// The client's private stream for estimating block `m`'s selection probabilities under
    /// ordered selection ([`select`]): apart from [`Self::selection_stream`], so that a client
    /// that measures its drift ratio picks the very candidates of one that does not.
    pub fn drift_estimate_stream(&self, block: u64) -> ChaCha20Rng {
        let mut rng = stream(
            self.seed,
            self.round,
            self.client,
            Purpose::KlmsDriftEstimate,
        );
        rng.set_stream(block);
        rng
    }
}

/// Checks `1 ≤ K ≤ 2³²`.
pub fn check_candidate_count(k: usize) -> Result<()> {
    if k == 0 || k > MAX_CANDIDATES {
        return Err(StrategyError::invalid(
            "number of candidates K",
            format!("K = {k}; expected 1 ≤ K ≤ 2^32"),
        ));
    }
    Ok(())
}

/// Normalises log-weights `l` in place into `π(k) = exp(l_k − max l) / Σ_k' exp(l_k' − max l)`
/// (§4.1 step 2, log-sum-exp). NaN counts as `−∞`. If some `l_k = +∞` (a candidate `p` cannot
/// draw but `q` can), those share the mass; if every `l_k = −∞` (no candidate is possible under
/// `q`, the mass loss of §4.1), `π` is uniform.
pub fn normalise_log_weights(l: &mut [f64]) {
    nan_as_impossible(l);
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::INFINITY {
        l.iter_mut()
            .for_each(|x| *x = f64::from(u8::from(*x == f64::INFINITY)));
    } else if max == f64::NEG_INFINITY {
        l.iter_mut().for_each(|x| *x = 1.0);
    } else {
        l.iter_mut().for_each(|x| *x = (*x - max).exp());
    }
    let total: f64 = l.iter().sum();
    l.iter_mut().for_each(|x| *x /= total);
}

/// A NaN log-weight counts as `−∞`: a candidate `q` cannot draw.
fn nan_as_impossible(l: &mut [f64]) {
    for x in l.iter_mut().filter(|x| x.is_nan()) {
        *x = f64::NEG_INFINITY;
    }
}

/// Draws `k ~ π` by inverting the cumulative sum with one 53-bit uniform; rounding beyond the
/// last cumulative value falls on the last index of positive weight.
pub fn draw_index(pi: &[f64], rng: &mut ChaCha20Rng) -> usize {
    let u = uniform(rng);
    let mut cumulative = 0.0;
    let mut last_positive = 0;
    for (k, &w) in pi.iter().enumerate() {
        if w > 0.0 {
            cumulative += w;
            last_positive = k;
            if u < cumulative {
                return k;
            }
        }
    }
    last_positive
}

/// How the encoder picks `k*` among a block's candidates (`[compression] selection`). The
/// candidates and the decoder are the same for both; only the choice and the index's code differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Selection {
    /// The paper's (§4.1): `k* ~ π`, the self-normalised importance weights (minimal random
    /// coding); every index costs `⌈log2 K⌉` bits.
    #[default]
    Importance,
    /// Ordered random coding (Theis & Yosri, "Algorithms for the communication of samples",
    /// ICML 2022): candidate `k` arrives at `T_k = E_1 + … + E_k` with private `E_i ~ Exp(1)`,
    /// and `k* = argmin_k T_k / w_k`: the Poisson functional representation, which picks an
    /// exact sample of `q` as `K → ∞`, cut at `K` candidates. Early candidates win more often
    /// (`log2 k*` is about the block's KL), so the index is sent in an exp-Golomb code of about
    /// `KL + 1` to `KL + 3` bits (measured) instead of `⌈log2 K⌉`, and with the same `K` the
    /// decoded sample carries more of the drift than importance sampling's.
    Ordered,
}

/// The arrival sequences behind [`select`]'s estimate of the ordered selection's
/// probabilities given the candidates (its drift ratio); the estimate's relative error on a
/// message of `B` blocks is about `1/√(32 B)`.
pub const ORDERED_REPEATS: usize = 32;

/// Picks `k*` from the candidates' log-weights `l` (overwritten) with the private `rng`. With
/// `probabilities` (a stream apart from `rng`), `l` then holds each candidate's probability of
/// being picked given the candidates: `π` exactly for [`Selection::Importance`]; for
/// [`Selection::Ordered`] the share of [`ORDERED_REPEATS`] arrival sequences, the first of them
/// the one that picked `k*` and the others drawn from `probabilities`, that pick it; `rng` is
/// used as without, so `k*` is the same either way. Without, `l`'s content is unspecified. NaN
/// weights count as `−∞`; when no candidate is possible under `q` both rules fall back to `p`
/// (uniform `π`, or the first arrival).
pub fn select(
    l: &mut [f64],
    selection: Selection,
    rng: &mut ChaCha20Rng,
    probabilities: Option<&mut ChaCha20Rng>,
) -> usize {
    match selection {
        Selection::Importance => {
            normalise_log_weights(l);
            draw_index(l, rng)
        }
        Selection::Ordered => {
            nan_as_impossible(l);
            if l.iter().all(|&x| x == f64::NEG_INFINITY) {
                l.iter_mut().for_each(|x| *x = 0.0);
            }
            let records = records(l);
            let chosen = first_arrival(&records, l, rng);
            if let Some(repeats) = probabilities {
                let mut counts = vec![0u32; l.len()];
                counts[chosen] += 1;
                for _ in 1..ORDERED_REPEATS {
                    counts[first_arrival(&records, l, repeats)] += 1;
                }
                for (x, c) in l.iter_mut().zip(counts) {
                    *x = f64::from(c) / ORDERED_REPEATS as f64;
                }
            }
            chosen
        }
    }
}

/// The candidates ordered random coding can pick: `k` beats an earlier `j` only if
/// `l_k − l_j > ln(T_k / T_j) > 0`, so only the strict prefix maxima of `l` can win (about
/// `ln K` of them when the weights are exchangeable, as the candidates are). The last is the
/// maximum.
fn records(l: &[f64]) -> Vec<usize> {
    let mut best = f64::NEG_INFINITY;
    let mut out = Vec::new();
    for (k, &x) in l.iter().enumerate() {
        if x > best {
            best = x;
            out.push(k);
        }
    }
    out
}

/// `argmin_k ln T_k − l_k` over the `records` of `l`, with the arrival times `T_k = E_1 + … +
/// E_k` drawn from `rng` only where they are needed: between two records `T` grows by a
/// `Gamma(gap, 1)`, the sum of the exponentials of the candidates in between. Stops once
/// `ln T_k − max l` can no longer win (the times only grow).
fn first_arrival(records: &[usize], l: &[f64], rng: &mut ChaCha20Rng) -> usize {
    let max = records.last().map_or(0.0, |&k| l[k]);
    let (mut t, mut arrived, mut best, mut chosen) = (0.0f64, 0, f64::INFINITY, 0);
    for &k in records {
        t += arrival_gap(k + 1 - arrived, rng);
        arrived = k + 1;
        let log_t = t.ln();
        if log_t - max >= best {
            break;
        }
        if log_t - l[k] < best {
            best = log_t - l[k];
            chosen = k;
        }
    }
    chosen
}

/// The sum of `n ≥ 1` independent `Exp(1)` draws: one exponential, or a `Gamma(n, 1)`.
fn arrival_gap(n: usize, rng: &mut ChaCha20Rng) -> f64 {
    if n == 1 {
        return -(1.0 - uniform(rng)).ln();
    }
    Gamma::new(n as f64, 1.0)
        .expect("a whole shape n ≥ 2 and scale 1 are valid")
        .sample(rng)
}

/// The normalised importance weights `π` of given candidates (§4.1 step 2): `candidates` holds
/// `K` candidates of the coordinates `block`, row after row.
pub fn importance_weights<D: ProductDistribution>(
    q: &D,
    p: &D,
    block: Range<usize>,
    candidates: &[D::Symbol],
) -> Result<Vec<f64>> {
    check_same_len(q, p)?;
    check_block(&block, q.len())?;
    let len = block.len();
    if candidates.is_empty() || candidates.len() % len != 0 {
        return Err(StrategyError::invalid(
            "candidates",
            format!(
                "{} values are not a whole, non-zero number of candidates of {len} coordinates",
                candidates.len()
            ),
        ));
    }
    let ratios: Vec<D::LogRatio> = block.map(|j| D::log_ratio(q, p, j)).collect();
    let mut pi: Vec<f64> = candidates
        .chunks_exact(len)
        .map(|y| log_weight::<D>(&ratios, y))
        .collect();
    normalise_log_weights(&mut pi);
    Ok(pi)
}

/// `l = Σ_j ln q_j(y_j) − ln p_j(y_j)` of one candidate.
#[inline]
fn log_weight<D: ProductDistribution>(ratios: &[D::LogRatio], y: &[D::Symbol]) -> f64 {
    ratios
        .iter()
        .zip(y)
        .map(|(r, &x)| D::eval_log_ratio(r, x))
        .sum()
}

/// The client side of KLMS, with scratch buffers reused across blocks and rounds.
#[derive(Debug)]
pub struct KlmsEncoder<D: ProductDistribution> {
    ratios: Vec<D::LogRatio>,
    candidates: Vec<D::Symbol>,
    weights: Vec<f64>,
    /// How `k*` is picked.
    selection: Selection,
    /// Whether to keep each coordinate's conditional mean ([`Self::tracking_means`]).
    track_means: bool,
    /// The conditional means of the last block encoded, then of the whole last message.
    block_means: Vec<f64>,
    means: Vec<f64>,
}

impl<D: ProductDistribution> Default for KlmsEncoder<D> {
    fn default() -> Self {
        Self {
            ratios: Vec::new(),
            candidates: Vec::new(),
            weights: Vec::new(),
            selection: Selection::Importance,
            track_means: false,
            block_means: Vec::new(),
            means: Vec::new(),
        }
    }
}

impl<D: ProductDistribution> KlmsEncoder<D> {
    /// An encoder with empty scratch buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// An encoder that also keeps, for every coordinate it encodes, the mean of the decoded
    /// value given the block's candidates, `Σ_k P(k* = k) y_k` ([`select`]): its expectation
    /// over the candidates is what the block transmits on average ([`drift_ratio`]). Costs
    /// `K · |block|` more multiply-adds a block.
    pub fn tracking_means() -> Self {
        Self {
            track_means: true,
            ..Self::default()
        }
    }

    /// This encoder, picking `k*` by `selection` (default [`Selection::Importance`]).
    pub fn with_selection(self, selection: Selection) -> Self {
        Self { selection, ..self }
    }

    /// The conditional means of the last block [`Self::encode_block`] encoded (empty unless
    /// [`Self::tracking_means`]).
    pub fn block_conditional_means(&self) -> &[f64] {
        &self.block_means
    }

    /// The conditional means of every coordinate of the last message [`Self::encode`] encoded
    /// (empty unless [`Self::tracking_means`]).
    pub fn conditional_means(&self) -> &[f64] {
        &self.means
    }

    /// Encodes the coordinates `block` (block number `block_index`) with `k` candidates: returns
    /// `k*` and writes the selected candidate `y_{k*}`, the value the server will decode, into
    /// `selected`. Cost: `K · |block|` draws from `p` and log-ratio evaluations, plus
    /// `|block|` log-ratio preparations.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_block(
        &mut self,
        q: &D,
        p: &D,
        block: Range<usize>,
        block_index: u64,
        k: usize,
        shared: &SharedSeed,
        selection: &mut ChaCha20Rng,
        selected: &mut [D::Symbol],
    ) -> Result<u32> {
        check_same_len(q, p)?;
        check_block(&block, q.len())?;
        check_candidate_count(k)?;
        check_output_len(selected.len(), block.len())?;
        let len = block.len();
        self.ratios.clear();
        self.ratios
            .extend(block.clone().map(|j| D::log_ratio(q, p, j)));
        self.candidates.clear();
        self.candidates.resize(k * len, D::Symbol::default());
        self.weights.clear();
        let mut rng = shared.candidate_stream(block_index);
        for candidate in self.candidates.chunks_exact_mut(len) {
            let l = p.sample_and_weigh(block.clone(), &mut rng, &self.ratios, candidate);
            self.weights.push(l);
        }
        let mut repeats = self
            .track_means
            .then(|| shared.drift_estimate_stream(block_index));
        let index = select(
            &mut self.weights,
            self.selection,
            selection,
            repeats.as_mut(),
        );
        if self.track_means {
            self.block_means.clear();
            self.block_means.resize(len, 0.0);
            for (candidate, &w) in self.candidates.chunks_exact(len).zip(&self.weights) {
                if w > 0.0 {
                    for (m, &y) in self.block_means.iter_mut().zip(candidate) {
                        *m += w * D::value(y);
                    }
                }
            }
        }
        selected.copy_from_slice(&self.candidates[index * len..(index + 1) * len]);
        Ok(index as u32)
    }

    /// Encodes every block of `partition` with `k` candidates each; block `m` uses the
    /// candidate stream `m`. Returns the indices `k*_m` and writes the selected sample (the
    /// server's decoded vector) into `selected` (length `d`).
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &mut self,
        q: &D,
        p: &D,
        partition: &Partition,
        k: usize,
        shared: &SharedSeed,
        selection: &mut ChaCha20Rng,
        selected: &mut [D::Symbol],
    ) -> Result<Vec<u32>> {
        check_partition(partition, q.len())?;
        check_output_len(selected.len(), q.len())?;
        self.means.clear();
        let mut indices = Vec::with_capacity(partition.num_blocks());
        for (m, block) in partition.blocks().enumerate() {
            let out = &mut selected[block.clone()];
            indices.push(self.encode_block(q, p, block, m as u64, k, shared, selection, out)?);
            if self.track_means {
                self.means.extend_from_slice(&self.block_means);
            }
        }
        Ok(indices)
    }
}

/// The drift ratio of a KLMS message: how much of the move from `p`'s mean to `q`'s mean the
/// decoded sample carries, `ρ = ⟨m − μ_p, μ_q − μ_p⟩ / ‖μ_q − μ_p‖²` with `m` the transmitted
/// mean (the encoder's conditional mean, or an average of decoded samples). Self-normalised
/// importance sampling shrinks the drift: to first order `ρ ≈ 1 − E_p[w²]/K` per block
/// (`w = q/p`; `E_p[w²] ≈ 1` for blocks of little KL, so `ρ ≈ 1 − 1/K`; Theorem 4.1 asks
/// `K = exp(KL + r)`). `None` when `q` and `p` have the same mean (no drift to carry).
pub fn drift_ratio(transmitted: &[f64], target: &[f64], prior: &[f64]) -> Option<f64> {
    let (mut along, mut norm) = (0.0, 0.0);
    for ((&m, &t), &b) in transmitted.iter().zip(target).zip(prior) {
        along += (m - b) * (t - b);
        norm += (t - b) * (t - b);
    }
    (norm > 0.0 && along.is_finite()).then(|| along / norm)
}

/// Decodes one block (§4.1, decoder): regenerates candidate `index` of block `block_index` from
/// the shared stream into `out`. The stream is advanced straight to that candidate (every
/// candidate consumes a fixed number of words), so decoding costs `|block|` draws, not `K·|block|`.
/// An index `≥ K` (a corrupted message) is an error.
pub fn decode_block<D: ProductDistribution>(
    p: &D,
    block: Range<usize>,
    block_index: u64,
    k: usize,
    index: u32,
    shared: &SharedSeed,
    out: &mut [D::Symbol],
) -> Result<()> {
    check_block(&block, p.len())?;
    check_candidate_count(k)?;
    check_output_len(out.len(), block.len())?;
    check_index(block_index, index, k)?;
    let mut rng = shared.candidate_stream(block_index);
    let words = u128::from(index) * u128::from(D::words_per_candidate(block.len()));
    rng.set_word_pos(words);
    p.sample_block(block, &mut rng, out);
    Ok(())
}

/// Decodes every block of `partition` from its index into `out` (length `d`).
pub fn decode<D: ProductDistribution>(
    p: &D,
    partition: &Partition,
    k: usize,
    indices: &[u32],
    shared: &SharedSeed,
    out: &mut [D::Symbol],
) -> Result<()> {
    check_partition(partition, p.len())?;
    check_output_len(out.len(), p.len())?;
    check_index_count(partition, indices)?;
    for ((m, block), &index) in partition.blocks().enumerate().zip(indices) {
        let slot = &mut out[block.clone()];
        decode_block(p, block, m as u64, k, index, shared, slot)?;
    }
    Ok(())
}

/// Checks that block `block_index`'s candidate index is below `K` (a corrupted message is not).
pub(crate) fn check_index(block_index: u64, index: u32, k: usize) -> Result<()> {
    if index as usize >= k {
        return Err(StrategyError::invalid(
            "candidate index",
            format!("block {block_index} has index {index}, but K = {k}"),
        ));
    }
    Ok(())
}

/// Checks that a message has one candidate index per block.
pub(crate) fn check_index_count(partition: &Partition, indices: &[u32]) -> Result<()> {
    if indices.len() != partition.num_blocks() {
        return Err(StrategyError::invalid(
            "candidate indices",
            format!(
                "{} indices for {} blocks",
                indices.len(),
                partition.num_blocks()
            ),
        ));
    }
    Ok(())
}

fn check_output_len(got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(StrategyError::invalid(
            "output buffer",
            format!("{got} slots for {want} coordinates"),
        ));
    }
    Ok(())
}

pub(crate) fn check_partition(partition: &Partition, len: usize) -> Result<()> {
    if partition.len() != len {
        return Err(StrategyError::invalid(
            "partition",
            format!(
                "covers {} coordinates but the distributions have {len}",
                partition.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::distribution::{Bernoulli, Gaussian};

    #[test]
    fn log_sum_exp_is_stable_for_long_blocks() {
        // Linear-space products underflow at l ≈ −745; log space does not.
        let mut l = vec![-2000.0, -2001.0, -2000.0 - 2f64.ln()];
        normalise_log_weights(&mut l);
        let e = (-1f64).exp();
        let want = [1.0 / (1.5 + e), e / (1.5 + e), 0.5 / (1.5 + e)];
        for (got, want) in l.iter().zip(want) {
            assert!((got - want).abs() < 1e-12);
        }
    }

    #[test]
    fn impossible_candidates_fall_back_to_uniform() {
        let mut l = vec![f64::NEG_INFINITY; 4];
        normalise_log_weights(&mut l);
        assert_eq!(l, vec![0.25; 4]);
        let mut l = vec![0.0, f64::INFINITY, f64::NAN];
        normalise_log_weights(&mut l);
        assert_eq!(l, vec![0.0, 1.0, 0.0]);
    }

    /// The ordered selection draws arrival times only at the records of `l` (Gamma gaps in
    /// between); it must pick each candidate as often as the definition, a scan of all `K`
    /// exponential arrivals: 40 000 draws each, frequencies within 0.015 (about 4 standard
    /// errors). `l` has two records besides the first, a non-record candidate (index 3) that
    /// can never win, and an impossible one.
    #[test]
    fn ordered_selection_picks_as_the_full_scan_does() {
        let l = [0.2, -1.0, 1.5, 1.0, f64::NEG_INFINITY, 2.5, 0.0];
        let n = 40_000;
        let mut fast = [0.0; 7];
        let mut rng = stream(3, 0, 0, Purpose::Experiment);
        for _ in 0..n {
            let mut w = l;
            fast[select(&mut w, Selection::Ordered, &mut rng, None)] += 1.0 / n as f64;
        }
        let mut scan = [0.0; 7];
        let mut rng = stream(4, 0, 0, Purpose::Experiment);
        for _ in 0..n {
            let (mut t, mut best, mut chosen) = (0.0f64, f64::INFINITY, 0);
            for (k, &lk) in l.iter().enumerate() {
                t -= (1.0 - uniform(&mut rng)).ln();
                if t.ln() - lk < best {
                    best = t.ln() - lk;
                    chosen = k;
                }
            }
            scan[chosen] += 1.0 / n as f64;
        }
        for k in 0..7 {
            assert!(
                (fast[k] - scan[k]).abs() < 0.015,
                "{k}: {fast:?} vs {scan:?}"
            );
        }
        assert_eq!(records(&l), vec![0, 2, 5]);
        assert_eq!(fast[3] + fast[4] + fast[1] + fast[6], 0.0);
        // The estimated probabilities sum to one and put mass only on records.
        let mut w = l;
        let mut rng = stream(5, 0, 0, Purpose::Experiment);
        let mut repeats = stream(6, 0, 0, Purpose::Experiment);
        let chosen = select(&mut w, Selection::Ordered, &mut rng, Some(&mut repeats));
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!([1, 3, 4, 6].iter().all(|&k| w[k] == 0.0));
        // Estimating the probabilities leaves the choice and the private stream as they were.
        let (mut plain, mut rng_plain) = (l, stream(5, 0, 0, Purpose::Experiment));
        assert_eq!(
            select(&mut plain, Selection::Ordered, &mut rng_plain, None),
            chosen
        );
        assert_eq!(rng_plain.get_word_pos(), rng.get_word_pos());
    }

    #[test]
    fn draw_index_never_returns_zero_weight() {
        let mut rng = stream(1, 2, 3, Purpose::Experiment);
        for _ in 0..1000 {
            assert_eq!(draw_index(&[0.0, 1.0, 0.0], &mut rng), 1);
        }
    }

    /// Skipping to the chosen candidate gives the same values as generating all of them.
    #[test]
    fn decoder_skip_equals_sequential_generation() {
        let means = [0.1, -0.4, 2.0];
        let sigmas = [1.0, 0.5, 2.0];
        let g = Gaussian::new(&means, &sigmas).unwrap();
        let probs = [0.3, 0.9, 0.5, 0.01, 0.7];
        let b = Bernoulli::new(&probs).unwrap();
        let shared = SharedSeed {
            seed: 9,
            round: 4,
            client: 2,
        };
        for k_star in 0..6u32 {
            let mut rng = shared.candidate_stream(7);
            let mut y = [0.0; 3];
            for _ in 0..=k_star {
                g.sample_block(0..3, &mut rng, &mut y);
            }
            let mut z = [0.0; 3];
            decode_block(&g, 0..3, 7, 6, k_star, &shared, &mut z).unwrap();
            assert_eq!(y.map(f64::to_bits), z.map(f64::to_bits));

            let mut rng = shared.candidate_stream(7);
            let mut y = [false; 5];
            for _ in 0..=k_star {
                b.sample_block(0..5, &mut rng, &mut y);
            }
            let mut z = [false; 5];
            decode_block(&b, 0..5, 7, 6, k_star, &shared, &mut z).unwrap();
            assert_eq!(y, z);
        }
    }

    #[test]
    fn rejects_bad_input() {
        let probs = [0.5; 4];
        let b = Bernoulli::new(&probs).unwrap();
        let short = [0.5; 3];
        let c = Bernoulli::new(&short).unwrap();
        let shared = SharedSeed {
            seed: 1,
            round: 1,
            client: 1,
        };
        let mut sel = shared.selection_stream();
        let mut enc = KlmsEncoder::new();
        let mut out = [false; 4];
        assert!(
            enc.encode_block(&b, &b, 0..4, 0, 0, &shared, &mut sel, &mut out)
                .is_err()
        );
        assert!(
            enc.encode_block(&b, &b, 2..2, 0, 4, &shared, &mut sel, &mut out[..0])
                .is_err()
        );
        assert!(
            enc.encode_block(&b, &b, 0..5, 0, 4, &shared, &mut sel, &mut out)
                .is_err()
        );
        assert!(
            enc.encode_block(&c, &b, 0..3, 0, 4, &shared, &mut sel, &mut out[..3])
                .is_err()
        );
        assert!(decode_block(&b, 0..4, 0, 4, 4, &shared, &mut out).is_err());
        assert!(decode_block(&b, 0..4, 0, 4, 3, &shared, &mut out[..2]).is_err());
    }
}
