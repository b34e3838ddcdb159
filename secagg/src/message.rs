//! The typed messages of one secure-aggregation session, Serialize/Deserialize for bincode.
//!
//! Every client message carries a [`Header`] (session, round, sender) and every server message
//! the session and the round it opens, so a state machine can refuse a replay from another
//! session, a message for another round and a message from a client it does not know, each
//! with its own [`Error`](crate::Error). Lengths inside a message are checked against the
//! session's parameters by whoever receives it ([`crate::wire`] bounds the frame first).

use serde::{Deserialize, Serialize};

use crate::shamir::Share;

/// A client's id within a session (its index in the federation's client list).
pub type ClientId = u32;

/// A session's unique id, chosen by the server for each aggregation (e.g. from the run's seed
/// and the round number); it salts every key derivation and every associated data, so nothing
/// from one session is accepted in another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionId(pub [u8; 16]);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The four rounds of Bonawitz et al.'s protocol (their consistency-check round is not run;
/// see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Round {
    /// Round 0: each client advertises its two public keys.
    AdvertiseKeys,
    /// Round 1: each client sends encrypted shares of `b_u` and `s_u^SK` to its neighbours.
    ShareKeys,
    /// Round 2: each client sends its masked input `y_u`.
    MaskedInput,
    /// Round 3: survivors send the shares that remove the masks.
    Unmask,
}

impl Round {
    /// The round's number in the papers (0–3), bound into every associated data.
    pub fn number(self) -> u8 {
        match self {
            Round::AdvertiseKeys => 0,
            Round::ShareKeys => 1,
            Round::MaskedInput => 2,
            Round::Unmask => 3,
        }
    }

    /// All rounds in order, for per-round tables.
    pub const ALL: [Round; 4] = [
        Round::AdvertiseKeys,
        Round::ShareKeys,
        Round::MaskedInput,
        Round::Unmask,
    ];
}

impl std::fmt::Display for Round {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.number(), self)
    }
}

/// Who sent a client message, for which session and round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub session: SessionId,
    pub round: Round,
    pub sender: ClientId,
}

/// A client's two X25519 public keys: `c` encrypts the shares sent to it, `s` agrees the
/// pairwise mask seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicKeys {
    pub cipher: [u8; 32],
    pub mask: [u8; 32],
}

/// A pair of shares (of `b_u` and of `s_u^SK`) encrypted for one neighbour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptedShare {
    /// The sender when the server forwards it, the receiver when a client sends it.
    pub peer: ClientId,
    pub nonce: [u8; 12],
    pub ciphertext: Vec<u8>,
}

/// The shares a survivor reveals in round 3, each tagged with the client that made it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmaskShares {
    /// Shares of `b_v` for survivors `v`.
    pub self_mask: Vec<(ClientId, Share)>,
    /// Shares of `s_v^SK` for dropped clients `v`.
    pub mask_key: Vec<(ClientId, Share)>,
}

/// What a client says in a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientBody {
    AdvertiseKeys(PublicKeys),
    /// One [`EncryptedShare`] per neighbour that advertised (`peer` = receiver), and the
    /// commitment to `b_u` ([`crate::crypto::commit_self_mask`]) the server checks the
    /// reconstructed seed against.
    ShareKeys {
        commitment: [u8; 32],
        shares: Vec<EncryptedShare>,
    },
    /// `y_u` in `Z_{2^bits}`, packed at `bits` bits per value ([`crate::packing`]).
    MaskedInput(Vec<u8>),
    Unmask(UnmaskShares),
}

impl ClientBody {
    /// The round this body belongs to, checked against the header's.
    pub fn round(&self) -> Round {
        match self {
            ClientBody::AdvertiseKeys(_) => Round::AdvertiseKeys,
            ClientBody::ShareKeys { .. } => Round::ShareKeys,
            ClientBody::MaskedInput(_) => Round::MaskedInput,
            ClientBody::Unmask(_) => Round::Unmask,
        }
    }
}

/// A message from a client to the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientMessage {
    pub header: Header,
    pub body: ClientBody,
}

/// What the server tells a client to start a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerBody {
    /// Opens round 1: the public keys of the receiver and of its neighbours that advertised,
    /// sorted by id.
    KeyDirectory(Vec<(ClientId, PublicKeys)>),
    /// Opens round 2: the shares addressed to this client, `peer` = sender.
    Shares(Vec<EncryptedShare>),
    /// Opens round 3: whose masked input arrived, and who of round 1's senders dropped.
    UnmaskRequest {
        survivors: Vec<ClientId>,
        dropped: Vec<ClientId>,
    },
}

impl ServerBody {
    /// The round this body opens.
    pub fn round(&self) -> Round {
        match self {
            ServerBody::KeyDirectory(_) => Round::ShareKeys,
            ServerBody::Shares(_) => Round::MaskedInput,
            ServerBody::UnmaskRequest { .. } => Round::Unmask,
        }
    }
}

/// A message from the server to a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerMessage {
    pub session: SessionId,
    pub round: Round,
    pub body: ServerBody,
}
