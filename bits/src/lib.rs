//! **fedshard-bits**: fields of any width (up to 64 bits) packed least significant bit first,
//! the last byte zero-padded, and read back with every overrun, trailing byte and set padding
//! bit an error.
//! May depend on: thiserror (no other fedshard crate, so that `fedshard-protocol`'s uplink
//! codecs and `fedshard-secagg`'s masked inputs share it without either depending on the
//! other).
//!
//! What it is for: a wire format whose size is its information content, `8 × bytes.len()` bits
//! for the fields written. Not for: what the fields mean (the codecs' symbol lists, the Elias
//! and trit codes live with the uplinks in `fedshard-protocol`).

/// Why bytes do not read as the fields asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BitsError {
    /// A field runs past the last byte.
    #[error("payload ends at bit {len}, a field needs bits {from}..{to}")]
    End { len: u64, from: u64, to: u64 },
    /// Whole bytes left after the last field.
    #[error("{0} trailing bytes")]
    TrailingBytes(u64),
    /// The zero padding of the last byte is not zero.
    #[error("non-zero padding bits")]
    Padding,
}

/// Appends fields of any width (≤ 64 bits) to a byte vector, least significant bit first.
#[derive(Debug, Default)]
pub struct BitWriter {
    bytes: Vec<u8>,
    /// Bits used in the last byte (0 when it is full or there is none).
    used: u32,
}

impl BitWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer whose buffer holds `bytes` without growing.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            used: 0,
        }
    }

    /// Writes the low `width` bits of `value` (`width ≤ 32`, higher bits zero).
    pub fn bits(&mut self, value: u32, width: u32) {
        debug_assert!(width <= 32);
        self.bits_u64(u64::from(value), width);
    }

    /// Writes the low `width` bits of `value` (`width ≤ 64`, higher bits zero).
    pub fn bits_u64(&mut self, mut value: u64, width: u32) {
        debug_assert!(width <= 64 && (width == 64 || value >> width == 0));
        let mut left = width;
        while left > 0 {
            if self.used == 0 {
                self.bytes.push(0);
            }
            let room = 8 - self.used;
            let take = room.min(left);
            let last = self.bytes.len() - 1;
            self.bytes[last] |= ((value & ((1 << take) - 1)) as u8) << self.used;
            value >>= take;
            left -= take;
            self.used = (self.used + take) % 8;
        }
    }

    pub fn f32(&mut self, value: f32) {
        self.bits(value.to_bits(), 32);
    }

    pub fn u32(&mut self, value: u32) {
        self.bits(value, 32);
    }

    /// The bytes, the last one zero-padded.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Reads what a [`BitWriter`] wrote; running past the end is an error, never a panic.
#[derive(Debug)]
pub struct BitReader<'a> {
    bytes: &'a [u8],
    /// Bit position.
    position: u64,
}

impl<'a> BitReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, position: 0 }
    }

    /// Reads a field of `width ≤ 32` bits.
    pub fn bits(&mut self, width: u32) -> Result<u32, BitsError> {
        debug_assert!(width <= 32);
        self.bits_u64(width).map(|value| value as u32)
    }

    /// Reads a field of `width ≤ 64` bits.
    pub fn bits_u64(&mut self, width: u32) -> Result<u64, BitsError> {
        debug_assert!(width <= 64);
        let end = self.position + u64::from(width);
        if end > 8 * self.bytes.len() as u64 {
            return Err(BitsError::End {
                len: 8 * self.bytes.len() as u64,
                from: self.position,
                to: end,
            });
        }
        let mut value = 0u64;
        let mut got = 0;
        while got < width {
            let byte = self.bytes[(self.position / 8) as usize];
            let offset = (self.position % 8) as u32;
            let take = (8 - offset).min(width - got);
            let chunk = (u64::from(byte) >> offset) & ((1 << take) - 1);
            value |= chunk << got;
            got += take;
            self.position += u64::from(take);
        }
        Ok(value)
    }

    pub fn f32(&mut self) -> Result<f32, BitsError> {
        self.bits(32).map(f32::from_bits)
    }

    pub fn u32(&mut self) -> Result<u32, BitsError> {
        self.bits(32)
    }

    /// Succeeds if only the zero padding of the last byte is left.
    pub fn finish(self) -> Result<(), BitsError> {
        let total = 8 * self.bytes.len() as u64;
        if total - self.position >= 8 {
            return Err(BitsError::TrailingBytes((total - self.position) / 8));
        }
        if self.position < total
            && self.bytes[(self.position / 8) as usize] >> (self.position % 8) != 0
        {
            return Err(BitsError::Padding);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_any_width_round_trip() {
        let mut w = BitWriter::new();
        let fields = [
            (5u64, 3u32),
            (0, 1),
            (1, 1),
            (300, 9),
            (u64::from(u32::MAX), 32),
            (2, 2),
            (u64::MAX, 64),
            ((1 << 61) - 2, 61),
        ];
        for (v, width) in fields {
            w.bits_u64(v, width);
        }
        w.f32(-0.25);
        let bytes = w.finish();
        let total: u32 = fields.iter().map(|f| f.1).sum::<u32>() + 32;
        assert_eq!(bytes.len(), total.div_ceil(8) as usize);
        let mut r = BitReader::new(&bytes);
        for (v, width) in fields {
            assert_eq!(r.bits_u64(width).unwrap(), v);
        }
        assert_eq!(r.f32().unwrap(), -0.25);
        r.finish().unwrap();
    }

    /// Least significant bit first: 3 bits of 5, then 6 bits of 0b101010, then 7 of 1 make
    /// the bytes `0b0101_0101`, `0b0000_0011`.
    #[test]
    fn fields_fill_each_byte_from_its_low_bit() {
        let mut w = BitWriter::new();
        w.bits(5, 3);
        w.bits(0b10_1010, 6);
        w.bits(1, 7);
        assert_eq!(w.finish(), [0b0101_0101, 0b0000_0011]);
    }

    #[test]
    fn reading_past_the_end_trailing_bytes_and_padding_are_errors() {
        let mut r = BitReader::new(&[0xff]);
        assert_eq!(
            r.bits(9),
            Err(BitsError::End {
                len: 8,
                from: 0,
                to: 9
            })
        );
        let mut r = BitReader::new(&[0x00, 0x00]);
        r.bits(3).unwrap();
        assert_eq!(r.finish(), Err(BitsError::TrailingBytes(1)));
        let mut r = BitReader::new(&[0b1000_0000]);
        r.bits(3).unwrap();
        assert_eq!(r.finish(), Err(BitsError::Padding));
        BitReader::new(&[]).finish().unwrap();
    }
}
