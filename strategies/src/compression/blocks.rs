//! How a flattened message of `d` coordinates is cut into KLMS blocks (docs/algorithms.md §4.3–4.4):
//! fixed blocks of `S` with a K schedule, adaptive KL-targeted blocks (the clean partition rule),
//! the server's aggregation of the clients' boundaries, and the re-partition band.

use std::ops::Range;

use crate::error::{Result, StrategyError};

/// Coordinates `0..len` cut into consecutive non-empty blocks, stored as block ends (exclusive),
/// the last of which is `len`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Partition {
    ends: Vec<usize>,
}

/// How much the running KL may exceed `D_target` through rounding alone (relative).
const KL_SLACK: f64 = 1e-12;

impl Partition {
    /// Blocks from their exclusive ends: strictly increasing, the first positive, the last the
    /// vector length. This is how a boundary list received from a client is checked.
    pub fn from_ends(ends: Vec<usize>) -> Result<Self> {
        if ends.is_empty() {
            return Err(StrategyError::invalid(
                "block boundaries",
                "no blocks; a partition of a non-empty vector has at least one",
            ));
        }
        let mut previous = 0;
        for (m, &end) in ends.iter().enumerate() {
            if end <= previous {
                return Err(StrategyError::invalid(
                    "block boundaries",
                    format!(
                        "block {m} ends at {end}, not after {previous}: blocks must be non-empty and in order"
                    ),
                ));
            }
            previous = end;
        }
        Ok(Self { ends })
    }

    /// Blocks of the given sizes, each in `1..=max_block_size` (the wire form of §4.4 step 1,
    /// one size per block).
    pub fn from_sizes(sizes: &[usize], max_block_size: usize) -> Result<Self> {
        if let Some(m) = sizes.iter().position(|&s| s == 0 || s > max_block_size) {
            return Err(StrategyError::invalid(
                "block sizes",
                format!(
                    "block {m} has size {}, expected 1..={max_block_size}",
                    sizes[m]
                ),
            ));
        }
        let ends = sizes
            .iter()
            .scan(0, |end, &s| {
                *end += s;
                Some(*end)
            })
            .collect();
        Self::from_ends(ends)
    }

    /// Fixed-KLMS blocks `[(m−1)S, mS)`, `M = ⌈d/S⌉`, the last possibly shorter (§4.3).
    pub fn fixed(len: usize, block_size: usize) -> Result<Self> {
        if len == 0 || block_size == 0 {
            return Err(StrategyError::invalid(
                "fixed blocks",
                format!("length {len} and block size {block_size} must both be positive"),
            ));
        }
        let ends = (1..=len.div_ceil(block_size))
            .map(|m| (m * block_size).min(len))
            .collect();
        Ok(Self { ends })
    }

    /// Adaptive-KLMS blocks by the clean partition rule of §4.4: scanning left to right, a block
    /// is the maximal run whose KL sum stays `≤ D_target` and whose length stays
    /// `≤ max_block_size`; a coordinate with `D_j > D_target` forms its own block. `kl_bits` are
    /// the per-coordinate `D_j` in bits; `+∞` is allowed (that coordinate is a block of its own).
    pub fn adaptive(kl_bits: &[f64], target_bits: f64, max_block_size: usize) -> Result<Self> {
        if kl_bits.is_empty() {
            return Err(StrategyError::invalid(
                "per-coordinate KL",
                "empty; nothing to partition",
            ));
        }
        if !(target_bits > 0.0 && target_bits.is_finite()) {
            return Err(StrategyError::invalid(
                "D_target",
                format!("{target_bits}; expected a finite positive number of bits"),
            ));
        }
        if max_block_size == 0 {
            return Err(StrategyError::invalid("MAX_BLOCK_SIZE", "0; expected ≥ 1"));
        }
        check_kl(kl_bits)?;
        let limit = target_bits * (1.0 + KL_SLACK);
        let mut ends = Vec::new();
        let (mut start, mut running) = (0, 0.0);
        for (j, &kl) in kl_bits.iter().enumerate() {
            let kl = kl.max(0.0);
            if j > start && (running + kl > limit || j - start == max_block_size) {
                ends.push(j);
                (start, running) = (j, 0.0);
            }
            running += kl;
        }
        ends.push(kl_bits.len());
        Ok(Self { ends })
    }

    /// The server's Aggregate-Block-Locations (§4.4 step 2): for each position `m` up to the
    /// largest block count, the ceiling of the mean `m`-th block end over the clients that have
    /// at least `m + 1` blocks, kept only if strictly larger than the previous kept end; the last
    /// block ends at `d`. Blocks longer than `max_block_size` are then cut every
    /// `max_block_size` coordinates so the result can be sent in the boundary format (a design
    /// choice of fedshard: averaging can widen a block beyond the cap).
    pub fn aggregate(partitions: &[Partition], max_block_size: usize) -> Result<Self> {
        let Some(first) = partitions.first() else {
            return Err(StrategyError::invalid(
                "client partitions",
                "none received; nothing to aggregate",
            ));
        };
        if max_block_size == 0 {
            return Err(StrategyError::invalid("MAX_BLOCK_SIZE", "0; expected ≥ 1"));
        }
        let len = first.len();
        if let Some(c) = partitions.iter().position(|p| p.len() != len) {
            return Err(StrategyError::invalid(
                "client partitions",
                format!(
                    "partition {c} covers {} coordinates, the first covers {len}",
                    partitions[c].len()
                ),
            ));
        }
        let most = partitions
            .iter()
            .map(Partition::num_blocks)
            .max()
            .unwrap_or(1);
        let mut averaged: Vec<usize> = Vec::with_capacity(most);
        for m in 0..most {
            let (sum, count) = partitions
                .iter()
                .filter_map(|p| p.ends.get(m))
                .fold((0u128, 0u128), |(s, c), &e| (s + e as u128, c + 1));
            let end = sum.div_ceil(count) as usize;
            if averaged.last().is_none_or(|&last| end > last) {
                averaged.push(end.min(len));
            }
        }
        averaged.dedup();
        if let Some(last) = averaged.last_mut() {
            *last = len;
        }
        let mut ends = Vec::with_capacity(averaged.len());
        let mut start = 0;
        for end in averaged {
            while end - start > max_block_size {
                start += max_block_size;
                ends.push(start);
            }
            ends.push(end);
            start = end;
        }
        Self::from_ends(ends)
    }

    /// The number of coordinates `d`.
    pub fn len(&self) -> usize {
        *self
            .ends
            .last()
            .expect("a partition has at least one block")
    }

    /// Always false: a partition has at least one block of at least one coordinate.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The number of blocks `M`.
    pub fn num_blocks(&self) -> usize {
        self.ends.len()
    }

    /// The exclusive end of every block.
    pub fn ends(&self) -> &[usize] {
        &self.ends
    }

    /// The blocks as coordinate ranges, in order.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = Range<usize>> + '_ {
        (0..self.ends.len()).map(|m| {
            let start = if m == 0 { 0 } else { self.ends[m - 1] };
            start..self.ends[m]
        })
    }

    /// The size of every block.
    pub fn sizes(&self) -> Vec<usize> {
        self.blocks().map(|b| b.len()).collect()
    }

    /// `KL_m = Σ_{j ∈ block m} D_j` of every block, in bits.
    pub fn block_kl_bits(&self, kl_bits: &[f64]) -> Result<Vec<f64>> {
        if kl_bits.len() != self.len() {
            return Err(StrategyError::invalid(
                "per-coordinate KL",
                format!(
                    "{} values for a partition of {} coordinates",
                    kl_bits.len(),
                    self.len()
                ),
            ));
        }
        check_kl(kl_bits)?;
        Ok(self.blocks().map(|b| kl_bits[b].iter().sum()).collect())
    }

    /// `D̄ = (1/M) Σ_m KL_m`, the mean KL per block a client reports (§4.4 step 3), in bits.
    pub fn mean_block_kl_bits(&self, kl_bits: &[f64]) -> Result<f64> {
        let blocks = self.block_kl_bits(kl_bits)?;
        Ok(blocks.iter().sum::<f64>() / blocks.len() as f64)
    }
}

fn check_kl(kl_bits: &[f64]) -> Result<()> {
    if let Some(j) = kl_bits.iter().position(|&d| d.is_nan() || d < -1e-9) {
        return Err(StrategyError::invalid(
            "per-coordinate KL",
            format!("coordinate {j} has KL {}; expected ≥ 0", kl_bits[j]),
        ));
    }
    Ok(())
}

/// The band `[D_min, D_max]` that the mean KL per block must stay in before the blocks are cut
/// again (§4.4 step 3); defaults `D_min = D_target/3`, `D_max = 1.5 D_target`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KlBand {
    /// `D_min`, bits.
    pub min_bits: f64,
    /// `D_max`, bits.
    pub max_bits: f64,
}

impl KlBand {
    /// The recommended band `[D_target/3, 1.5 D_target]`.
    pub fn around(target_bits: f64) -> Self {
        Self {
            min_bits: target_bits / 3.0,
            max_bits: 1.5 * target_bits,
        }
    }

    /// Whether the mean KL `D̄^(t)` (the mean over clients of their reports) left the band, so
    /// the next round sets `UPDATE` and re-partitions. A NaN mean also triggers.
    pub fn needs_repartition(&self, mean_kl_bits: f64) -> bool {
        !(self.min_bits..=self.max_bits).contains(&mean_kl_bits)
    }
}

/// The number of candidates per block of a KL target of `D_target` bits: `K = 2^D_target`
/// (§4.1, practical rule), so each block's index costs exactly `D_target` bits.
pub fn candidates_for_target(target_bits: u32) -> Result<usize> {
    if target_bits == 0 || target_bits > 32 {
        return Err(StrategyError::invalid(
            "D_target",
            format!("{target_bits} bits; expected 1..=32"),
        ));
    }
    Ok(1usize << target_bits)
}

/// A K schedule over rounds (§4.3): fixed, or the reference's warm-up list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KSchedule {
    /// The same K every round.
    Constant(usize),
    /// `warm_up[t]` in round `t` (1-based rounds index the list directly, so rounds `1..` use
    /// entries from the second on), then `after` once the list is exhausted.
    WarmUp {
        /// K per round, indexed by the round number.
        warm_up: Vec<usize>,
        /// K from round `warm_up.len()` on.
        after: usize,
    },
}

impl KSchedule {
    /// The reference's FedPM/QSGD/SignSGD schedule: `(8,8,8,8,8,7,6,5,4,3)` then 2.
    pub fn reference() -> Self {
        Self::WarmUp {
            warm_up: vec![8, 8, 8, 8, 8, 7, 6, 5, 4, 3],
            after: 2,
        }
    }

    /// K in round `round`; an error if the schedule holds a zero.
    pub fn candidates(&self, round: u64) -> Result<usize> {
        let k = match self {
            Self::Constant(k) => *k,
            Self::WarmUp { warm_up, after } => usize::try_from(round)
                .ok()
                .and_then(|t| warm_up.get(t).copied())
                .unwrap_or(*after),
        };
        super::klms::check_candidate_count(k)?;
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_blocks_cover_the_vector() {
        let p = Partition::fixed(10, 4).unwrap();
        assert_eq!(p.ends(), &[4, 8, 10]);
        assert_eq!(p.sizes(), vec![4, 4, 2]);
        assert!(Partition::fixed(0, 4).is_err());
        assert!(Partition::fixed(4, 0).is_err());
    }

    #[test]
    fn from_ends_and_sizes_reject_malformed_lists() {
        assert!(Partition::from_ends(vec![]).is_err());
        assert!(Partition::from_ends(vec![0, 3]).is_err());
        assert!(Partition::from_ends(vec![3, 3]).is_err());
        assert!(Partition::from_sizes(&[2, 0], 4).is_err());
        assert!(Partition::from_sizes(&[2, 5], 4).is_err());
        assert_eq!(Partition::from_sizes(&[2, 4], 4).unwrap().ends(), &[2, 6]);
    }

    #[test]
    fn adaptive_rejects_bad_input() {
        assert!(Partition::adaptive(&[], 2.0, 4).is_err());
        assert!(Partition::adaptive(&[0.1], 0.0, 4).is_err());
        assert!(Partition::adaptive(&[0.1], 2.0, 0).is_err());
        assert!(Partition::adaptive(&[f64::NAN], 2.0, 4).is_err());
        assert!(Partition::adaptive(&[-1.0], 2.0, 4).is_err());
        assert_eq!(
            Partition::adaptive(&[0.1, f64::INFINITY, 0.1], 2.0, 4)
                .unwrap()
                .ends(),
            &[1, 2, 3]
        );
    }

    /// Averaged ends, ceilings, strictly increasing, last at d, cap enforced.
    #[test]
    fn aggregation_of_boundaries() {
        let a = Partition::from_ends(vec![3, 7, 10]).unwrap();
        let b = Partition::from_ends(vec![4, 10]).unwrap();
        // m = 0: ⌈3.5⌉ = 4; m = 1: ⌈8.5⌉ = 9; m = 2: 10.
        assert_eq!(
            Partition::aggregate(&[a.clone(), b.clone()], 8)
                .unwrap()
                .ends(),
            &[4, 9, 10]
        );
        // Cap 3 cuts 4..9 into 4..7, 7..9 and 0..4 into 0..3, 3..4.
        assert_eq!(
            Partition::aggregate(&[a, b], 3).unwrap().ends(),
            &[3, 4, 7, 9, 10]
        );
        let c = Partition::from_ends(vec![1, 2, 3, 10]).unwrap();
        let d = Partition::from_ends(vec![9, 10]).unwrap();
        // m = 0: 5; m = 1: ⌈6⌉ = 6; m = 2: 3 (dropped); m = 3: 10.
        assert_eq!(
            Partition::aggregate(&[c, d], 16).unwrap().ends(),
            &[5, 6, 10]
        );
        assert!(Partition::aggregate(&[], 16).is_err());
    }

    #[test]
    fn band_and_schedule() {
        let band = KlBand::around(3.0);
        assert!(!band.needs_repartition(1.0));
        assert!(!band.needs_repartition(4.5));
        assert!(band.needs_repartition(0.99));
        assert!(band.needs_repartition(4.51));
        assert!(band.needs_repartition(f64::NAN));
        let s = KSchedule::reference();
        let ks: Vec<usize> = (1..=11).map(|t| s.candidates(t).unwrap()).collect();
        assert_eq!(ks, vec![8, 8, 8, 8, 7, 6, 5, 4, 3, 2, 2]);
        assert!(KSchedule::Constant(0).candidates(1).is_err());
        assert_eq!(candidates_for_target(2).unwrap(), 4);
        assert!(candidates_for_target(0).is_err());
    }
}
