//! What can go wrong in a secure-aggregation session, as one enum a caller can match.
//!
//! Errors about a peer's message (a forged share, a duplicate, a wrong round) leave the state
//! machine that saw them unchanged, so a server can count the rejection and carry on; errors a
//! client raises on a consistency check abort that client for the rest of the session.

use crate::message::{ClientId, Round, SessionId};
use crate::params::Param;

/// Every way a secure-aggregation step can fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The parameters cannot describe a session (empty client list, unsorted ids, …).
    #[error("invalid secure-aggregation parameters: {0}")]
    Params(String),
    /// A parameter a user chooses (the threshold, the graph's degree, the fixed-point range and
    /// scale) outside the range that keeps a session private and useful; `param` says which, so
    /// that a caller can name its own setting.
    #[error("{param}: expected {expected}, found {found}")]
    OutOfRange {
        param: Param,
        expected: String,
        found: String,
    },
    /// A message of another session: a replay or a misrouted message.
    #[error("message from another session (expected session {expected}, got {got})")]
    WrongSession { expected: SessionId, got: SessionId },
    /// A message for another round than the one this state machine is in.
    #[error("message for round {got} while in round {expected}")]
    WrongRound { expected: Round, got: Round },
    /// A sender or a named client that is not one of the session's clients.
    #[error("client {0} is not in this session")]
    UnknownClient(ClientId),
    /// A sender that did not take part in the previous round, so cannot take part in this one.
    #[error("client {client} did not complete the round before {round}")]
    NotExpected { client: ClientId, round: Round },
    /// A second message from the same sender in the same round.
    #[error("duplicate message from client {client} in round {round}")]
    Duplicate { client: ClientId, round: Round },
    /// Fewer live clients than the threshold: the session cannot finish without risking privacy.
    #[error("round {round}: {got} clients left, at least {needed} needed")]
    TooFewClients {
        round: Round,
        needed: usize,
        got: usize,
    },
    /// Fewer shares of a client's secret than the threshold: its mask cannot be removed.
    #[error("only {got} shares of client {client}'s secret arrived, {needed} needed")]
    TooFewShares {
        client: ClientId,
        needed: usize,
        got: usize,
    },
    /// A share, a key or a vector whose length or range is not what the session allows.
    #[error("malformed message from client {client}: {what}")]
    Malformed { client: ClientId, what: String },
    /// A frame longer than any honest message of the session, refused before decoding.
    #[error("frame of {got} bytes exceeds the session's limit of {limit}")]
    FrameTooLarge { got: usize, limit: usize },
    /// bytes that do not decode to a message.
    #[error("undecodable frame: {0}")]
    Decode(String),
    /// An encrypted share that does not open under the pair's key and associated data: forged,
    /// altered, swapped between pairs, or replayed from another session or round.
    #[error("share from client {from} to client {to} failed authentication")]
    ShareRejected { from: ClientId, to: ClientId },
    /// A public key that gives a non-contributory (all-zero) agreement: a low-order point.
    #[error("client {0} advertised a weak public key")]
    WeakKey(ClientId),
    /// Two clients advertised the same public key (Bonawitz et al. require distinct keys).
    #[error("clients {0} and {1} advertised the same public key")]
    RepeatedKey(ClientId, ClientId),
    /// The server's key directory does not carry this client's own keys as it advertised them.
    #[error("the key directory misrepresents client {0}'s own keys")]
    DirectoryMismatch(ClientId),
    /// The server asked for a client's self-mask share and its mask-key share at once: both
    /// together reveal that client's input, so the request is refused.
    #[error("asked to reveal both the self mask and the mask key of client {0}")]
    BothRequested(ClientId),
    /// The unmask request names this client as dropped although it sent its masked input.
    #[error("the unmask request names client {0} itself as dropped")]
    NamedDropped(ClientId),
    /// The unmask request leaves out a neighbour this client exchanged masks with.
    #[error("the unmask request does not account for client {0}")]
    Unaccounted(ClientId),
    /// Shares that do not interpolate to a well-formed secret, or a reconstructed mask key whose
    /// public key is not the one advertised: a holder sent a wrong share.
    #[error("the shares of client {0}'s secret are inconsistent")]
    InconsistentShares(ClientId),
    /// A client's own input is not a vector of the session's length in `Z_{{2^bits}}`.
    #[error("input {what}")]
    Input { what: String },
    /// A state machine called out of order (e.g. unmasking twice, or after an abort).
    #[error("{what} is not allowed in state {state}")]
    OutOfOrder {
        what: &'static str,
        state: &'static str,
    },
    /// An uplink coding whose values do not add up to the aggregate the server wants.
    #[error("uplink coding {coding} cannot be securely aggregated: {why}")]
    NotSummable {
        coding: &'static str,
        why: &'static str,
    },
}
