//! The wire format between a server node and its client nodes: one versioned, bincode-encoded
//! [`Body`] per frame, carried as plain bytes inside a ractor_cluster cast.
//!
//! ractor_cluster hands a remote message to `Message::deserialize`, which has no way to report
//! a bad one except dropping it silently. So the actors of this crate receive raw bytes
//! ([`crate::message`]) and call [`decode`] themselves: every frame that is not what it claims
//! to be becomes a counted [`Rejection`] with a reason, never a panic and never a typed value
//! that skipped validation.
//!
//! A frame is `b"FS"`, the format version as u16 little-endian, then the bincode (standard
//! config) of a [`Body`]. The header comes first so that a peer speaking another version is
//! told apart from garbage before anything is decoded.

use crate::model_spec::ModelSpec;
use fedshard_actors::client::{AfterTraining, ClientReply};
use fedshard_actors::secure::SecureStep;
use fedshard_protocol::task::{ClientId, Recipe, TrainTask};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"FS";
/// The version of [`Body`]'s layout; bumped whenever it changes, so mismatched nodes are told
/// so rather than fed misread fields.
pub const VERSION: u16 = 4;
const HEADER: usize = 4;

/// A random secret a client node draws at start-up. It names the node's agent
/// ([`crate::agent_group`]) and must accompany every answer the node sends, so an answer for a
/// client can only come from the node the server registered that client with.
pub type SessionKey = u128;

/// One message between a server node and a client node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Body {
    /// Client node → server: the node `node` hosts these clients (id and sample count D_c).
    Hello(Hello),
    /// Server → client node: every client of the hello with this key is registered, and they
    /// train with the server's recipe (its base learning rate), whatever the node's config says.
    Welcome { key: SessionKey, recipe: Recipe },
    /// Server → client node: the hello with this key was refused, and why.
    Refused { key: SessionKey, reason: String },
    /// Server → client node: train `client` on the task (a `ClientMsg::Train`).
    Train {
        request: u64,
        deadline_ms: u64,
        train: TrainRequest,
    },
    /// Server → client node: send the update `client` kept from phase one of `round`.
    Upload {
        request: u64,
        deadline_ms: u64,
        client: ClientId,
        round: u64,
    },
    /// Server → client node: take the next step of `client`'s secure aggregation in `round`
    /// (a `ClientMsg::Secure`).
    Secure {
        request: u64,
        deadline_ms: u64,
        client: ClientId,
        round: u64,
        step: Box<SecureStep>,
    },
    /// Client node → server: the client's answer to `request`.
    Reply {
        key: SessionKey,
        request: u64,
        reply: ClientReply,
    },
    /// Client node → server: `client` could not be asked (its actor is gone).
    Unreachable {
        key: SessionKey,
        request: u64,
        client: ClientId,
        reason: String,
    },
    /// Server → client node: the run is over (`None`) or failed (`Some(why)`).
    Finished { error: Option<String> },
    /// Server → client node: the hello with this key came after the run had ended, after
    /// `rounds` rounds (`error`: as in [`Body::Finished`]). A node that missed the end (frozen,
    /// displaced, or cut off when it came) learns it here instead of reconnecting in vain.
    Over {
        key: SessionKey,
        rounds: u64,
        error: Option<String>,
    },
}

/// A client node introducing itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// A stable name (the same after a restart): a restarted node takes its clients back.
    pub node: String,
    pub key: SessionKey,
    /// Each hosted client with the number of samples it trains on here; the server compares
    /// them with its own partition, so nodes started from different configs are refused.
    pub clients: Vec<(ClientId, u64)>,
    /// The model this node's config builds; the server refuses a node whose model is not its
    /// own.
    pub model: ModelSpec,
}

/// What a `ClientMsg::Train` carries besides its reply port, as serde data: the transport
/// forwards the task unchanged (see [`crate::request`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRequest {
    pub task: Box<TrainTask>,
    pub then: AfterTraining,
}

impl Body {
    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Body::Hello(_) => "hello",
            Body::Welcome { .. } => "welcome",
            Body::Refused { .. } => "refused",
            Body::Train { .. } => "train",
            Body::Upload { .. } => "upload",
            Body::Secure { .. } => "secure",
            Body::Reply { .. } => "reply",
            Body::Unreachable { .. } => "unreachable",
            Body::Finished { .. } => "finished",
            Body::Over { .. } => "over",
        }
    }
}

/// Why a frame was dropped; each reason is counted (`fedshard_cluster_frames_rejected_total`).
/// `malformed`, `stale` and `forged` mean what they mean for updates
/// (`fedshard_protocol::payload::RejectionKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectionKind {
    /// Does not decode as a frame (bad magic, bad bincode, trailing bytes, invalid field).
    Malformed,
    /// Ends before the frame does (a valid prefix of some frame, or a short read).
    Truncated,
    /// Longer than the node's frame limit.
    Oversized,
    /// Another version of the wire format.
    Version,
    /// A frame the receiver never accepts (a server-bound frame sent to a client node, or the
    /// reverse), or a remote call instead of a cast.
    Unexpected,
    /// Answers a request that is not outstanding: already answered, expired, of an earlier
    /// round, or never sent (a replay).
    Stale,
    /// Claims an identity the sender does not have: an unknown session key, a client hosted by
    /// another node, an answer to a request sent to someone else.
    Forged,
    /// A hello the server cannot accept: unknown client ids, or sample counts that show the
    /// node was started from another config.
    Refused,
}

impl RejectionKind {
    pub const ALL: [RejectionKind; 8] = [
        RejectionKind::Malformed,
        RejectionKind::Truncated,
        RejectionKind::Oversized,
        RejectionKind::Version,
        RejectionKind::Unexpected,
        RejectionKind::Stale,
        RejectionKind::Forged,
        RejectionKind::Refused,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RejectionKind::Malformed => "malformed",
            RejectionKind::Truncated => "truncated",
            RejectionKind::Oversized => "oversized",
            RejectionKind::Version => "version",
            RejectionKind::Unexpected => "unexpected",
            RejectionKind::Stale => "stale",
            RejectionKind::Forged => "forged",
            RejectionKind::Refused => "refused",
        }
    }
}

/// A dropped frame: the counted kind and the text for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: RejectionKind,
    pub reason: String,
}

impl Rejection {
    pub fn new(kind: RejectionKind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.reason)
    }
}

impl std::error::Error for Rejection {}

/// The frame of `body`.
pub fn encode(body: &Body) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bincode::serde::encode_into_std_write(body, &mut bytes, bincode::config::standard())
        .unwrap_or_else(|e| unreachable!("in-memory bincode encoding failed: {e}"));
    bytes
}

/// Decodes one frame of at most `limit` bytes. Never panics, and never allocates more than a
/// small multiple of the frame's own length, whatever the bytes claim.
pub fn decode(bytes: &[u8], limit: usize) -> Result<Body, Rejection> {
    use RejectionKind as K;
    if bytes.len() > limit {
        return Err(Rejection::new(
            K::Oversized,
            format!("{} bytes, the limit is {limit}", bytes.len()),
        ));
    }
    if bytes.len() < HEADER {
        return Err(Rejection::new(
            K::Truncated,
            format!(
                "{} bytes, shorter than the {HEADER}-byte header",
                bytes.len()
            ),
        ));
    }
    if bytes[..2] != MAGIC {
        return Err(Rejection::new(
            K::Malformed,
            "not a fedshard frame (bad magic)",
        ));
    }
    let version = u16::from_le_bytes([bytes[2], bytes[3]]);
    if version != VERSION {
        return Err(Rejection::new(
            K::Version,
            format!("wire format version {version}, this node speaks version {VERSION}"),
        ));
    }
    // Bounded: bincode allocates a string's claimed length before reading it, and a ten-byte
    // frame must not make this node allocate an exabyte.
    match fedshard_protocol::bounded::decode_from_slice::<Body>(&bytes[HEADER..]) {
        Ok((body, used)) if used == bytes.len() - HEADER => Ok(body),
        Ok((body, used)) => Err(Rejection::new(
            K::Malformed,
            format!(
                "{} trailing bytes after a {} frame",
                bytes.len() - HEADER - used,
                body.kind()
            ),
        )),
        Err(bincode::error::DecodeError::UnexpectedEnd { additional }) => Err(Rejection::new(
            K::Truncated,
            format!("the frame ends {additional} byte(s) early"),
        )),
        Err(e) => Err(Rejection::new(K::Malformed, e.to_string())),
    }
}

/// The largest legitimate frame for a model whose `ModelState::to_bytes` is `model_bytes`
/// long: a task or an update holds at most the dense tensors plus, per sharded layer, factors
/// of at most twice the layer's size (full rank), or under SCAFFOLD (which shards nothing) the
/// dense tensors and one control variate, so three models and a margin for the envelope always
/// fit.
pub fn frame_limit(model_bytes: usize) -> usize {
    model_bytes.saturating_mul(3).saturating_add(1 << 20)
}

/// The inbound frame cap to give ractor_cluster on every node: the frame limit plus room for
/// its own envelope, and never below its 16 MiB default. A frame above the cap makes
/// ractor_cluster close the whole session, so the cap sits above [`frame_limit`]: a frame in
/// between reaches the receiver and is rejected as `oversized` on its own.
pub fn transport_cap(model_bytes: usize) -> u64 {
    let cap = frame_limit(model_bytes).saturating_add(1 << 20) as u64;
    cap.max(ractor_cluster::DEFAULT_MAX_INBOUND_FRAME_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::model::{ModelState, NamedTensor};
    use proptest::prelude::*;

    fn task() -> TrainTask {
        TrainTask {
            round: 3,
            client: 7,
            seed: 1,
            dense: ModelState::new(vec![NamedTensor::zeros("b", vec![4])]).unwrap(),
            width: None,
            shards: vec![],
            recipe: Recipe::default(),
            uplink: Default::default(),
            variates: None,
        }
    }

    fn frames() -> Vec<Body> {
        vec![
            Body::Hello(Hello {
                node: "node-a".into(),
                key: 42,
                clients: vec![(0, 10), (1, 12)],
                model: ModelSpec {
                    description: "softmax: 650 parameters in 2 tensors".into(),
                    digest: 7,
                },
            }),
            Body::Welcome {
                key: 42,
                recipe: Recipe::default(),
            },
            Body::Train {
                request: 9,
                deadline_ms: 1000,
                train: TrainRequest {
                    task: Box::new(task()),
                    then: AfterTraining::Upload,
                },
            },
            Body::Reply {
                key: 42,
                request: 9,
                reply: ClientReply::Failed {
                    client: 7,
                    reason: "nope".into(),
                    panicked: false,
                },
            },
            Body::Finished { error: None },
            Body::Over {
                key: 42,
                rounds: 5,
                error: None,
            },
            Body::Secure {
                request: 10,
                deadline_ms: 1000,
                client: 7,
                round: 3,
                step: Box::new(secure_begin()),
            },
        ]
    }

    /// A session's first step, with a SecAgg+ graph (an enum with data).
    fn secure_begin() -> SecureStep {
        use fedshard_actors::secure::{BlockLayout, InputSpec, SecureSettings};
        let settings = SecureSettings {
            clip_norm: Some(1.0),
            scale: 1024.0,
            threshold: 0.6,
            degree: Some(2),
        };
        let fixed = settings.fixed_point(1.0).unwrap();
        let layout = BlockLayout {
            dense: vec![("b".into(), 4)],
            layers: vec![],
            width: None,
        };
        SecureStep::Begin {
            params: settings
                .params((1, 3), &[3, 7, 9, 12], layout.len(), &fixed)
                .unwrap(),
            input: Box::new(InputSpec {
                layout,
                clip_norm: 1.0,
                weight: 0.5,
                fixed,
                count_unclipped: true,
            }),
        }
    }

    #[test]
    fn every_frame_round_trips() {
        for body in frames() {
            assert_eq!(decode(&encode(&body), 1 << 20), Ok(body));
        }
    }

    #[test]
    fn bad_frames_are_rejected_with_their_reason() {
        let good = encode(&frames()[2]);
        let kind = |bytes: &[u8]| decode(bytes, 1 << 20).unwrap_err().kind;
        assert_eq!(kind(&good[..good.len() - 1]), RejectionKind::Truncated);
        assert_eq!(kind(&good[..3]), RejectionKind::Truncated);
        let mut other = good.clone();
        other[2] = VERSION as u8 + 1;
        assert_eq!(kind(&other), RejectionKind::Version);
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(kind(&bad), RejectionKind::Malformed);
        let mut long = good.clone();
        long.push(0);
        assert_eq!(kind(&long), RejectionKind::Malformed);
        assert_eq!(
            decode(&good, good.len() - 1).unwrap_err().kind,
            RejectionKind::Oversized
        );
    }

    #[test]
    fn a_string_claiming_an_exabyte_is_refused_before_it_is_allocated() {
        // `Refused` with a reason whose varint length prefix says 2^60 bytes.
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.push(2); // variant index of `Refused`
        bytes.push(42); // key
        bytes.push(253); // u64 length follows
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        bytes.extend_from_slice(b"abc");
        assert_eq!(
            decode(&bytes, 1 << 20).unwrap_err().kind,
            RejectionKind::Malformed
        );
    }

    /// An update that answers its request passes the gateway, and the server then decodes its
    /// payload: a payload claiming a 16 TiB tensor name must be rejected there, not allocated
    /// (it aborted the server process before the protocol capped bincode's claims).
    #[test]
    fn an_update_payload_claiming_a_huge_name_is_rejected_not_allocated() {
        use fedshard_protocol::payload::{Payload, Rejection, decode_and_validate};
        let task = task();
        let mut bytes = vec![1u8, 253]; // one tensor; its name's length is a u64
        bytes.extend_from_slice(&(1u64 << 44).to_le_bytes());
        bytes.extend_from_slice(b"abc");
        let payload = Payload {
            compressor: task.uplink.compressor,
            bits: 8 * bytes.len() as u64,
            bytes,
            control: vec![],
        };
        assert!(matches!(
            decode_and_validate(&payload, &task),
            Err(Rejection::Malformed(_))
        ));
    }

    #[test]
    fn the_transport_cap_stays_above_the_frame_limit() {
        for model in [0, 1000, 20 << 20, 200 << 20] {
            assert!(transport_cap(model) > frame_limit(model) as u64);
        }
        assert_eq!(
            transport_cap(1000),
            ractor_cluster::DEFAULT_MAX_INBOUND_FRAME_SIZE
        );
    }

    proptest! {
        /// Whatever the bytes, after a valid header or not, decoding returns a body or a
        /// rejection; it never panics.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512), header in any::<bool>()) {
            let mut frame = Vec::new();
            if header {
                frame.extend_from_slice(&MAGIC);
                frame.extend_from_slice(&VERSION.to_le_bytes());
            }
            frame.extend_from_slice(&bytes);
            let _ = decode(&frame, 1 << 20);
        }

        /// Valid frames with one byte changed or cut short: decoded or rejected, never a panic.
        #[test]
        fn mutated_frames_never_panic(which in 0usize..6, at in any::<prop::sample::Index>(), value in any::<u8>(), cut in any::<bool>()) {
            let mut bytes = encode(&frames()[which]);
            let i = at.index(bytes.len());
            if cut {
                bytes.truncate(i);
            } else {
                bytes[i] = value;
            }
            let _ = decode(&bytes, 1 << 20);
        }
    }
}
