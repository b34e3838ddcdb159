//! The client node's side: an [`Agent`] that introduces the node's clients to the server and
//! carries the server's requests to them.
//!
//! The clients themselves run exactly as in one process: an ordinary `ClientHost` keeps them,
//! spawns and supervises a client actor for each request, and registers them with what it
//! takes for the server, a [`Relay`] that passes the registration to the agent. The agent
//! watches the server's process group ([`crate::GATEWAY_GROUP`]); whenever a gateway appears
//! (the first connection, or a server that restarted) it says hello with every hosted client,
//! and it answers each request by calling the host with the server's deadline.

use crate::error::Error;
use crate::message::frame_message;
use crate::metrics::{ClusterMetrics, RejectionLog};
use crate::model_spec::ModelSpec;
use crate::request::Request;
use crate::wire::{self, Body, Hello, Rejection, RejectionKind as K, SessionKey};
use fedshard_actors::host::HostMsg;
use fedshard_actors::server::ServerMsg;
use fedshard_protocol::task::{ClientId, Recipe};
use ractor::pg::GroupChangeMessage;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// What the agent handles.
pub enum AgentMsg {
    /// A frame from the server node: decoded and checked here.
    Frame(Vec<u8>),
    /// A remote message that is not a frame cast: counted and dropped.
    Foreign(&'static str),
    /// The client host registered the node's clients.
    Hosted(ActorRef<HostMsg>),
    /// An answer to send to the server.
    Answer(Body),
}

frame_message!(AgentMsg);

pub struct Agent;

pub struct AgentArgs {
    /// The node's stable name (see [`Hello::node`]).
    pub node: String,
    pub key: SessionKey,
    /// The hosted clients and their sample counts.
    pub clients: BTreeMap<ClientId, u64>,
    pub frame_limit: usize,
    pub metrics: ClusterMetrics,
    /// Told when the server says the run is over (`Ok`) or refuses the node (`Err`).
    pub done: oneshot::Sender<Result<(), Error>>,
    /// Receives a copy of every frame the agent sends (tests replay them).
    pub tap: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// This node's training recipe, compared with the server's when it welcomes the node.
    pub recipe: Recipe,
    /// The model this node's config builds, which the server checks against its own.
    pub model: ModelSpec,
}

pub struct AgentState {
    node: String,
    key: SessionKey,
    clients: BTreeMap<ClientId, u64>,
    frame_limit: usize,
    metrics: ClusterMetrics,
    tap: Option<mpsc::UnboundedSender<Vec<u8>>>,
    recipe: Recipe,
    model: ModelSpec,
    done: Option<oneshot::Sender<Result<(), Error>>>,
    host: Option<ActorRef<HostMsg>>,
    gateway: Option<ActorRef<crate::gateway::GatewayMsg>>,
    /// Whether the current gateway has had this node's hello.
    greeted: bool,
    log: RejectionLog,
}

impl Actor for Agent {
    type Msg = AgentMsg;
    type State = AgentState;
    type Arguments = AgentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        args: AgentArgs,
    ) -> Result<AgentState, ActorProcessingErr> {
        ractor::pg::join(crate::agent_group(args.key), vec![myself.get_cell()]);
        ractor::pg::monitor(crate::GATEWAY_GROUP.to_string(), myself.get_cell());
        Ok(AgentState {
            node: args.node,
            key: args.key,
            clients: args.clients,
            frame_limit: args.frame_limit,
            metrics: args.metrics,
            tap: args.tap,
            recipe: args.recipe,
            model: args.model,
            done: Some(args.done),
            host: None,
            gateway: None,
            greeted: false,
            log: RejectionLog::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<AgentMsg>,
        message: AgentMsg,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AgentMsg::Frame(bytes) => {
                state.metrics.bytes_in(bytes.len());
                if let Err(rejection) = state.receive(&bytes, &myself) {
                    state.metrics.reject(rejection.kind);
                    state.log.log("agent", &rejection);
                }
            }
            AgentMsg::Foreign(what) => {
                let rejection = Rejection::new(K::Unexpected, what);
                state.metrics.reject(rejection.kind);
                state.log.log("agent", &rejection);
            }
            AgentMsg::Hosted(host) => {
                state.host = Some(host);
                state.greet();
            }
            AgentMsg::Answer(body) => state.send(&body),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<AgentMsg>,
        event: SupervisionEvent,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ProcessGroupChanged(change) = event {
            let group = match &change {
                GroupChangeMessage::Join(_, group, _) | GroupChangeMessage::Leave(_, group, _) => {
                    group
                }
            };
            if group == crate::GATEWAY_GROUP {
                state.find_gateway();
            }
        }
        Ok(())
    }
}

impl AgentState {
    /// Follows the server's gateway: a new one (a restarted server) gets a fresh hello.
    fn find_gateway(&mut self) {
        let gateway = crate::gateway::remote_gateway();
        let same = match (&gateway, &self.gateway) {
            (Some(a), Some(b)) => a.get_id() == b.get_id(),
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        match &gateway {
            Some(_) => tracing::info!("found the server's gateway"),
            None => tracing::warn!("the server's gateway is gone; waiting for it to come back"),
        }
        self.gateway = gateway;
        self.greeted = false;
        self.greet();
    }

    /// Says hello once the gateway is known and the client host is up.
    fn greet(&mut self) {
        if self.greeted || self.gateway.is_none() || self.host.is_none() {
            return;
        }
        self.greeted = true;
        let hello = Hello {
            node: self.node.clone(),
            key: self.key,
            clients: self.clients.iter().map(|(&c, &s)| (c, s)).collect(),
            model: self.model.clone(),
        };
        self.send(&Body::Hello(hello));
    }

    fn send(&self, body: &Body) {
        let Some(gateway) = &self.gateway else {
            tracing::debug!("no server to send a {} frame to", body.kind());
            return;
        };
        let frame = wire::encode(body);
        self.metrics.bytes_out(frame.len());
        if let Some(tap) = &self.tap {
            let _ = tap.send(frame.clone());
        }
        if let Err(e) = gateway.cast(crate::gateway::GatewayMsg::Frame(frame)) {
            tracing::warn!("cannot reach the server: {e}");
        }
    }

    fn finish(&mut self, result: Result<(), Error>) {
        if let Some(done) = self.done.take() {
            let _ = done.send(result);
        }
    }

    fn receive(&mut self, bytes: &[u8], myself: &ActorRef<AgentMsg>) -> Result<(), Rejection> {
        let key = self.key;
        match wire::decode(bytes, self.frame_limit)? {
            Body::Welcome { key: k, recipe } if k == key => {
                tracing::info!(
                    "the server registered this node's {} client(s)",
                    self.clients.len()
                );
                for difference in recipe_differences(&self.recipe, &recipe) {
                    tracing::warn!(
                        "{difference}: the server's is used (start every node from the server's config)"
                    );
                }
                Ok(())
            }
            Body::Refused { key: k, reason } if k == key => {
                self.finish(Err(Error::Refused(reason)));
                Ok(())
            }
            Body::Over {
                key: k,
                rounds,
                error,
            } if k == key => {
                match &error {
                    None => tracing::info!(
                        "the run finished without this node: the server had ended it after {rounds} \
                         round(s) when this node said hello again"
                    ),
                    Some(e) => tracing::warn!(
                        "the run had failed on the server after {rounds} round(s) when this node \
                         said hello again: {e}"
                    ),
                }
                self.finish(error.map_or(Ok(()), |e| Err(Error::ServerFailed(e))));
                Ok(())
            }
            Body::Welcome { .. } | Body::Refused { .. } | Body::Over { .. } => Err(Rejection::new(
                K::Forged,
                "an answer to another node's hello",
            )),
            Body::Train {
                request,
                deadline_ms,
                train,
            } => self.ask(Request::Train(train), request, deadline_ms, myself),
            Body::Upload {
                request,
                deadline_ms,
                client,
                round,
            } => self.ask(
                Request::Upload { client, round },
                request,
                deadline_ms,
                myself,
            ),
            Body::Secure {
                request,
                deadline_ms,
                client,
                round,
                step,
            } => self.ask(
                Request::Secure {
                    client,
                    round,
                    step,
                },
                request,
                deadline_ms,
                myself,
            ),
            Body::Finished { error } => {
                self.finish(error.map_or(Ok(()), |e| Err(Error::ServerFailed(e))));
                Ok(())
            }
            other => Err(Rejection::new(
                K::Unexpected,
                format!(
                    "a {} frame is sent to the server, never by it",
                    other.kind()
                ),
            )),
        }
    }

    /// Calls the client host with the server's request off the agent's mailbox, and sends the
    /// client's answer back. A client that misses the deadline gets no answer sent: the server has
    /// stopped waiting and counts the timeout itself.
    fn ask(
        &self,
        request: Request,
        id: u64,
        deadline_ms: u64,
        myself: &ActorRef<AgentMsg>,
    ) -> Result<(), Rejection> {
        let client = request.client();
        if !self.clients.contains_key(&client) {
            return Err(Rejection::new(
                K::Forged,
                format!("a request for client {client}, which this node does not host"),
            ));
        }
        let Some(host) = self.host.clone() else {
            return Err(Rejection::new(
                K::Unexpected,
                format!("a request for client {client} before this node's host is up"),
            ));
        };
        let key = self.key;
        let myself = myself.clone();
        tokio::spawn(async move {
            let deadline = Duration::from_millis(deadline_ms);
            let work = |reply| HostMsg::Work {
                client,
                work: request.into_message(reply),
            };
            let result = host.call(work, Some(deadline)).await;
            let unreachable = |reason: String| Body::Unreachable {
                key,
                request: id,
                client,
                reason,
            };
            let answer = match result {
                Ok(CallResult::Success(reply)) => Body::Reply {
                    key,
                    request: id,
                    reply,
                },
                Ok(CallResult::Timeout) => return,
                Ok(CallResult::SenderError) => unreachable("client dropped the reply".into()),
                Err(e) => unreachable(e.to_string()),
            };
            let _ = myself.cast(AgentMsg::Answer(answer));
        });
        Ok(())
    }
}

/// What the client host takes for the server: it passes the host's registration to the agent.
pub struct Relay;

impl Actor for Relay {
    type Msg = ServerMsg;
    type State = ActorRef<AgentMsg>;
    type Arguments = ActorRef<AgentMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<ServerMsg>,
        agent: ActorRef<AgentMsg>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(agent)
    }

    async fn handle(
        &self,
        _myself: ActorRef<ServerMsg>,
        message: ServerMsg,
        agent: &mut ActorRef<AgentMsg>,
    ) -> Result<(), ActorProcessingErr> {
        if let ServerMsg::Register { host, .. } = message {
            agent.cast(AgentMsg::Hosted(host))?;
        }
        Ok(())
    }
}
/// Each field in which the server's training recipe overrules this node's, as
/// `training.FIELD is X in this node's config, Y on the server`.
pub fn recipe_differences(ours: &Recipe, servers: &Recipe) -> Vec<String> {
    // Destructured, so that a new field of `Recipe` cannot be forgotten here.
    let Recipe {
        learning_rate,
        epochs,
        batch_size,
        momentum,
        weight_decay,
        clip_lr,
        proximal_mu,
    } = ours;
    let fields = [
        (
            "learning_rate",
            learning_rate.to_string(),
            servers.learning_rate.to_string(),
        ),
        ("epochs", epochs.to_string(), servers.epochs.to_string()),
        (
            "batch_size",
            batch_size.to_string(),
            servers.batch_size.to_string(),
        ),
        (
            "momentum",
            momentum.to_string(),
            servers.momentum.to_string(),
        ),
        (
            "weight_decay",
            weight_decay.to_string(),
            servers.weight_decay.to_string(),
        ),
        (
            "clip_lr",
            format!("{clip_lr:?}"),
            format!("{:?}", servers.clip_lr),
        ),
        (
            "proximal_mu",
            proximal_mu.to_string(),
            servers.proximal_mu.to_string(),
        ),
    ];
    fields
        .into_iter()
        .filter(|(_, here, there)| here != there)
        .map(|(name, here, there)| {
            format!("training.{name} is {here} in this node's config, {there} on the server")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_the_server_overrules_is_named_with_both_values() {
        let ours = Recipe {
            learning_rate: 0.1,
            epochs: 3,
            ..Recipe::default()
        };
        let servers = Recipe {
            learning_rate: 0.05,
            epochs: 1,
            ..Recipe::default()
        };
        assert_eq!(
            recipe_differences(&ours, &servers),
            [
                "training.learning_rate is 0.1 in this node's config, 0.05 on the server",
                "training.epochs is 3 in this node's config, 1 on the server",
            ]
        );
        assert!(recipe_differences(&servers, &servers).is_empty());
    }
}
