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

use crate::message::frame_message;
use crate::metrics::{ClusterMetrics, RejectionLog};
use crate::model_spec::ModelSpec;
use crate::node::SessionEvent;
use crate::request::{Request, reply_client};
use crate::wire::{self, Body, Hello, Rejection, RejectionKind as K, SessionKey};
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
    /// connected: told when the run ends, as registered nodes are (at most [`MAX_DISPLACED`]).
    displaced: Vec<ActorRef<crate::agent::AgentMsg>>,
    /// Every client node was lost mid-run and the server holds its rounds
    /// ([`ServerMsg::Hold`]) until one registers again.
    holding: bool,
    log: RejectionLog,
}

/// Displaced agents remembered at most: a node displaced over and over (a restart loop)
/// must not grow the gateway's memory.
const MAX_DISPLACED: usize = 64;

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

    /// Registers a node's clients, or refuses the hello and tells the node why.
    fn hello(&mut self, hello: Hello) -> Result<(), Rejection> {
        let agent = find_agent(hello.key)?;
        if let Some((rounds, error)) = &self.ended {
            check_name(&hello.node)?;
            self.absent.remove(&hello.node);
            tracing::info!(
                "node '{}' said hello after the run ended; told it so",
                hello.node
            );
            let over = Body::Over {
                key: hello.key,
                rounds: *rounds,
                error: error.clone(),
            };
            self.send(&agent, &over);
            return Ok(());
        }
        match self.accept(&hello, agent.clone()) {
            Ok(()) => {
                self.register(&hello);
                let welcome = Body::Welcome {
                    key: hello.key,
                    recipe: self.args.recipe.clone(),
                };
                self.send(&agent, &welcome);
                Ok(())
            }
            Err(rejection) => {
                self.send(
                    &agent,
                    &Body::Refused {
                        key: hello.key,
                        reason: rejection.reason.clone(),
                    },
                );
                Err(rejection)
            }
        }
    }

    /// Checks a hello against the federation and the nodes already registered, and records it.
    fn accept(
        &mut self,
        hello: &Hello,
        agent: ActorRef<crate::agent::AgentMsg>,
    ) -> Result<(), Rejection> {
        let session = match agent.get_id() {
            ractor::ActorId::Remote { node_id, .. } => node_id,
            ractor::ActorId::Local(_) => {
                return Err(Rejection::new(K::Forged, "the agent of this key is local"));
            }
        };
        check_name(&hello.node)?;
        if let Some(reason) = self.args.model.refusal(&hello.model) {
            return Err(Rejection::new(K::Refused, reason));
        }
        if hello.clients.is_empty() {
            return Err(Rejection::new(K::Malformed, "a hello with no clients"));
        }
        let mut ids = BTreeSet::new();
        for &(client, samples) in &hello.clients {
            if !ids.insert(client) {
                return Err(Rejection::new(
                    K::Malformed,
                    format!("client {client} appears twice"),
                ));
            }
            let Some(&expected) = self.args.expected.get(&client) else {
                return Err(Rejection::new(
                    K::Refused,
                    format!(
                        "client {client} is not in the server's federation ({} clients)",
                        self.args.expected.len()
                    ),
                ));
            };
            if samples != expected {
                return Err(Rejection::new(
                    K::Refused,
                    format!(
                        "client {client} trains on {samples} samples on node '{}' but on {expected} in the \
                         server's config: the nodes were started from different configs (or seeds)",
                        hello.node
                    ),
                ));
            }
            if let Some(owner) = self.owners.get(&client).and_then(|k| self.nodes.get(k))
                && owner.name != hello.node
            {
                return Err(Rejection::new(
                    K::Forged,
                    format!(
                        "client {client} is hosted by node '{}', which is connected; node '{}' cannot take it",
                        owner.name, hello.node
                    ),
                ));
            }
        }
        // A node that restarted under its name takes its clients back from its old session.
        for client in &ids {
            if let Some(old) = self.owners.insert(*client, hello.key)
                && old != hello.key
            {
                self.release(old, *client);
            }
        }
        self.nodes.insert(
            hello.key,
            Node {
                name: hello.node.clone(),
                session,
                agent,
                clients: ids,
            },
        );
        Ok(())
    }

    /// Registers a node's clients with the server, and starts the first round once every
    /// client of the federation is there.
    fn register(&mut self, hello: &Hello) {
        let ids: Vec<ClientId> = hello.clients.iter().map(|c| c.0).collect();
        let peer = self
            .nodes
            .get(&hello.key)
            .and_then(|n| self.sessions.get(&n.session))
            .map_or("", |s| s.1.as_str());
        self.args.metrics.node_registered(&hello.node, peer);
        self.publish(&hello.node);
        let _ = self.args.server.send_message(ServerMsg::Register {
            clients: ids.clone(),
            host: self.remote_hosts.clone(),
        });
        self.absent.remove(&hello.node);
        self.args.metrics.set_clients(self.owners.len());
        tracing::info!(
            node = %hello.node,
            "node registered {} client(s) {}; {}/{} clients present",
            ids.len(),
            crate::join::format_ids(&ids),
            self.owners.len(),
            self.args.expected.len()
        );
        if self.holding {
            self.holding = false;
            tracing::info!("a client node is back; the rounds go on");
            let _ = self.args.server.send_message(ServerMsg::Start);
        }
        if !self.started && self.owners.len() == self.args.expected.len() {
            self.started = true;
            tracing::info!("every client is registered; starting the run");
            let _ = self.args.server.send_message(ServerMsg::Start);
        }
    }

    /// Forgets that the node of `key` hosts `client`: its outstanding requests for that client
    /// are dropped (the server counts them `unreachable`).
    fn release(&mut self, key: SessionKey, client: ClientId) {
        if let Some(node) = self.nodes.get_mut(&key) {
            node.clients.remove(&client);
            if node.clients.is_empty()
                && let Some(gone) = self.nodes.remove(&key)
                && self.displaced.len() < MAX_DISPLACED
            {
                self.displaced.push(gone.agent);
            }
        }
        self.pending
            .retain(|_, p| !(p.key == key && p.client == client));
    }

    fn session(&mut self, event: SessionEvent) {
        match event {
            SessionEvent::Opened { node, peer } => {
                self.sessions.insert(node, (false, peer));
            }
            SessionEvent::Authenticated { node, peer } => {
                tracing::info!("node session from {peer} authenticated");
                self.sessions.insert(node, (true, peer));
                self.args.metrics.session_up();
            }
            SessionEvent::Disconnected { node, peer } => {
                let authenticated = self.sessions.remove(&node).is_some_and(|s| s.0);
                if !authenticated {
                    // Counted and logged by the listener (`crate::acceptor`), with its reason.
                    return;
                }
                self.args.metrics.session_lost();
                let lost: Vec<SessionKey> = self
                    .nodes
                    .iter()
                    .filter(|(_, n)| n.session == node)
                    .map(|(k, _)| *k)
                    .collect();
                for key in lost {
                    if let Some(gone) = self.nodes.remove(&key) {
                        let ids: Vec<ClientId> = gone.clients.iter().copied().collect();
                        for client in &ids {
                            if self.owners.get(client) == Some(&key) {
                                self.owners.remove(client);
                            }
                        }
                        self.pending.retain(|_, p| p.key != key);
                        self.publish(&gone.name);
                        if self.ended.is_some() {
                            tracing::info!("node '{}' ({peer}) left", gone.name);
                        } else {
                            self.absent.insert(gone.name.clone());
                            tracing::warn!(
                                "lost node '{}' ({peer}); its clients {} are unreachable until it registers again",
                                gone.name,
                                crate::join::format_ids(&ids)
                            );
                        }
                    }
                }
                self.args.metrics.set_clients(self.owners.len());
                if self.started && self.ended.is_none() && !self.holding && self.owners.is_empty() {
                    // Rounds that no client can answer would only burn the run's rounds.
                    self.holding = true;
                    tracing::warn!(
                        "every client node is gone; the rounds wait until one registers again"
                    );
                    let _ = self.args.server.send_message(ServerMsg::Hold);
                }
            }
        }
    }

    /// Tells the live page whether the node called `name` is connected and how many clients
    /// it hosts now.
    fn publish(&self, name: &str) {
        let sessions = self.nodes.values().filter(|n| n.name == name);
        let clients = sessions.clone().map(|n| n.clients.len()).sum();
        self.args
            .metrics
            .node_now(name, sessions.count() > 0, clients);
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

/// The one remote agent in the process group of `key`.
fn find_agent(key: SessionKey) -> Result<ActorRef<crate::agent::AgentMsg>, Rejection> {
    let members: Vec<_> = ractor::pg::get_members(&crate::agent_group(key))
        .into_iter()
        .filter(|cell| !cell.get_id().is_local())
        .collect();
    match members.as_slice() {
        [agent] => Ok(agent.clone().into()),
        [] => Err(Rejection::new(
            K::Forged,
            "a hello whose key no connected node's agent holds",
        )),
        _ => Err(Rejection::new(
            K::Forged,
            "a hello whose key several agents hold",
        )),
    }
}

/// A node name is printable and short, since it goes into logs.
fn check_name(name: &str) -> Result<(), Rejection> {
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(Rejection::new(
            K::Malformed,
            "a node name must be 1 to 128 printable characters",
        ));
    }
    Ok(())
}

/// The remote clients' host as the server sees it: a `HostMsg` actor whose every request goes
/// to the gateway, which frames it for the node that hosts the client.
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
            // Only a client actor this host spawned keeps an update with it; a remote client's
            // node keeps its own.
            HostMsg::Keep { client, .. } => {
                tracing::warn!(
                    client,
                    "an update to keep sent to the remote clients' host; dropped"
                );
            }
        }
        Ok(())
    }
}
