//! Vectors of `bits`-bit values packed into exactly `⌈len · bits / 8⌉` bytes, little-endian,
//! for the masked input: the largest message of a session costs its information content
//! rather than bincode's variable-length integers (5 bytes for a 32-bit value, 9 for 64).

/// The bytes of `len` values of `bits` bits.
pub fn packed_len(len: usize, bits: u32) -> usize {
    len.saturating_mul(bits as usize).div_ceil(8)
}

/// Packs `values`, each below `2^bits` (`1 ≤ bits ≤ 64`; higher bits are dropped).
pub fn pack(values: &[u64], bits: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(packed_len(values.len(), bits));
    if bits.is_multiple_of(8) {
        let width = bits as usize / 8;
        values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()[..width]));
        return out;
    }
    let mut buffer: u128 = 0;
    let mut filled = 0u32;
    for &value in values {
        buffer |= u128::from(value & low_bits(bits)) << filled;
        filled += bits;
        while filled >= 8 {
            out.push(buffer as u8);
            buffer >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        out.push(buffer as u8);
    }
    out
}

/// The `len` values packed in `bytes`, or `None` when `bytes` has the wrong length or sets
/// padding bits (so every vector has exactly one encoding).
pub fn unpack(bytes: &[u8], bits: u32, len: usize) -> Option<Vec<u64>> {
    if bytes.len() != packed_len(len, bits) || !(1..=64).contains(&bits) {
        return None;
    }
    if bits.is_multiple_of(8) {
        let width = bits as usize / 8;
        return Some(
            bytes
                .chunks_exact(width)
                .map(|chunk| {
                    let mut word = [0u8; 8];
                    word[..width].copy_from_slice(chunk);
                    u64::from_le_bytes(word)
                })
                .collect(),
        );
    }
    let mut out = Vec::with_capacity(len);
    let mut buffer: u128 = 0;
    let mut filled = 0u32;
    let mut next = bytes.iter();
    for _ in 0..len {
        while filled < bits {
            buffer |= u128::from(*next.next()?) << filled;
            filled += 8;
        }
        out.push(buffer as u64 & low_bits(bits));
        buffer >>= bits;
        filled -= bits;
    }
    (buffer == 0).then_some(out)
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
