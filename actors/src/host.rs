//! The client host: spawns and supervises the client actors of one node and registers each with
//! the server, again after every restart. The server never holds a trainer; whichever node hosts
//! a client builds its trainer from the config and the client id.

use crate::client::ClientActor;
use crate::server::ServerMsg;
use fedshard_protocol::task::{ClientId, LocalTrainer};
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub struct ClientHost;

pub struct HostState {
    server: ActorRef<ServerMsg>,
    trainers: BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
    by_actor: HashMap<ActorId, ClientId>,
}

impl HostState {
    /// Spawns `client`'s actor under the host and tells the server about it.
    async fn start_client(
        &mut self,
        client: ClientId,
        host: ActorCell,
    ) -> Result<(), ActorProcessingErr> {
        let trainer = Arc::clone(
            self.trainers
                .get(&client)
                .ok_or_else(|| format!("client {client} is not hosted here"))?,
        );
        let (actor, _) = Actor::spawn_linked(None, ClientActor, (client, trainer), host).await?;
        self.by_actor.insert(actor.get_id(), client);
        self.server
            .send_message(ServerMsg::Register { client, actor })?;
        Ok(())
    }
}

impl Actor for ClientHost {
    type Msg = ();
    type State = HostState;
    type Arguments = (
        ActorRef<ServerMsg>,
        BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
    );

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (server, trainers): Self::Arguments,
    ) -> Result<HostState, ActorProcessingErr> {
        let mut state = HostState {
            server,
            trainers,
            by_actor: HashMap::new(),
        };
        let ids: Vec<ClientId> = state.trainers.keys().copied().collect();
        for id in ids {
            state.start_client(id, myself.get_cell()).await?;
        }
        Ok(state)
    }

    /// A client actor that failed (a panic in local training) or stopped is started afresh and
    /// registered again; the round it failed in has already counted the failure.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(client) = stopped_actor(&event).and_then(|actor| state.by_actor.remove(&actor))
        {
            tracing::warn!(client, "client actor died; restarting it");
            state.start_client(client, myself.get_cell()).await?;
        }
        Ok(())
    }
}

/// The actor a supervision event says has failed or stopped, if any.
pub(crate) fn stopped_actor(event: &SupervisionEvent) -> Option<ActorId> {
    match event {
        SupervisionEvent::ActorFailed(cell, _) => Some(cell.get_id()),
        SupervisionEvent::ActorTerminated(cell, _, _) => Some(cell.get_id()),
        _ => None,
    }
}
