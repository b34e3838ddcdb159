//! The public parameters of one session, agreed before round 0 and the same for every party.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::graph::{Graph, Neighbourhoods};
use crate::message::{ClientId, SessionId};

/// The most clients a session may have: bounds every per-client list a peer can send.
pub const MAX_CLIENTS: usize = 1 << 20;
/// The longest vector a session may sum (2²⁸ values, 2 GiB of `u64`).
pub const MAX_VECTOR_LEN: usize = 1 << 28;

/// What every party of a session knows in advance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    /// Salts every key and binds every associated data to this session.
    pub session: SessionId,
    /// The clients selected for this aggregation, strictly increasing.
    pub clients: Vec<ClientId>,
    /// `t`: shares needed to rebuild a secret, and the fewest clients that may finish. Any
    /// `t − 1` holders learn nothing of a secret; Bonawitz et al. take `t > n/2` (`> 2n/3`
    /// against an active server) so that the server cannot split the clients in two sessions.
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
    /// Checks that the parameters describe a session every client can finish: distinct sorted
    /// clients, a valid graph, `1 ≤ t ≤` the smallest number of holders of a secret
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
        if self.threshold == 0 || self.threshold > holders {
            return Err(Error::Params(format!(
                "threshold {} outside 1..={holders} (holders of each secret)",
                self.threshold
            )));
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
