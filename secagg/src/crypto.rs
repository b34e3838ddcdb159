//! The cryptographic glue: X25519 agreement (x25519-dalek), HKDF-SHA256 key derivation,
//! ChaCha20-Poly1305 encryption of shares, and the ChaCha20 PRG that expands mask seeds.
//! Nothing here is hand-rolled cryptography; this module only fixes the labels, salts and
//! associated data so that every derived key and ciphertext is bound to its session and use
//! (docs/algorithms.md §7, "Share encryption" and "Masked input").

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hkdf::Hkdf;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};

use crate::error::Error;
use crate::field::Fe;
use crate::message::{ClientId, Round, SessionId};
use crate::shamir::{CHUNKS, Share};

/// Plaintext of an encrypted share pair: sender, receiver, then the two shares' values.
pub const PLAINTEXT_LEN: usize = 8 + 2 * CHUNKS * 8;
/// Plaintext plus the 16-byte Poly1305 tag.
pub const CIPHERTEXT_LEN: usize = PLAINTEXT_LEN + 16;

/// An X25519 key pair made from 32 secret bytes (clamped by x25519-dalek).
pub struct KeyPair {
    pub secret: StaticSecret,
    pub public: [u8; 32],
}

impl KeyPair {
    pub fn from_bytes(bytes: [u8; 32]) -> KeyPair {
        let secret = StaticSecret::from(bytes);
        let public = PublicKey::from(&secret).to_bytes();
        KeyPair { secret, public }
    }
}

/// The X25519 agreement of `secret` with `peer`'s `public` key; a low-order public key (whose
/// agreement is all zeros whatever the secret) is refused as [`Error::WeakKey`].
pub fn agree(secret: &StaticSecret, peer: ClientId, public: &[u8; 32]) -> Result<[u8; 32], Error> {
    let shared = secret.diffie_hellman(&PublicKey::from(*public));
    if !shared.was_contributory() {
        return Err(Error::WeakKey(peer));
    }
    Ok(shared.to_bytes())
}

/// Whether `public` is a low-order point (e.g. all zeros), whose agreement with every secret
/// is all zeros: a clamped X25519 scalar is a multiple of the cofactor 8, so any fixed secret
/// tells. The server refuses such keys in round 0 so that one client cannot make its
/// neighbours abort in round 1.
pub fn is_low_order(public: &[u8; 32]) -> bool {
    let probe = StaticSecret::from([0x5A; 32]);
    !probe
        .diffie_hellman(&PublicKey::from(*public))
        .was_contributory()
}

/// HKDF-SHA256 with the session as salt and `info` naming the use, 32 bytes out.
fn derive(ikm: &[u8], session: SessionId, info: &[&[u8]]) -> [u8; 32] {
    let info: Vec<u8> = info.concat();
    let mut okm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(&session.0), ikm)
        .expand(&info, &mut okm)
        .expect("32 bytes is far below HKDF-SHA256's 8160-byte limit");
    okm
}

/// The AEAD key for shares `from → to`: one key per direction, so the single message each
/// direction carries per session never reuses a (key, nonce) pair across directions.
pub fn share_key(
    agreement: &[u8; 32],
    session: SessionId,
    from: ClientId,
    to: ClientId,
) -> [u8; 32] {
    derive(
        agreement,
        session,
        &[
            b"fedshard-secagg/share-key/v1",
            &from.to_le_bytes(),
            &to.to_le_bytes(),
        ],
    )
}

/// The associated data of a share: session, round, sender and receiver. A ciphertext moved to
/// another pair, session or round fails authentication.
pub fn associated_data(session: SessionId, round: Round, from: ClientId, to: ClientId) -> [u8; 25] {
    let mut ad = [0u8; 25];
    ad[..16].copy_from_slice(&session.0);
    ad[16] = round.number();
    ad[17..21].copy_from_slice(&from.to_le_bytes());
    ad[21..25].copy_from_slice(&to.to_le_bytes());
    ad
}

/// The two shares `from` gives `to`, as the fixed-width plaintext the AEAD seals: sender and
/// receiver repeated inside (as in Bonawitz et al.), then both shares' values little-endian.
pub fn share_plaintext(
    from: ClientId,
    to: ClientId,
    self_mask: &Share,
    mask_key: &Share,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(PLAINTEXT_LEN);
    out.extend_from_slice(&from.to_le_bytes());
    out.extend_from_slice(&to.to_le_bytes());
    for value in self_mask.values.iter().chain(&mask_key.values) {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out
}

/// Reads [`share_plaintext`] back, checking sender, receiver and that every value is a field
/// element: `(self-mask share, mask-key share)`, both held by `to`.
pub fn read_share_plaintext(
    plain: &[u8],
    from: ClientId,
    to: ClientId,
) -> Result<(Share, Share), Error> {
    let rejected = || Error::ShareRejected { from, to };
    if plain.len() != PLAINTEXT_LEN
        || plain[..4] != from.to_le_bytes()
        || plain[4..8] != to.to_le_bytes()
    {
        return Err(rejected());
    }
    let mut values = plain[8..].chunks_exact(8).map(|bytes| {
        let mut word = [0u8; 8];
        word.copy_from_slice(bytes);
        Fe::new(u64::from_le_bytes(word))
            .map(Fe::value)
            .ok_or_else(rejected)
    });
    let mut next_share = || -> Result<Share, Error> {
        let mut share = Share {
            holder: to,
            values: [0; CHUNKS],
        };
        for value in &mut share.values {
            *value = values.next().ok_or_else(rejected)??;
        }
        Ok(share)
    };
    Ok((next_share()?, next_share()?))
}

/// ChaCha20-Poly1305 encryption under `key` with `nonce` and associated data `ad`.
pub fn seal(key: &[u8; 32], nonce: &[u8; 12], plaintext: &[u8], ad: &[u8]) -> Vec<u8> {
    let cipher = ChaCha20Poly1305::new(&Key::from(*key));
    cipher
        .encrypt(
            &Nonce::from(*nonce),
            Payload {
                msg: plaintext,
                aad: ad,
            },
        )
        .expect("a share plaintext is far below ChaCha20-Poly1305's 256 GiB limit")
}

/// Decrypts and authenticates, or [`Error::ShareRejected`] naming the pair.
pub fn open(
    key: &[u8; 32],
    nonce: &[u8; 12],
    ciphertext: &[u8],
    ad: &[u8],
    from: ClientId,
    to: ClientId,
) -> Result<Vec<u8>, Error> {
    if ciphertext.len() != CIPHERTEXT_LEN {
        return Err(Error::ShareRejected { from, to });
    }
    let cipher = ChaCha20Poly1305::new(&Key::from(*key));
    cipher
        .decrypt(
            &Nonce::from(*nonce),
            Payload {
                msg: ciphertext,
                aad: ad,
            },
        )
        .map_err(|_| Error::ShareRejected { from, to })
}

/// SHA-256 of the self-mask seed `b_u`, bound to the session and the owner: sent to the
/// server in round 1 so that a `b_u` rebuilt from wrong shares is noticed instead of leaving
/// a wrong sum. `b_u` is 32 uniform bytes, so the hash reveals nothing usable about it.
pub fn commit_self_mask(seed: &[u8; 32], session: SessionId, owner: ClientId) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"fedshard-secagg/self-mask-commitment/v1");
    hash.update(session.0);
    hash.update(owner.to_le_bytes());
    hash.update(seed);
    hash.finalize().into()
}

/// Which mask a seed expands to.
#[derive(Debug, Clone, Copy)]
pub enum MaskKind {
    /// `PRG(b_u)`, from the client's self-mask seed.
    SelfMask,
    /// `PRG(s_uv)`, from the X25519 agreement of two mask keys.
    Pair,
}

/// The ChaCha20 seed of a mask: HKDF of the secret (`b_u` or the agreement `s_uv`) with the
/// session as salt, so the same secret gives unrelated masks in different sessions.
pub fn mask_seed(secret: &[u8; 32], session: SessionId, kind: MaskKind) -> [u8; 32] {
    let label: &[u8] = match kind {
        MaskKind::SelfMask => b"fedshard-secagg/self-mask/v1",
        MaskKind::Pair => b"fedshard-secagg/pair-mask/v1",
    };
    derive(secret, session, &[label])
}

/// Adds (or subtracts) `PRG(seed)` to `acc` coordinate-wise mod 2⁶⁴; the caller reduces mod
/// 2^bits at the end (2^bits divides 2⁶⁴, so the low bits of the PRG's words are uniform).
pub fn apply_mask(acc: &mut [u64], seed: &[u8; 32], subtract: bool) {
    let mut prg = ChaCha20Rng::from_seed(*seed);
    if subtract {
        acc.iter_mut()
            .for_each(|a| *a = a.wrapping_sub(prg.next_u64()));
    } else {
        acc.iter_mut()
            .for_each(|a| *a = a.wrapping_add(prg.next_u64()));
    }
}
