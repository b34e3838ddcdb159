//! The one host the server addresses for every remote client: it speaks the ordinary `HostMsg`
//! protocol, so the server treats remote clients as local ones, and passes every request to the
//! gateway, which frames it for the node hosting the client.

use super::GatewayMsg;
use crate::request::Request;
use fedshard_actors::host::HostMsg;
use ractor::{Actor, ActorProcessingErr, ActorRef};

/// The remote clients' host as the server sees it.
pub struct RemoteHosts;

impl Actor for RemoteHosts {
    type Msg = HostMsg;
    type State = ActorRef<GatewayMsg>;
    type Arguments = ActorRef<GatewayMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<HostMsg>,
        gateway: ActorRef<GatewayMsg>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(gateway)
    }

    async fn handle(
        &self,
        _myself: ActorRef<HostMsg>,
        message: HostMsg,
        gateway: &mut ActorRef<GatewayMsg>,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            HostMsg::Work { client, work } => {
                let (request, reply) = Request::from_message(client, work);
                // If the gateway is gone, so is the reply port: the server counts `unreachable`.
                let _ = gateway.cast(GatewayMsg::Dispatch { request, reply });
            }
            // Only a client actor this host spawned keeps an update or a variate with it; a
            // remote client's node keeps its own.
            HostMsg::Keep { client, .. } | HostMsg::Variate { client, .. } => {
                tracing::warn!(
                    client,
                    "state to keep sent to the remote clients' host; dropped"
                );
            }
            // No client actor works for this host: its clients' actors report to their nodes.
            HostMsg::Done(worker) => {
                tracing::warn!(
                    actor = %worker.get_id(),
                    "a client actor's `Done` sent to the remote clients' host; dropped"
                );
            }
        }
        Ok(())
    }
}
