//! Vectors of `bits`-bit values packed into exactly `⌈len · bits / 8⌉` bytes, little-endian,
//! for the masked input: the largest message of a session costs its information content
//! rather than bincode's variable-length integers (5 bytes for a 32-bit value, 9 for 64).
//! Least significant bit first through `fedshard-bits`, the bit writer and reader the uplink
//! codecs use.

use fedshard_bits::{BitReader, BitWriter};

/// The bytes of `len` values of `bits` bits.
pub fn packed_len(len: usize, bits: u32) -> usize {
    len.saturating_mul(bits as usize).div_ceil(8)
}

/// Packs `values`, each below `2^bits` (`1 ≤ bits ≤ 64`; higher bits are dropped).
pub fn pack(values: &[u64], bits: u32) -> Vec<u8> {
    let mut writer = BitWriter::with_capacity(packed_len(values.len(), bits));
    for &value in values {
        writer.bits_u64(value & low_bits(bits), bits);
    }
    writer.finish()
}

/// The `len` values packed in `bytes`, or `None` when `bytes` has the wrong length or sets
/// padding bits (so every vector has exactly one encoding).
pub fn unpack(bytes: &[u8], bits: u32, len: usize) -> Option<Vec<u64>> {
    if bytes.len() != packed_len(len, bits) || !(1..=64).contains(&bits) {
        return None;
    }
    let mut reader = BitReader::new(bytes);
    let values = (0..len)
        .map(|_| reader.bits_u64(bits).ok())
        .collect::<Option<Vec<u64>>>()?;
    reader.finish().ok()?;
    Some(values)
}

fn low_bits(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_at_every_width() {
        for bits in 1..=64u32 {
            let values: Vec<u64> = (0..13u64)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) & low_bits(bits))
                .collect();
            let bytes = pack(&values, bits);
            assert_eq!(bytes.len(), packed_len(13, bits), "bits {bits}");
            assert_eq!(unpack(&bytes, bits, 13), Some(values), "bits {bits}");
        }
    }

    /// The bytes the hand-written packer sent before `fedshard-bits` wrote them: 1, 2, 3 in
    /// three bits each, least significant first, are `0b11_010_001` and one bit of 0.
    #[test]
    fn the_packed_bytes_stay_least_significant_bit_first() {
        assert_eq!(pack(&[1, 2, 3], 3), [0b1101_0001, 0]);
        assert_eq!(pack(&[0x0102, 0x0304], 16), [2, 1, 4, 3]);
    }

    #[test]
    fn wrong_lengths_and_set_padding_are_refused() {
        let bytes = pack(&[1, 2, 3], 3); // 9 bits in 2 bytes, 7 of padding
        assert_eq!(unpack(&bytes, 3, 3), Some(vec![1, 2, 3]));
        assert_eq!(unpack(&bytes[..1], 3, 3), None);
        let mut padded = bytes.clone();
        padded[1] |= 0x80;
        assert_eq!(unpack(&padded, 3, 3), None);
    }
}
