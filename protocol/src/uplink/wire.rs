//! The codes of compressed uplinks over `fedshard-bits`' [`BitWriter`] and [`BitReader`]:
//! candidate indices in `⌈log2 K⌉` bits, block sizes in `⌈log2 MAX_BLOCK_SIZE⌉` bits, signs and
//! mask bits in one bit, QSGD symbols five to a byte, Elias gamma and exp-Golomb codes. The
//! bytes written are the bytes sent, so `8 × bytes.len()` is the uplink's size.

pub use fedshard_bits::{BitReader, BitWriter, BitsError};

/// Why a payload's bits do not read as the fields its task expects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A field runs past the last byte, whole bytes follow the last field, or the last byte's
    /// padding is not zero.
    #[error(transparent)]
    Bits(#[from] BitsError),
    /// A QSGD symbol byte above 242 (five base-3 digits reach 242).
    #[error("symbol byte {0} is not five base-3 digits")]
    TritByte(u32),
    /// A QSGD symbol byte whose digits run past the message.
    #[error("symbol byte carries digits past the message")]
    TritsPastEnd,
    /// An Elias gamma code for a value of 2³² or more.
    #[error("an Elias gamma value past 32 bits")]
    EliasOverflow,
    /// An exp-Golomb code longer than any 32-bit value's.
    #[error("an exp-Golomb code of order {order} with {zeros} leading zeros")]
    ExpGolombZeros { order: u32, zeros: u32 },
    /// An exp-Golomb code for a value of 2³² or more.
    #[error("an exp-Golomb value {value} − 2^{order} past 32 bits")]
    ExpGolombOverflow { value: u64, order: u32 },
    /// An Elias-coded count of non-zero symbols above the message length.
    #[error("{nonzero} non-zero symbols in a message of {len}")]
    NonZeroCount { nonzero: usize, len: usize },
    /// An Elias-coded gap that runs past the message.
    #[error("a symbol gap runs to value {at} of {len}")]
    Gap { at: i64, len: usize },
}

/// QSGD symbols `{−1, 0, +1}` five to a byte (3⁵ = 243 ≤ 256): 1.6 bits per symbol.
pub fn write_trits(writer: &mut BitWriter, symbols: &[i8]) {
    for chunk in symbols.chunks(5) {
        let value = chunk
            .iter()
            .rev()
            .fold(0u32, |acc, &s| acc * 3 + (s.signum() + 1) as u32);
        writer.bits(value, 8);
    }
}

/// Reads `len` symbols written by [`write_trits`]; a byte above 242 is an error.
pub fn read_trits(reader: &mut BitReader, len: usize) -> Result<Vec<i8>, WireError> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let mut value = reader.bits(8)?;
        if value >= 243 {
            return Err(WireError::TritByte(value));
        }
        for _ in 0..(len - out.len()).min(5) {
            out.push((value % 3) as i8 - 1);
            value /= 3;
        }
        if value != 0 {
            return Err(WireError::TritsPastEnd);
        }
    }
    Ok(out)
}

/// Elias gamma code of `x ≥ 1`: `⌊log2 x⌋` zeros, then `x` in `⌊log2 x⌋ + 1` bits, most
/// significant first (`2⌊log2 x⌋ + 1` bits): the exp-Golomb code of order 0 of `x − 1`.
pub fn write_elias_gamma(writer: &mut BitWriter, x: u32) {
    debug_assert!(x >= 1);
    write_exp_golomb(writer, x - 1, 0);
}

/// Reads one [`write_elias_gamma`] value; a code for a value of 2³² or more is an error.
pub fn read_elias_gamma(reader: &mut BitReader) -> Result<u32, WireError> {
    read_exp_golomb(reader, 0)?
        .checked_add(1)
        .ok_or(WireError::EliasOverflow)
}

/// Exp-Golomb code of order `k` of `n ≥ 0`: the Elias gamma code of `n + 2^k` without its
/// first `k` zeros, `2⌊log2(n + 2^k)⌋ − k + 1` bits: `k + 1` bits for `n < 2^k`, two more for
/// each doubling beyond. KLMS's ordered selection sends its candidate indices in it.
pub fn write_exp_golomb(writer: &mut BitWriter, n: u32, k: u32) {
    let x = u64::from(n) + (1u64 << k);
    let top = 63 - x.leading_zeros();
    writer.bits(0, top - k);
    for i in (0..=top).rev() {
        writer.bits(((x >> i) & 1) as u32, 1);
    }
}

/// The bits [`write_exp_golomb`] spends on `n` at order `k`.
pub fn exp_golomb_bits(n: u32, k: u32) -> u64 {
    let x = u64::from(n) + (1u64 << k);
    u64::from(2 * (63 - x.leading_zeros()) - k + 1)
}

/// Reads one [`write_exp_golomb`] value of order `k ≤ 31`; a code for a value of 2³² or more is
/// an error.
pub fn read_exp_golomb(reader: &mut BitReader, k: u32) -> Result<u32, WireError> {
    let mut zeros = 0;
    while reader.bits(1)? == 0 {
        zeros += 1;
        if zeros + k > 32 {
            return Err(WireError::ExpGolombZeros { order: k, zeros });
        }
    }
    let mut x = 1u64;
    for _ in 0..zeros + k {
        x = (x << 1) | u64::from(reader.bits(1)?);
    }
    u32::try_from(x - (1u64 << k)).map_err(|_| WireError::ExpGolombOverflow { value: x, order: k })
}

/// QSGD symbols as in the QSGD paper's Elias coding: the number of non-zero symbols plus one,
/// then per non-zero symbol the gap from the previous one (the first from position −1) and its
/// sign bit (1 for `+1`), all in Elias gamma. About `nnz (2 log2(d / nnz) + 2)` bits.
pub fn write_elias_symbols(writer: &mut BitWriter, symbols: &[i8]) {
    let nonzero = symbols.iter().filter(|&&s| s != 0).count();
    write_elias_gamma(writer, nonzero as u32 + 1);
    let mut previous = -1i64;
    for (j, &s) in symbols.iter().enumerate() {
        if s != 0 {
            write_elias_gamma(writer, (j as i64 - previous) as u32);
            writer.bits(u32::from(s > 0), 1);
            previous = j as i64;
        }
    }
}

/// Reads `len` symbols written by [`write_elias_symbols`]; a count or a gap that runs past the
/// message is an error.
pub fn read_elias_symbols(reader: &mut BitReader, len: usize) -> Result<Vec<i8>, WireError> {
    let nonzero = read_elias_gamma(reader)? as usize - 1;
    if nonzero > len {
        return Err(WireError::NonZeroCount { nonzero, len });
    }
    let mut out = vec![0i8; len];
    let mut previous = -1i64;
    for _ in 0..nonzero {
        let at = previous + i64::from(read_elias_gamma(reader)?);
        let slot = usize::try_from(at)
            .ok()
            .and_then(|j| out.get_mut(j))
            .ok_or(WireError::Gap { at, len })?;
        *slot = if reader.bits(1)? == 1 { 1 } else { -1 };
        previous = at;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trits_round_trip_five_to_a_byte() {
        let symbols: Vec<i8> = (0..23).map(|i| (i % 3) as i8 - 1).collect();
        let mut w = BitWriter::new();
        write_trits(&mut w, &symbols);
        let bytes = w.finish();
        assert_eq!(bytes.len(), 5);
        let mut r = BitReader::new(&bytes);
        assert_eq!(read_trits(&mut r, 23).unwrap(), symbols);
        assert!(read_trits(&mut BitReader::new(&[243]), 1).is_err());
    }

    #[test]
    fn elias_gamma_has_the_textbook_lengths() {
        // 1 → "1", 2 → "010", 5 → "00101", 17 → 9 bits: 2⌊log2 x⌋ + 1.
        for (x, bits) in [(1u32, 1usize), (2, 3), (5, 5), (17, 9), (u32::MAX, 63)] {
            let mut w = BitWriter::new();
            write_elias_gamma(&mut w, x);
            w.bits(1, 1); // a marker right after the code
            let bytes = w.finish();
            assert_eq!(bytes.len(), (bits + 1).div_ceil(8), "{x}");
            let mut r = BitReader::new(&bytes);
            assert_eq!(read_elias_gamma(&mut r).unwrap(), x);
            assert_eq!(r.bits(1).unwrap(), 1);
        }
        // 32 zeros: not a code.
        assert!(read_elias_gamma(&mut BitReader::new(&[0; 5])).is_err());
    }

    #[test]
    fn exp_golomb_has_the_textbook_codes() {
        // Order 0 is Elias gamma of n + 1; order 2 spends 3 bits below 4, 5 bits below 12.
        for (n, k, code) in [
            (0, 0, "1"),
            (1, 0, "010"),
            (4, 0, "00101"),
            (0, 2, "100"),
            (3, 2, "111"),
            (4, 2, "01000"),
            (11, 2, "01111"),
            (12, 2, "0010000"),
        ] {
            let mut w = BitWriter::new();
            write_exp_golomb(&mut w, n, k);
            let bytes = w.finish();
            let mut r = BitReader::new(&bytes);
            let bits: String = (0..code.len())
                .map(|_| char::from(b'0' + r.bits(1).unwrap() as u8))
                .collect();
            assert_eq!(bits, code, "n = {n}, k = {k}");
            assert_eq!(exp_golomb_bits(n, k), code.len() as u64);
            assert_eq!(read_exp_golomb(&mut BitReader::new(&bytes), k).unwrap(), n);
        }
        for k in [0, 3, 10] {
            for n in [0, 1, 7, 1000, (1 << 20) - 1, u32::MAX - (1 << k)] {
                let mut w = BitWriter::new();
                write_exp_golomb(&mut w, n, k);
                let bytes = w.finish();
                assert_eq!(read_exp_golomb(&mut BitReader::new(&bytes), k).unwrap(), n);
            }
        }
        assert!(read_exp_golomb(&mut BitReader::new(&[0; 8]), 2).is_err());
    }

    #[test]
    fn elias_symbols_cost_the_gaps_and_signs() {
        // 100 values, non-zero at 0 (+), 9 (−), 99 (+): count 4 → 5 bits; gaps 1, 9, 90 →
        // 1 + 7 + 13 bits; 3 signs: 29 bits, 4 bytes.
        let mut symbols = vec![0i8; 100];
        (symbols[0], symbols[9], symbols[99]) = (1, -1, 1);
        let mut w = BitWriter::new();
        write_elias_symbols(&mut w, &symbols);
        let bytes = w.finish();
        assert_eq!(bytes.len(), 29usize.div_ceil(8));
        let mut r = BitReader::new(&bytes);
        assert_eq!(read_elias_symbols(&mut r, 100).unwrap(), symbols);
        r.finish().unwrap();
        // The same bytes cannot describe a message of 50 values: the last gap runs past it.
        let err = read_elias_symbols(&mut BitReader::new(&bytes), 50).unwrap_err();
        assert!(err.to_string().contains("runs to value 99"), "{err}");
    }
}
