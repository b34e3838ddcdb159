//! Exact uplink bits of a KLMS message (docs/algorithms.md §4.5): what the serialized payload
//! costs, not an entropy estimate. Every count is an integer number of bits on the wire.

use super::klms::check_candidate_count;
use crate::error::{Result, StrategyError};

/// The bits of the mean-KL report `D̄^(t,c)` an adaptive client sends every round (§4.4 step 3):
/// one `f32`.
pub const KL_REPORT_BITS: u64 = 32;

/// The bits of one candidate index in `[0, K)`: `⌈log2 K⌉` (0 for `K = 1`). For `K = 2^D` this
/// is exactly `D` (§4.1); the reference's fractional `log2 K` for other K is not a wire format.
pub fn index_bits(k: usize) -> Result<u64> {
    check_candidate_count(k)?;
    Ok(u64::from(k.next_power_of_two().trailing_zeros()))
}

/// The bits of one block boundary, sent as the block's size minus one in
/// `⌈log2 MAX_BLOCK_SIZE⌉` bits (§4.4 step 1: `log2(MAX_BLOCK_SIZE)` per block).
pub fn boundary_bits(max_block_size: usize) -> Result<u64> {
    if max_block_size == 0 {
        return Err(StrategyError::invalid("MAX_BLOCK_SIZE", "0; expected ≥ 1"));
    }
    Ok(u64::from(
        max_block_size.next_power_of_two().trailing_zeros(),
    ))
}

/// The uplink of one client in one round, split by what the bits carry (§4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UplinkBits {
    /// `M ⌈log2 K⌉`: the candidate indices.
    pub indices: u64,
    /// `1{UPDATE} M ⌈log2 MAX_BLOCK_SIZE⌉`: the block boundaries, when they are sent.
    pub boundaries: u64,
    /// 32 in adaptive mode (the mean-KL report), 0 in fixed mode.
    pub kl_report: u64,
    /// Side scalars of the host method (a QSGD norm: 32 per tensor).
    pub side: u64,
}

impl UplinkBits {
    /// All the bits.
    pub fn total(&self) -> u64 {
        self.indices + self.boundaries + self.kl_report + self.side
    }

    /// Bits per parameter, `bits / d` (32 = uncompressed `f32`).
    pub fn bits_per_parameter(&self, num_parameters: usize) -> Result<f64> {
        if num_parameters == 0 {
            return Err(StrategyError::invalid(
                "number of parameters",
                "0; bits per parameter needs d ≥ 1",
            ));
        }
        Ok(self.total() as f64 / num_parameters as f64)
    }
}

/// What a KLMS uplink carries besides the indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UplinkLayout {
    /// `Some(MAX_BLOCK_SIZE)` when the client sends its block boundaries (`UPDATE` rounds).
    pub boundaries: Option<usize>,
    /// Whether the adaptive mean-KL report is sent.
    pub kl_report: bool,
    /// Bits of the host method's side scalars.
    pub side_bits: u64,
}

/// The exact bits of an uplink of `num_blocks` indices of `K` candidates each, plus what
/// `layout` adds (§4.5), with the paper's importance sampling (`⌈log2 K⌉` bits an index); an
/// ordered selection's indices have a variable-length code whose bits depend on the indices
/// drawn (`protocol::uplink::index_code_order`).
pub fn uplink_bits(num_blocks: usize, k: usize, layout: &UplinkLayout) -> Result<UplinkBits> {
    let m = num_blocks as u64;
    Ok(UplinkBits {
        indices: m * index_bits(k)?,
        boundaries: match layout.boundaries {
            Some(max_block_size) => m * boundary_bits(max_block_size)?,
            None => 0,
        },
        kl_report: if layout.kl_report { KL_REPORT_BITS } else { 0 },
        side: layout.side_bits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_and_boundary_bits() {
        let bits: Vec<u64> = [1, 2, 3, 4, 5, 8, 11, 16, 76]
            .iter()
            .map(|&k| index_bits(k).unwrap())
            .collect();
        assert_eq!(bits, vec![0, 1, 2, 2, 3, 3, 4, 4, 7]);
        assert!(index_bits(0).is_err());
        assert_eq!(boundary_bits(256).unwrap(), 8);
        assert_eq!(boundary_bits(16).unwrap(), 4);
        assert_eq!(boundary_bits(100).unwrap(), 7);
        assert!(boundary_bits(0).is_err());
        assert!(UplinkBits::default().bits_per_parameter(0).is_err());
    }
}
