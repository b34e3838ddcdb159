//! The one place that knows the fields of `ClientMsg`: the server node's remote host turns a
//! message into a [`Request`] to send, and an agent on a client node turns it back into the
//! same message for the node's client host. The task itself travels as serde data, unchanged.

use crate::wire::TrainRequest;
use fedshard_actors::client::{ClientMsg, ClientReply};
use fedshard_actors::secure::SecureStep;
use fedshard_protocol::task::ClientId;
use ractor::RpcReplyPort;

/// A `ClientMsg` without its reply port.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Train(TrainRequest),
    Upload {
        client: ClientId,
        round: u64,
    },
    Secure {
        client: ClientId,
        round: u64,
        step: Box<SecureStep>,
    },
}

impl Request {
    /// Splits a message for the client `client` into what crosses the wire and the port its
    /// answer goes to.
    pub fn from_message(client: ClientId, message: ClientMsg) -> (Self, RpcReplyPort<ClientReply>) {
        match message {
            ClientMsg::Train { task, then, reply } => {
                (Request::Train(TrainRequest { task, then }), reply)
            }
            ClientMsg::Upload { round, reply } => (Request::Upload { client, round }, reply),
            ClientMsg::Secure { round, step, reply } => (
                Request::Secure {
                    client,
                    round,
                    step,
                },
                reply,
            ),
        }
    }

    /// The message again, answering on `reply`.
    pub fn into_message(self, reply: RpcReplyPort<ClientReply>) -> ClientMsg {
        match self {
            Request::Train(TrainRequest { task, then }) => ClientMsg::Train { task, then, reply },
            Request::Upload { round, .. } => ClientMsg::Upload { round, reply },
            Request::Secure { round, step, .. } => ClientMsg::Secure { round, step, reply },
        }
    }

    /// The client this request is for.
    pub fn client(&self) -> ClientId {
        match self {
            Request::Train(t) => t.task.client,
            Request::Upload { client, .. } | Request::Secure { client, .. } => *client,
        }
    }

    /// The round it belongs to.
    pub fn round(&self) -> u64 {
        match self {
            Request::Train(t) => t.task.round,
            Request::Upload { round, .. } | Request::Secure { round, .. } => *round,
        }
    }
}

/// The client an answer names.
pub fn reply_client(reply: &ClientReply) -> ClientId {
    match reply {
        ClientReply::Update(envelope) => envelope.client,
        ClientReply::Trained { client, .. }
        | ClientReply::Ready { client }
        | ClientReply::Secure { client, .. }
        | ClientReply::Failed { client, .. } => *client,
    }
}
