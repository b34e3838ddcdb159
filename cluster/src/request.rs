//! The one place that knows the fields of `ClientMsg`: the server node's remote host turns a
//! message into a [`Request`] to send, and an agent on a client node turns it back into the
//! same message for the node's client host. The task itself travels as serde data, unchanged.

use crate::wire::TrainRequest;
use fedshard_actors::client::{ClientMsg, ClientReply};
use fedshard_protocol::task::ClientId;
use ractor::RpcReplyPort;

/// A `ClientMsg` without its reply port.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Train(TrainRequest),
    Upload { client: ClientId, round: u64 },
}

impl Request {
    /// Splits a message for the client `client` into what crosses the wire and the port its
    /// answer goes to.
    pub fn from_message(client: ClientId, message: ClientMsg) -> (Self, RpcReplyPort<ClientReply>) {
        match message {
            ClientMsg::Train {
                task,
                upload,
                reply,
            } => (Request::Train(TrainRequest { task, upload }), reply),
            ClientMsg::Upload { round, reply } => (Request::Upload { client, round }, reply),
        }
    }

    /// The message again, answering on `reply`.
    pub fn into_message(self, reply: RpcReplyPort<ClientReply>) -> ClientMsg {
        match self {
            Request::Train(TrainRequest { task, upload }) => ClientMsg::Train {
                task,
                upload,
                reply,
            },
            Request::Upload { round, .. } => ClientMsg::Upload { round, reply },
        }
    }

    /// The client this request is for.
    pub fn client(&self) -> ClientId {
        match self {
            Request::Train(t) => t.task.client,
            Request::Upload { client, .. } => *client,
        }
    }

    /// The round it belongs to.
    pub fn round(&self) -> u64 {
        match self {
            Request::Train(t) => t.task.round,
            Request::Upload { round, .. } => *round,
        }
    }
}

/// The client an answer names.
pub fn reply_client(reply: &ClientReply) -> ClientId {
    match reply {
        ClientReply::Update(envelope) => envelope.client,
        ClientReply::Trained { client, .. } | ClientReply::Failed { client, .. } => *client,
    }
}
