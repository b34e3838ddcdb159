//! bincode decoding of bytes from another machine, with a claim limit proportional to their
//! length.
//!
//! bincode allocates a string's claimed length before reading it, so decoding untrusted bytes
//! without a limit lets a dozen bytes ask for terabytes and abort the process. bincode's limit
//! is a constant, and it must let every honest value through: bincode counts every primitive it
//! reads, and 8 bytes for a varint integer however short its encoding, so honest claims reach
//! up to 16 times the input's length. The limit is therefore the first power of eight at least
//! 16 times the input's length, picked among constants: whatever the bytes claim, decoding
//! them allocates at most about 128 times what actually arrived.

use bincode::config::standard;
use bincode::error::DecodeError;
use serde::de::DeserializeOwned;

fn decode_with<T: DeserializeOwned, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<(T, usize), DecodeError> {
    bincode::serde::decode_from_slice(bytes, standard().with_limit::<LIMIT>())
}

/// `bincode::serde::decode_from_slice` with the standard config and a limit of at most
/// 128 × `bytes.len()` on what the bytes may claim (and at least 16 ×, so honest input always
/// decodes): the value and the number of bytes it used.
pub fn decode_from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), DecodeError> {
    let need = bytes.len().saturating_mul(16);
    macro_rules! by_size {
        ($($bits:literal)*) => {
            $(
                if need <= 1usize << $bits {
                    return decode_with::<T, { 1usize << $bits }>(bytes);
                }
            )*
        };
    }
    by_size!(12 15 18 21 24 27 30 33 36 39 42);
    Err(DecodeError::LimitExceeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honest_values_decode_and_huge_claims_are_refused() {
        let honest: (Vec<u64>, String, Vec<f32>) =
            (vec![1; 5000], "name".into(), vec![0.5; 70_000]);
        let bytes = bincode::serde::encode_to_vec(&honest, standard()).unwrap();
        let (back, used): ((Vec<u64>, String, Vec<f32>), usize) =
            decode_from_slice(&bytes).unwrap();
        assert_eq!((back, used), (honest, bytes.len()));

        // A string whose length prefix says 2^44 bytes.
        let mut liar = vec![253u8];
        liar.extend_from_slice(&(1u64 << 44).to_le_bytes());
        liar.extend_from_slice(b"abc");
        assert!(matches!(
            decode_from_slice::<String>(&liar),
            Err(DecodeError::LimitExceeded)
        ));
    }
}
