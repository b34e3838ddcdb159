//! The public parameters of one session, agreed before round 0 and the same for every party.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::graph::{Graph, Neighbourhoods};
use crate::message::{ClientId, SessionId};

/// The most clients a session may have: bounds every per-client list a peer can send.
pub const MAX_CLIENTS: usize = 1 << 20;
/// The longest vector a session may sum (2²⁸ values, 2 GiB of `u64`).
pub const MAX_VECTOR_LEN: usize = 1 << 28;

/// A parameter a user chooses, as [`Error::OutOfRange`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// `t`, or the fraction of the holders of each secret it is taken as.
    Threshold,
    /// SecAgg+'s graph degree `k`.
    Degree,
    /// A [`crate::FixedPoint`]'s range and scale.
    FixedPoint,
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Param::Threshold => "threshold",
            Param::Degree => "graph degree",
            Param::FixedPoint => "fixed-point range × scale",
        })
    }
}

/// Why `t` must exceed half of the holders of each secret, for the messages that refuse less.
const MAJORITY: &str = "so that the server cannot split the clients into two sessions and \
                        unmask a client in one of them (Bonawitz et al. 2017)";

/// Refuses a threshold fraction outside `(1/2, 1]`: `t = ⌈fraction · holders⌉` is then more
/// than half of the holders of every secret whatever their number (see [`Params::threshold`]),
/// and at most all of them.
pub fn check_threshold_fraction(fraction: f64) -> Result<(), Error> {
    if fraction > 0.5 && fraction <= 1.0 {
        Ok(())
    } else {
        Err(Error::OutOfRange {
            param: Param::Threshold,
            expected: format!("a fraction in (0.5, 1] of the holders of each secret, {MAJORITY}"),
            found: fraction.to_string(),
        })
    }
}

/// `t = ⌈fraction · holders⌉` for `holders` holders of each secret, after
/// [`check_threshold_fraction`].
pub fn threshold_of(fraction: f64, holders: usize) -> Result<usize, Error> {
    check_threshold_fraction(fraction)?;
    Ok(((fraction * holders as f64).ceil() as usize).clamp(1, holders.max(1)))
}

/// What every party of a session knows in advance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    /// Salts every key and binds every associated data to this session.
    pub session: SessionId,
    /// The clients selected for this aggregation, strictly increasing.
    pub clients: Vec<ClientId>,
    /// `t`: shares needed to rebuild a secret, and the fewest clients that may finish. Any
    /// `t − 1` holders learn nothing of a secret; Bonawitz et al. take `t > n/2` (`> 2n/3`
    /// against an active server) so that the server cannot split the clients in two sessions:
    /// [`Params::validate`] refuses less, so a client refuses a server that proposes less.
    pub threshold: usize,
    /// Who masks and shares with whom.
    pub graph: Graph,
    /// Inputs, masks and the sum live in `Z_{2^bits}`, `1 ≤ bits ≤ 64`; pick it with
    /// [`crate::IntegerRange::bits_for`] so the sum of all clients cannot wrap.
    pub bits: u32,
    /// The length of every input vector.
    pub vector_len: usize,
}

impl Params {
    /// Checks that the parameters describe a private session every client can finish: distinct
    /// sorted clients, a valid graph, `holders/2 < t ≤ holders` for the holders of each secret
    /// (a neighbourhood plus its owner), `bits` in `1..=64` and a non-empty vector.
    pub fn validate(&self) -> Result<(), Error> {
        let n = self.clients.len();
        if n == 0 || n > MAX_CLIENTS {
            return Err(Error::Params(format!(
                "{n} clients, expected 1..={MAX_CLIENTS}"
            )));
        }
        if self.clients.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::Params(
                "client ids must be strictly increasing".into(),
            ));
        }
        self.graph.validate()?;
        let holders = self.holders_per_secret();
        if self.threshold <= holders / 2 || self.threshold > holders {
            return Err(Error::OutOfRange {
                param: Param::Threshold,
                expected: format!(
                    "{}..={holders}, more than half of the {holders} holders of each secret, \
                     {MAJORITY}",
                    holders / 2 + 1
                ),
                found: self.threshold.to_string(),
            });
        }
        if !(1..=64).contains(&self.bits) {
            return Err(Error::Params(format!("bits {} outside 1..=64", self.bits)));
        }
        if self.vector_len == 0 || self.vector_len > MAX_VECTOR_LEN {
            return Err(Error::Params(format!("vector length {}", self.vector_len)));
        }
        Ok(())
    }

    /// How many clients hold shares of each secret: a neighbourhood plus the owner.
    pub fn holders_per_secret(&self) -> usize {
        let n = self.clients.len();
        match self.graph {
            Graph::Complete => n,
            Graph::RandomRegular { degree, .. } => n.min(degree + 1),
        }
    }

    /// `2^bits − 1`: reduces a `u64` computed with wrapping arithmetic to `Z_{2^bits}`
    /// (2^bits divides 2⁶⁴, so wrapping then masking is reduction mod 2^bits).
    pub fn modulus_mask(&self) -> u64 {
        if self.bits >= 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        }
    }

    /// Every client's neighbours.
    pub fn neighbourhoods(&self) -> Neighbourhoods {
        self.graph.neighbourhoods(&self.clients)
    }

    /// Whether `client` is one of the session's clients.
    pub fn knows(&self, client: ClientId) -> bool {
        self.clients.binary_search(&client).is_ok()
    }

    /// The largest frame an honest party of this session sends, in bytes: a masked input is
    /// its packed vector (at most 8 bytes a value) and any other message at most
    /// [`PER_PEER_BYTES`] per peer. [`crate::wire`] refuses longer frames
    /// before decoding them.
    pub fn max_frame_bytes(&self) -> usize {
        let vector = self.vector_len.saturating_mul(8);
        let per_peer = self.clients.len().saturating_mul(PER_PEER_BYTES);
        FRAME_OVERHEAD + vector.max(per_peer)
    }
}

/// An upper bound on the bytes one peer's entry takes in any message: an encrypted share
/// (id 5, nonce 12, length 1, ciphertext [`crate::crypto::CIPHERTEXT_LEN`] bytes), two keys
/// (64), or two shares with owner ids (2 × (5 + 5 + 5 × 9)).
pub const PER_PEER_BYTES: usize = 160;
/// Header, enum tags and vector lengths.
const FRAME_OVERHEAD: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: u32, threshold: usize, graph: Graph) -> Params {
        Params {
            session: SessionId([0; 16]),
            clients: (0..n).collect(),
            threshold,
            graph,
            bits: 16,
            vector_len: 1,
        }
    }

    fn refused_param(result: Result<impl std::fmt::Debug, Error>) -> Param {
        match result {
            Err(Error::OutOfRange { param, .. }) => param,
            other => panic!("{other:?}"),
        }
    }

    /// The threat model's majority: of 4 holders, t = 3 or 4; of 5, t = 3 to 5. With SecAgg+'s
    /// degree 2 a secret has 3 holders (two neighbours and its owner), so t = 2 is enough.
    #[test]
    fn a_threshold_of_half_the_holders_or_fewer_is_refused() {
        for (n, t) in [(4, 3), (4, 4), (5, 3), (5, 5), (1, 1)] {
            assert!(
                params(n, t, Graph::Complete).validate().is_ok(),
                "{t} of {n}"
            );
        }
        for (n, t) in [(4, 2), (4, 1), (5, 2), (4, 5), (4, 0)] {
            let refused = params(n, t, Graph::Complete).validate();
            assert_eq!(refused_param(refused), Param::Threshold, "{t} of {n}");
        }
        let sparse = Graph::RandomRegular { degree: 2, seed: 1 };
        assert!(params(9, 2, sparse).validate().is_ok());
        assert_eq!(
            refused_param(params(9, 1, sparse).validate()),
            Param::Threshold
        );
        let message = params(4, 2, Graph::Complete).validate().unwrap_err();
        assert!(message.to_string().contains("3..=4"), "{message}");
    }

    /// A fraction in (1/2, 1] gives a majority of any number of holders; 1/2 does not (2 of 4).
    #[test]
    fn a_threshold_fraction_must_exceed_one_half() {
        for holders in 1..=40 {
            for fraction in [0.51, 0.6, 2.0 / 3.0, 1.0] {
                let t = threshold_of(fraction, holders).unwrap();
                assert!(
                    2 * t > holders && t <= holders,
                    "{fraction} of {holders}: {t}"
                );
            }
        }
        assert_eq!(threshold_of(0.6, 5), Ok(3));
        for fraction in [0.5, 0.0, -1.0, 1.01, f64::NAN] {
            assert_eq!(
                refused_param(threshold_of(fraction, 4)),
                Param::Threshold,
                "{fraction}"
            );
        }
    }
}
