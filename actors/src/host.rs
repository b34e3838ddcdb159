//! The client host: keeps the lasting state of the clients of one node as plain data (each
//! client's trainer and the update it keeps between the two phases of a round) and registers
//! them with the server in one message. A client is an actor only while it has work: the host
//! lends one of its client actors the client's state for one request, the actor answers the
//! server on the request's own reply port and comes back to the host for the next client's
//! request. An idle client therefore costs a map entry, not an actor with two mailboxes, and a
//! million registered clients fit in a few hundred megabytes; and a request costs two
//! messages, not an actor's spawn and stop (a fifth of the runtime's time per client when each
//! request had an actor of its own; docs/performance.md, "Orchestration overhead").
//!
//! The host supervises the client actors it spawns: a panic in local training fails the actor,
//! which has already answered `Failed { panicked: true }`, so the round counts the failure; the
//! client's data stays with the host and the client trains again when next asked. The server
//! never holds a trainer; whichever node hosts a client builds its trainer from the config and
//! the client id.

use crate::client::{ClientActor, ClientArgs, ClientMsg, ClientReply, Job, Kept};
use crate::server::ServerMsg;
use crate::variates::ClientVariates;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::{ClientId, LocalTrainer};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// Client actors a host keeps at most, working or idle; further work waits in the host's queue
/// as its message alone. Each actor owns two unbounded tokio channels whose first blocks of 32
/// slots (~7.4 KB) are allocated when it is spawned, so this bounds what a round of 100 000
/// clients holds in mailboxes to ~2.5 MB. It is well above the number of clients that compute at once
/// (local training runs one client per core; fedshard's runtime has 64 blocking threads).
pub const WORKING_CLIENTS: usize = 256;

/// What a client host handles.
pub enum HostMsg {
    /// `work` for the hosted client `client`: a client actor does it as the client and answers
    /// on the message's own reply port. Work for a client that is not hosted here is
    /// dropped with its reply port, so the asker counts the client `unreachable`.
    Work { client: ClientId, work: ClientMsg },
    /// From a client actor: its request is done, and it takes the next.
    Done(ActorRef<Job>),
    /// From a client actor: what it keeps for the next request of the round (a later `Upload`
    /// or `Secure` step, which the host's mailbox delivers after this message because the
    /// client sends it before it answers).
    Keep { client: ClientId, kept: Kept },
    /// From a client actor under SCAFFOLD: its control variate after training round `round`,
    /// kept for its later tasks. The client waits for `stored` before it answers, so the
    /// variate is on disk before the server can fold the round and checkpoint it; an `Err`
    /// (the file could not be written) fails the client's round.
    Variate {
        client: ClientId,
        round: u64,
        variate: ModelState,
        stored: RpcReplyPort<Result<(), String>>,
    },
}

/// How the server addresses one client: the host that keeps it, and its id there.
#[derive(Clone)]
pub struct ClientHandle {
    pub host: ActorRef<HostMsg>,
    pub client: ClientId,
}

pub struct ClientHost;

/// A hosted client's lasting state.
struct Hosted {
    trainer: Arc<dyn LocalTrainer>,
    /// What the client keeps between two requests of a round.
    kept: Option<Kept>,
    /// Whether a client actor is working as the client: a client works on one request at a
    /// time.
    working: bool,
}

pub struct HostState {
    clients: BTreeMap<ClientId, Hosted>,
    /// SCAFFOLD's variates of the hosted clients (empty without SCAFFOLD).
    variates: ClientVariates,
    /// The client actors at work, and the client each works as.
    working: HashMap<ActorId, ClientId>,
    /// The client actors waiting for work.
    idle: Vec<ActorRef<Job>>,
    /// Work not yet started, oldest first.
    waiting: VecDeque<(ClientId, ClientMsg)>,
}

impl HostState {
    /// Starts waiting work while fewer than [`WORKING_CLIENTS`] actors are alive, skipping over
    /// (and keeping) work for clients whose actor is still busy.
    async fn start_waiting(&mut self, host: &ActorRef<HostMsg>) {
        let mut i = 0;
        while self.working.len() < WORKING_CLIENTS && i < self.waiting.len() {
            let busy = self
                .clients
                .get(&self.waiting[i].0)
                .is_some_and(|c| c.working);
            if busy {
                i += 1;
                continue;
            }
            if let Some((client, work)) = self.waiting.remove(i) {
                self.start(client, work, host).await;
            }
        }
    }

    /// Ends the work of the client actor `actor`, if it was at work: its client can take its
    /// next request. The client it worked as.
    fn release(&mut self, actor: ActorId) -> Option<ClientId> {
        let client = self.working.remove(&actor)?;
        if let Some(hosted) = self.clients.get_mut(&client) {
            hosted.working = false;
        }
        Some(client)
    }

    /// Hands `work` to an idle client actor, or one spawned under the host, as `client`. Work
    /// that cannot start is dropped with its reply port, so the asker counts the client
    /// `unreachable`.
    async fn start(&mut self, client: ClientId, work: ClientMsg, host: &ActorRef<HostMsg>) {
        let Some(hosted) = self.clients.get_mut(&client) else {
            tracing::warn!(client, "work for a client this host does not keep; dropped");
            return;
        };
        // Only an upload or a secure step needs what was kept; a new training drops it, and
        // under SCAFFOLD it is lent the client's variate from before its round.
        let (kept, variate) = match &work {
            ClientMsg::Upload { .. } | ClientMsg::Secure { .. } => (hosted.kept.take(), None),
            ClientMsg::Train { task, .. } if task.variates.is_some() => {
                match self.variates.lend(client, task.round) {
                    Ok(variate) => (None, variate),
                    Err(e) => {
                        if let ClientMsg::Train { reply, .. } = work {
                            let _ = reply.send(ClientReply::Failed {
                                client,
                                reason: e.to_string(),
                                panicked: false,
                            });
                        }
                        return;
                    }
                }
            }
            ClientMsg::Train { .. } => (None, None),
        };
        let args = ClientArgs {
            id: client,
            trainer: Arc::clone(&hosted.trainer),
            kept,
            variate,
        };
        let worker = match self.idle.pop() {
            Some(worker) => worker,
            None => {
                match Actor::spawn_linked(None, ClientActor, host.clone(), host.get_cell()).await {
                    Ok((worker, _)) => worker,
                    Err(e) => {
                        tracing::error!(client, "cannot start a client actor: {e}");
                        return;
                    }
                }
            }
        };
        hosted.working = true;
        self.working.insert(worker.get_id(), client);
        if worker.send_message(Job { args, work }).is_err() {
            tracing::error!(client, "the client actor stopped before it got its work");
        }
    }
}

impl Actor for ClientHost {
    type Msg = HostMsg;
    type State = HostState;
    /// The server to register with, the trainers of the hosted clients and, under SCAFFOLD,
    /// where their variates are kept.
    type Arguments = (
        ActorRef<ServerMsg>,
        BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
        ClientVariates,
    );

    /// Registers every hosted client with `server` in one message before the host takes work.
    async fn pre_start(
        &self,
        myself: ActorRef<HostMsg>,
        (server, trainers, variates): Self::Arguments,
    ) -> Result<HostState, ActorProcessingErr> {
        server.send_message(ServerMsg::Register {
            clients: trainers.keys().copied().collect(),
            host: myself,
        })?;
        let clients = trainers
            .into_iter()
            .map(|(id, trainer)| {
                let hosted = Hosted {
                    trainer,
                    kept: None,
                    working: false,
                };
                (id, hosted)
            })
            .collect();
        Ok(HostState {
            clients,
            variates,
            working: HashMap::new(),
            idle: Vec::new(),
            waiting: VecDeque::new(),
        })
    }

    /// The client actors go with the host.
    async fn post_stop(
        &self,
        myself: ActorRef<HostMsg>,
        _state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        myself.stop_children(None);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<HostMsg>,
        message: HostMsg,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            HostMsg::Work { client, work } => {
                state.waiting.push_back((client, work));
                state.start_waiting(&myself).await;
            }
            HostMsg::Done(worker) => {
                if state.release(worker.get_id()).is_some() {
                    state.idle.push(worker);
                }
                state.start_waiting(&myself).await;
            }
            HostMsg::Keep { client, kept } => {
                if let Some(hosted) = state.clients.get_mut(&client) {
                    hosted.kept = Some(kept);
                }
            }
            HostMsg::Variate {
                client,
                round,
                variate,
                stored,
            } => {
                let kept = state.variates.store(client, round, variate);
                let _ = stored.send(kept.map_err(|e| e.to_string()));
            }
        }
        Ok(())
    }

    /// A client actor that failed (a panic in local training, whose failure its answer already
    /// reported) or stopped frees its place for waiting work; the client keeps its data here
    /// and trains again when next asked.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<HostMsg>,
        event: SupervisionEvent,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(actor) = stopped_actor(&event) else {
            return Ok(());
        };
        state.idle.retain(|idle| idle.get_id() != actor);
        let Some(client) = state.release(actor) else {
            return Ok(());
        };
        if let SupervisionEvent::ActorFailed(_, reason) = &event {
            tracing::warn!(
                client,
                "client actor failed ({reason}); it trains again when next asked"
            );
        }
        state.start_waiting(&myself).await;
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::client::AfterTraining;
    use crate::client::tests::{Shift, task};
    use fedshard_protocol::task::{TrainError, TrainOutput, TrainTask};
    use ractor::rpc::CallResult;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::mpsc;

    /// Stands in for the server: passes on each registration.
    struct Registrar;

    impl Actor for Registrar {
        type Msg = ServerMsg;
        type State = mpsc::UnboundedSender<Vec<ClientId>>;
        type Arguments = mpsc::UnboundedSender<Vec<ClientId>>;

        async fn pre_start(
            &self,
            _myself: ActorRef<ServerMsg>,
            registered: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(registered)
        }

        async fn handle(
            &self,
            _myself: ActorRef<ServerMsg>,
            message: ServerMsg,
            registered: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let ServerMsg::Register { clients, .. } = message {
                let _ = registered.send(clients);
            }
            Ok(())
        }
    }

    /// A host of `trainers` and the clients it registered.
    pub(crate) async fn host(
        trainers: BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
    ) -> (ActorRef<HostMsg>, Vec<ClientId>) {
        let (registered, mut registrations) = mpsc::unbounded_channel();
        let (server, _) = Actor::spawn(None, Registrar, registered).await.unwrap();
        let (host, _) = Actor::spawn(
            None,
            ClientHost,
            (server, trainers, ClientVariates::in_memory()),
        )
        .await
        .unwrap();
        (host, registrations.recv().await.unwrap())
    }

    fn hosting(clients: &[(ClientId, f32)]) -> BTreeMap<ClientId, Arc<dyn LocalTrainer>> {
        clients
            .iter()
            .map(|&(id, step)| (id, Arc::new(Shift(step)) as Arc<dyn LocalTrainer>))
            .collect()
    }

    async fn train(
        host: &ActorRef<HostMsg>,
        client: ClientId,
        round: u64,
        upload: bool,
    ) -> CallResult<ClientReply> {
        let work = |reply| HostMsg::Work {
            client,
            work: ClientMsg::Train {
                task: task(round),
                then: if upload {
                    AfterTraining::Upload
                } else {
                    AfterTraining::Keep
                },
                reply,
            },
        };
        host.call(work, None).await.unwrap()
    }

    async fn upload(host: &ActorRef<HostMsg>, client: ClientId, round: u64) -> ClientReply {
        let work = |reply| HostMsg::Work {
            client,
            work: ClientMsg::Upload { round, reply },
        };
        match host.call(work, None).await.unwrap() {
            CallResult::Success(reply) => reply,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_host_registers_its_clients_at_once_and_drops_work_for_others() {
        let (host, registered) = host(hosting(&[(7, 0.5), (3, 0.5)])).await;
        assert_eq!(registered, [3, 7]);
        // The reply port is dropped: the server counts the client `unreachable`.
        assert!(matches!(
            train(&host, 9, 1, true).await,
            CallResult::SenderError
        ));
    }

    #[tokio::test]
    async fn a_kept_update_outlives_its_actor_and_is_released_for_its_round_only() {
        let (host, _) = host(hosting(&[(7, 0.5)])).await;
        let trained = train(&host, 7, 4, false).await;
        assert!(matches!(
            trained,
            CallResult::Success(ClientReply::Trained {
                client: 7,
                update_norm: 1.0
            })
        ));
        let wrong = upload(&host, 7, 5).await;
        assert!(matches!(
            wrong,
            ClientReply::Failed {
                panicked: false,
                ..
            }
        ));
        // A request for another round still discards the kept update, so no later request,
        // replayed or not, can release an update from an earlier round.
        let again = upload(&host, 7, 4).await;
        assert!(matches!(again, ClientReply::Failed { .. }));
        train(&host, 7, 6, false).await;
        match upload(&host, 7, 6).await {
            ClientReply::Update(e) => assert_eq!((e.client, e.round), (7, 6)),
            other => panic!("{other:?}"),
        }
    }

    /// Panics the first time it trains, then returns its task.
    struct PanicsOnce(AtomicBool);

    impl LocalTrainer for PanicsOnce {
        fn samples(&self) -> u64 {
            1
        }
        fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
            assert!(self.0.swap(true, Ordering::SeqCst), "first training panics");
            Ok(TrainOutput {
                dense: task.dense.clone(),
                shards: vec![],
                loss: 0.0,
                control: None,
            })
        }
    }

    #[tokio::test]
    async fn a_client_that_panicked_trains_again_when_next_asked() {
        let trainer = Arc::new(PanicsOnce(AtomicBool::new(false))) as Arc<dyn LocalTrainer>;
        let (host, _) = host(BTreeMap::from([(7, trainer)])).await;
        match train(&host, 7, 1, true).await {
            CallResult::Success(ClientReply::Failed { panicked, .. }) => assert!(panicked),
            other => panic!("{other:?}"),
        }
        match train(&host, 7, 2, true).await {
            CallResult::Success(ClientReply::Update(e)) => assert_eq!(e.round, 2),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn more_work_than_working_clients_is_all_answered_in_turn() {
        let n = 2 * WORKING_CLIENTS as ClientId + 1;
        let clients: Vec<(ClientId, f32)> = (0..n).map(|id| (id, 0.5)).collect();
        let (host, _) = host(hosting(&clients)).await;
        let mut asked = tokio::task::JoinSet::new();
        // Client 0 twice at once: its second request waits for its first to finish.
        for client in (0..n).chain([0]) {
            let host = host.clone();
            asked.spawn(async move { train(&host, client, 1, true).await });
        }
        let mut answered = 0;
        while let Some(answer) = asked.join_next().await {
            assert!(matches!(
                answer.unwrap(),
                CallResult::Success(ClientReply::Update(_))
            ));
            answered += 1;
        }
        assert_eq!(answered, n + 1);
        // The client actors were lent again and again, never more than the bound at once, and
        // go with the host.
        let workers = host.get_children();
        assert!(
            (1..=WORKING_CLIENTS).contains(&workers.len()),
            "{}",
            workers.len()
        );
        host.stop_and_wait(None, None).await.unwrap();
        for worker in workers {
            worker.wait(None).await.unwrap();
        }
    }
}
