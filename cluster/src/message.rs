//! The message types of the actors that receive frames from other nodes.
//!
//! With ractor's `cluster` feature a message type says itself how it crosses the wire. Ours
//! carry a frame's bytes untouched: `deserialize` cannot fail (ractor_cluster would drop a
//! failure silently, uncounted), so anything a peer sends arrives at the actor as a
//! [`Frame`](crate::gateway::GatewayMsg::Frame) to decode and check, or as a `Foreign` marker
//! for what is not a frame cast at all. Only the frame variant is serialisable; the others are
//! local to a node.

/// The variant name of a frame cast on the wire.
pub const FRAME_VARIANT: &str = "fedshard.frame";

/// Implements `ractor::Message` for an enum with `Frame(Vec<u8>)` and `Foreign(&'static str)`
/// variants.
macro_rules! frame_message {
    ($ty:ident) => {
        impl ractor::Message for $ty {
            fn serializable() -> bool {
                true
            }

            fn serialize(
                self,
            ) -> Result<ractor::message::SerializedMessage, ractor::message::BoxedDowncastErr> {
                match self {
                    $ty::Frame(args) => Ok(ractor::message::SerializedMessage::Cast {
                        variant: $crate::message::FRAME_VARIANT.to_string(),
                        args,
                        metadata: None,
                    }),
                    _ => Err(ractor::message::BoxedDowncastErr),
                }
            }

            fn deserialize(
                message: ractor::message::SerializedMessage,
            ) -> Result<Self, ractor::message::BoxedDowncastErr> {
                use ractor::message::SerializedMessage as S;
                Ok(match message {
                    S::Cast { variant, args, .. } if variant == $crate::message::FRAME_VARIANT => {
                        $ty::Frame(args)
                    }
                    S::Cast { .. } => $ty::Foreign("a cast that is not a fedshard frame"),
                    S::Call { .. } => $ty::Foreign("a remote call"),
                    S::CallReply(..) => $ty::Foreign("a call reply"),
                })
            }
        }
    };
}

pub(crate) use frame_message;
