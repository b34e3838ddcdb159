//! Shamir's t-of-n secret sharing of 32-byte secrets over GF(2⁶¹ − 1) (Shamir 1979, as used
//! by Bonawitz et al. 2017 for the self-mask seed `b_u` and the mask key `s_u^SK`;
//! docs/algorithms.md §7, "Shamir sharing").
//!
//! A secret is cut into [`CHUNKS`] chunks of 7 bytes (the last holds the remaining 4), each
//! below 2⁵⁶ < p, and every chunk is shared with its own random polynomial of degree `t − 1`;
//! the holder with id `v` gets the evaluations at `x = v + 1` (never 0, where the secret is).
//! Any `t` shares give the secret by Lagrange interpolation at 0; `t − 1` shares are
//! independent of it. This is not robust sharing: a wrong share is noticed here only when a
//! chunk interpolates to 2⁵⁶ or more, which a small change to a share (whose Lagrange
//! coefficient is a small integer) often does not do; the caller checks the secret itself
//! (the advertised public key of `s_u`, the commitment to `b_u`).

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::field::Fe;
use crate::message::ClientId;

/// Field elements per shared secret: ⌈32 bytes / 7⌉.
pub const CHUNKS: usize = 5;
/// Bytes of a secret carried by one field element.
const CHUNK_BYTES: usize = 7;

/// One holder's share of one 32-byte secret: the evaluations of the [`CHUNKS`] polynomials at
/// the holder's point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// Who holds it; its evaluation point is `holder + 1`.
    pub holder: ClientId,
    /// The evaluations, each canonical (< 2⁶¹ − 1) when made here; checked when received.
    pub values: [u64; CHUNKS],
}

/// The evaluation point of a holder: its id plus one, so no holder is ever given `f(0)`.
fn point(holder: ClientId) -> Fe {
    Fe::reduce(u64::from(holder) + 1)
}

/// The secret's chunks as field elements (little-endian bytes, each below 2⁵⁶).
fn chunks(secret: &[u8; 32]) -> [Fe; CHUNKS] {
    let mut out = [Fe::ZERO; CHUNKS];
    for (chunk, bytes) in out.iter_mut().zip(secret.chunks(CHUNK_BYTES)) {
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        *chunk = Fe::reduce(u64::from_le_bytes(word));
    }
    out
}

/// Shares `secret` among `holders` (distinct ids) so that any `threshold` of them recover it.
pub fn split(
    secret: &[u8; 32],
    threshold: usize,
    holders: &[ClientId],
    rng: &mut impl rand::Rng,
) -> Vec<Share> {
    let constant = chunks(secret);
    // coefficients[c] = [a_0 = chunk c, a_1, …, a_{t−1}].
    let coefficients: Vec<Vec<Fe>> = constant
        .iter()
        .map(|&a0| {
            std::iter::once(a0)
                .chain((1..threshold.max(1)).map(|_| Fe::random(rng)))
                .collect()
        })
        .collect();
    holders
        .iter()
        .map(|&holder| {
            let x = point(holder);
            let mut values = [0u64; CHUNKS];
            for (value, poly) in values.iter_mut().zip(&coefficients) {
                // Horner's rule from the highest coefficient down.
                *value = poly
                    .iter()
                    .rev()
                    .fold(Fe::ZERO, |acc, &a| acc * x + a)
                    .value();
            }
            Share { holder, values }
        })
        .collect()
}

/// The secret `owner` shared, from at least `threshold` shares of distinct holders (the first
/// `threshold` in the order given are used).
///
/// Errors: [`Error::TooFewShares`] below the threshold; [`Error::InconsistentShares`] for
/// repeated holders, non-canonical values or chunks that cannot be a secret's.
pub fn reconstruct(owner: ClientId, shares: &[Share], threshold: usize) -> Result<[u8; 32], Error> {
    if shares.len() < threshold || threshold == 0 {
        return Err(Error::TooFewShares {
            client: owner,
            needed: threshold,
            got: shares.len(),
        });
    }
    let used = &shares[..threshold];
    let points: Vec<Fe> = used.iter().map(|s| point(s.holder)).collect();
    // Lagrange basis at 0: ℓ_i(0) = Π_{m≠i} x_m / (x_m − x_i).
    let mut basis = Vec::with_capacity(threshold);
    for (i, &xi) in points.iter().enumerate() {
        let mut numerator = Fe::ONE;
        let mut denominator = Fe::ONE;
        for (m, &xm) in points.iter().enumerate() {
            if m != i {
                numerator = numerator * xm;
                denominator = denominator * (xm - xi);
            }
        }
        let inverse = denominator
            .inverse()
            .ok_or(Error::InconsistentShares(owner))?;
        basis.push(numerator * inverse);
    }
    let mut secret = [0u8; 32];
    for (c, bytes) in secret.chunks_mut(CHUNK_BYTES).enumerate() {
        let mut chunk = Fe::ZERO;
        for (share, &l) in used.iter().zip(&basis) {
            let y = Fe::new(share.values[c]).ok_or(Error::InconsistentShares(owner))?;
            chunk = chunk + y * l;
        }
        let word = chunk.value().to_le_bytes();
        // A chunk of `bytes.len()` bytes has nothing above them; anything else means a wrong
        // share somewhere.
        if word[bytes.len()..].iter().any(|&b| b != 0) {
            return Err(Error::InconsistentShares(owner));
        }
        bytes.copy_from_slice(&word[..bytes.len()]);
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn any_threshold_subset_recovers_the_secret() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let secret: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xA5);
        let holders: Vec<ClientId> = vec![0, 3, 4, 9, 10, 11];
        let shares = split(&secret, 4, &holders, &mut rng);
        for start in 0..3 {
            let subset: Vec<Share> = shares[start..start + 4].to_vec();
            assert_eq!(reconstruct(1, &subset, 4), Ok(secret));
        }
        let reversed: Vec<Share> = shares.iter().rev().copied().collect();
        assert_eq!(reconstruct(1, &reversed, 4), Ok(secret));
    }

    #[test]
    fn too_few_or_altered_shares_are_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let secret = [0xFFu8; 32];
        let shares = split(&secret, 3, &[1, 2, 3], &mut rng);
        assert!(matches!(
            reconstruct(5, &shares[..2], 3),
            Err(Error::TooFewShares { .. })
        ));
        // An altered share never gives back the secret: either the chunk leaves its range
        // (here the last, 4-byte chunk moves by −8 · 10⁹ mod p) or the bytes differ.
        let mut bad = shares.clone();
        let moved = Fe::new(bad[1].values[CHUNKS - 1]).unwrap() + Fe::reduce(1_000_000_000);
        bad[1].values[CHUNKS - 1] = moved.value();
        assert_eq!(reconstruct(5, &bad, 3), Err(Error::InconsistentShares(5)));
        let mut small = shares.clone();
        small[1].values[0] ^= 1;
        assert_ne!(reconstruct(5, &small, 3), Ok(secret));
        let mut repeated = shares;
        repeated[1].holder = repeated[0].holder;
        assert_eq!(
            reconstruct(5, &repeated, 3),
            Err(Error::InconsistentShares(5))
        );
    }
}
