//! The server node's side: a [`Gateway`] actor that stands in for every remote client.
//!
//! The gateway registers the clients each node hosts with the `Server` actor as a local client
//! host would, naming as their host one [`RemoteHosts`] actor, which speaks the ordinary
//! `HostMsg` protocol. The server's requests to it come back to the gateway as
//! [`GatewayMsg::Dispatch`]; the gateway frames them for the node hosting that client and keeps
//! the reply port until the node answers. Nothing else changes for the server: a node that
//! misses the deadline is the server's own `timeout`, a node that is lost drops its reply ports
//! and the server counts `unreachable` at once, without waiting for the deadline.
//!
//! Every frame from a node is checked here before anything reaches the server
//! (`GatewayState::check_reply`): it must decode, carry the session key of a registered node
//! that is still connected, answer for a client that node hosts a request outstanding for
//! exactly that client on exactly that node, and for the round that request was for. Anything
//! else is counted and dropped, and the request stays open for the true answer. A hello must
//! come with the key of an agent that joined its process group over a live session, for
//! clients of the federation with the server's own sample counts, not hosted by another
//! connected node.

mod membership;
mod remote_hosts;

pub use remote_hosts::RemoteHosts;

use crate::message::frame_message;
use crate::metrics::{ClusterMetrics, RejectionLog};
use crate::model_spec::ModelSpec;
use crate::node::SessionEvent;
use crate::request::{Request, reply_client};
use crate::wire::{self, Body, Rejection, RejectionKind as K, SessionKey};
use fedshard_actors::client::ClientReply;
use fedshard_actors::host::HostMsg;
use fedshard_actors::server::ServerMsg;
use fedshard_protocol::task::{ClientId, Recipe};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use ractor_cluster::NodeId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// What the gateway handles.
pub enum GatewayMsg {
    /// A frame from a client node (or from anyone who holds the secret): decoded and checked
    /// here.
    Frame(Vec<u8>),
    /// A remote message that is not a frame cast: counted and dropped.
    Foreign(&'static str),
    /// From [`RemoteHosts`]: send this request to the node hosting its client.
    Dispatch {
        request: Request,
        reply: RpcReplyPort<ClientReply>,
    },
    /// A session of this node opened, authenticated or closed.
    Session(SessionEvent),
    /// The run is over after `rounds` rounds: tell every node, and answer how many were told.
    /// From now on every hello is answered [`Body::Over`].
    Finish {
        rounds: u64,
        error: Option<String>,
        told: RpcReplyPort<usize>,
    },
    /// How many nodes the end of the run has still to reach: registered nodes that have not
    /// left, and nodes lost during the run that have not come back to hear it is over.
    Waiting(RpcReplyPort<usize>),
}

frame_message!(GatewayMsg);

/// The gateway actor (spawn it before the node starts accepting, so the first session's
/// process-group exchange already carries it).
pub struct Gateway;

pub struct GatewayArgs {
    pub server: ActorRef<ServerMsg>,
    /// Every client of the federation with its sample count D_c, from the server's registry.
    pub expected: BTreeMap<ClientId, u64>,
    /// The server's round deadline, passed on so a client node stops waiting when it does.
    pub deadline: Duration,
    /// The largest frame accepted ([`wire::frame_limit`]).
    pub frame_limit: usize,
    pub metrics: ClusterMetrics,
    /// The server's training recipe (base learning rate), told to every node it welcomes.
    pub recipe: Recipe,
    /// The server's model; a hello with another is refused.
    pub model: ModelSpec,
}

/// A registered client node.
struct Node {
    name: String,
    /// ractor_cluster's id of the session that carries it.
    session: NodeId,
    agent: ActorRef<crate::agent::AgentMsg>,
    clients: BTreeSet<ClientId>,
}

/// A request sent and not yet answered.
struct Pending {
    client: ClientId,
    key: SessionKey,
    round: u64,
    reply: RpcReplyPort<ClientReply>,
}

pub struct GatewayState {
    args: GatewayArgs,
    nodes: HashMap<SessionKey, Node>,
    owners: BTreeMap<ClientId, SessionKey>,
    /// The host the server addresses for every remote client.
    remote_hosts: ActorRef<HostMsg>,
    pending: HashMap<u64, Pending>,
    /// Random start, so an answer to a request of an earlier server process never matches.
    next_request: u64,
    /// Size of `pending` at which expired requests are next swept out.
    sweep_at: usize,
    /// Sessions by id: whether each authenticated, and its peer address.
    sessions: HashMap<NodeId, (bool, String)>,
    started: bool,
    /// The run is over (its rounds, and its error if it failed): nodes leaving is expected,
    /// and a hello is answered [`Body::Over`].
    ended: Option<(u64, Option<String>)>,
    /// Names of nodes lost during the run that have not registered again: the end of the run
    /// waits a while for them to come back and hear it is over.
    absent: BTreeSet<String>,
    /// Agents of nodes whose every client another node of the same name took over, still
    /// connected: told when the run ends, as registered nodes are (at most [`membership::MAX_DISPLACED`]).
    displaced: Vec<ActorRef<crate::agent::AgentMsg>>,
    /// Every client node was lost mid-run and the server holds its rounds
    /// ([`ServerMsg::Hold`]) until one registers again.
    holding: bool,
    log: RejectionLog,
}

impl Actor for Gateway {
    type Msg = GatewayMsg;
    type State = GatewayState;
    type Arguments = GatewayArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: GatewayArgs,
    ) -> Result<GatewayState, ActorProcessingErr> {
        let (remote_hosts, _) =
            Actor::spawn_linked(None, RemoteHosts, myself.clone(), myself.get_cell()).await?;
        ractor::pg::join(crate::GATEWAY_GROUP.to_string(), vec![myself.get_cell()]);
        Ok(GatewayState {
            args,
            nodes: HashMap::new(),
            owners: BTreeMap::new(),
            remote_hosts,
            pending: HashMap::new(),
            next_request: rand::random::<u64>() >> 1,
            sweep_at: 64,
            sessions: HashMap::new(),
            started: false,
            ended: None,
            absent: BTreeSet::new(),
            displaced: Vec::new(),
            holding: false,
            log: RejectionLog::default(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        state.remote_hosts.stop(None);
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: GatewayMsg,
        state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            GatewayMsg::Frame(bytes) => {
                state.args.metrics.bytes_in(bytes.len());
                if let Err(rejection) = state.receive(&bytes) {
                    state.args.metrics.reject(rejection.kind);
                    state.log.log("gateway", &rejection);
                }
            }
            GatewayMsg::Foreign(what) => {
                let rejection = Rejection::new(K::Unexpected, what);
                state.args.metrics.reject(rejection.kind);
                state.log.log("gateway", &rejection);
            }
            GatewayMsg::Dispatch { request, reply } => state.dispatch(request, reply),
            GatewayMsg::Session(event) => state.session(event),
            GatewayMsg::Finish {
                rounds,
                error,
                told,
            } => {
                let frame = wire::encode(&Body::Finished {
                    error: error.clone(),
                });
                state.ended = Some((rounds, error));
                let displaced = std::mem::take(&mut state.displaced);
                let agents = state.nodes.values().map(|n| &n.agent).chain(&displaced);
                for agent in agents {
                    state.args.metrics.bytes_out(frame.len());
                    let _ = agent.cast(crate::agent::AgentMsg::Frame(frame.clone()));
                }
                let _ = told.send(state.nodes.len());
            }
            GatewayMsg::Waiting(reply) => {
                let _ = reply.send(state.nodes.len() + state.absent.len());
            }
        }
        Ok(())
    }

    /// [`RemoteHosts`] never stops on its own; nothing to supervise. (The default would stop
    /// the gateway when a child stops.)
    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        _event: SupervisionEvent,
        _state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

impl GatewayState {
    /// Sends `request` to the node hosting its client and keeps `reply` until that node
    /// answers. With no node hosting the client, `reply` is dropped: the server counts the
    /// client `unreachable` right away.
    fn dispatch(&mut self, request: Request, reply: RpcReplyPort<ClientReply>) {
        // The server stops waiting at its deadline and drops its receiver; forget those, in
        // sweeps whose cost is amortised over the dispatches since the last one.
        if self.pending.len() >= self.sweep_at {
            self.pending.retain(|_, p| !p.reply.is_closed());
            self.sweep_at = (2 * self.pending.len()).max(64);
        }
        let client = request.client();
        let Some(node) = self
            .owners
            .get(&client)
            .and_then(|k| Some((*k, self.nodes.get(k)?)))
        else {
            tracing::debug!(client, "no node hosts this client now");
            return;
        };
        let (key, node) = node;
        self.next_request = self.next_request.wrapping_add(1);
        let id = self.next_request;
        let deadline_ms = u64::try_from(self.args.deadline.as_millis()).unwrap_or(u64::MAX);
        let round = request.round();
        let body = match request {
            Request::Train(train) => Body::Train {
                request: id,
                deadline_ms,
                train,
            },
            Request::Upload { client, round } => Body::Upload {
                request: id,
                deadline_ms,
                client,
                round,
            },
            Request::Secure {
                client,
                round,
                step,
            } => Body::Secure {
                request: id,
                deadline_ms,
                client,
                round,
                step,
            },
        };
        let frame = wire::encode(&body);
        self.args.metrics.bytes_out(frame.len());
        if let Err(e) = node.agent.cast(crate::agent::AgentMsg::Frame(frame)) {
            tracing::warn!(client, node = %node.name, "cannot reach the node: {e}");
            return;
        }
        self.pending.insert(
            id,
            Pending {
                client,
                key,
                round,
                reply,
            },
        );
    }

    /// Decodes and acts on one frame from a client node.
    fn receive(&mut self, bytes: &[u8]) -> Result<(), Rejection> {
        match wire::decode(bytes, self.args.frame_limit)? {
            Body::Hello(hello) => self.hello(hello),
            Body::Reply {
                key,
                request,
                reply,
            } => {
                let client = reply_client(&reply);
                let round = match &reply {
                    ClientReply::Update(envelope) => Some(envelope.round),
                    _ => None,
                };
                let pending = self.check_reply(key, request, client, round)?;
                if let (Some(round), Some(node)) = (round, self.nodes.get(&key)) {
                    self.args.metrics.node_answered(&node.name, round);
                }
                let _ = pending.reply.send(reply);
                Ok(())
            }
            Body::Unreachable {
                key,
                request,
                client,
                reason,
            } => {
                // Dropping the port makes the server count the client `unreachable`.
                self.check_reply(key, request, client, None)?;
                tracing::warn!(client, "the client's node could not ask it: {reason}");
                Ok(())
            }
            other => Err(Rejection::new(
                K::Unexpected,
                format!(
                    "a {} frame is sent by the server, never to it",
                    other.kind()
                ),
            )),
        }
    }

    /// Checks that an answer from the holder of `key` about `client` answers the outstanding
    /// `request`, and takes that request. On a rejection the request stays outstanding.
    fn check_reply(
        &mut self,
        key: SessionKey,
        request: u64,
        client: ClientId,
        round: Option<u64>,
    ) -> Result<Pending, Rejection> {
        let node = self
            .nodes
            .get(&key)
            .ok_or_else(|| Rejection::new(K::Forged, "unknown session key"))?;
        if !node.clients.contains(&client) {
            return Err(Rejection::new(
                K::Forged,
                format!(
                    "node '{}' answered for client {client}, which it does not host",
                    node.name
                ),
            ));
        }
        let pending = self.pending.get(&request).ok_or_else(|| {
            Rejection::new(
                K::Stale,
                format!("client {client}: request {request} is not outstanding (answered, expired, or never sent)"),
            )
        })?;
        if pending.key != key || pending.client != client {
            return Err(Rejection::new(
                K::Forged,
                format!(
                    "request {request} went to client {} on another session, not to client {client}",
                    pending.client
                ),
            ));
        }
        if let Some(round) = round
            && round != pending.round
        {
            return Err(Rejection::new(
                K::Stale,
                format!(
                    "client {client}: update for round {round}, the request was for round {}",
                    pending.round
                ),
            ));
        }
        self.pending
            .remove(&request)
            .ok_or_else(|| Rejection::new(K::Stale, "request vanished"))
    }

    fn send(&self, agent: &ActorRef<crate::agent::AgentMsg>, body: &Body) {
        let frame = wire::encode(body);
        self.args.metrics.bytes_out(frame.len());
        let _ = agent.cast(crate::agent::AgentMsg::Frame(frame));
    }
}

/// The server node's gateway as this (client) node sees it, once a session has carried its
/// process group here.
pub fn remote_gateway() -> Option<ActorRef<GatewayMsg>> {
    ractor::pg::get_members(&crate::GATEWAY_GROUP.to_string())
        .into_iter()
        .find(|cell| !cell.get_id().is_local())
        .map(ActorRef::from)
}
