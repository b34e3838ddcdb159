//! A client node: the clients of a federation that this machine hosts, an [`Agent`] that
//! speaks for them, and a ractor_cluster node connected to the server node, reconnected
//! whenever the server comes back after a loss.

use crate::agent::{Agent, AgentArgs, Relay};
use crate::error::Error;
use crate::metrics::ClusterMetrics;
use crate::model_spec::ModelSpec;
use crate::node::{self, ConnectError, NodeSettings, SessionEvent, TlsClient};
use crate::secret::Secret;
use crate::turn_away::{Heard, Marker};
use crate::wire::{self, SessionKey};
use fedshard_actors::host::ClientHost;
use fedshard_actors::variates::ClientVariates;
use fedshard_protocol::task::{ClientId, LocalTrainer, Recipe};
use ractor::Actor;
use ractor_cluster::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// How long a connection may take to authenticate once open.
const HANDSHAKE: Duration = Duration::from_secs(15);

pub struct JoinOptions {
    /// The server node, `HOST:PORT`.
    pub server: String,
    /// This node's stable name: a node restarted under the same name takes its clients back.
    pub node: String,
    pub secret: Secret,
    pub tls: Option<TlsClient>,
    /// Where this node's own ractor_cluster listener binds (it needs one; nothing connects to
    /// it, so loopback and port 0 are the default).
    pub listen: SocketAddr,
    /// Length of the model's `ModelState::to_bytes`, which sizes the frame limits.
    pub model_bytes: usize,
    /// How long to keep trying to reach the server at start.
    pub connect_timeout: Duration,
    /// How long to keep trying to reach the server again after losing it.
    pub reconnect_timeout: Duration,
    pub metrics: ClusterMetrics,
    /// The session key (random when `None`).
    pub key: Option<SessionKey>,
    /// Receives a copy of every frame this node sends.
    pub tap: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// This node's own training recipe, as its config gives it: the server's overrules it, and
    /// every field in which they differ is warned about.
    pub recipe: Recipe,
    /// The model this node's config builds; the server refuses the node if it trains another.
    pub model: ModelSpec,
    /// Under SCAFFOLD, this node's clients' control variates (on disk when the node was given
    /// a folder, so that they survive its restart).
    pub variates: ClientVariates,
}

/// Hosts `trainers`' clients for the server at `options.server` until the server says the run
/// is over (`Ok`), refuses the node, or cannot be reached within the timeouts (`Err`).
pub async fn join(
    mut options: JoinOptions,
    trainers: BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
) -> Result<(), Error> {
    let key = options.key.unwrap_or_else(rand::random::<SessionKey>);
    let variates = std::mem::take(&mut options.variates);
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let settings = NodeSettings {
        name: format!("fedshard-join-{:016x}", key as u64),
        secret: options.secret.clone(),
        listen: options.listen,
        tls: None,
        max_frame: wire::transport_cap(options.model_bytes),
    };
    let node = node::start(settings, move |event| {
        let _ = events_tx.send(event);
    })
    .await?;
    let (done, mut finished) = oneshot::channel();
    let clients = trainers.iter().map(|(&id, t)| (id, t.samples())).collect();
    let spawned = async {
        let (agent, _) = Actor::spawn(
            None,
            Agent,
            AgentArgs {
                node: options.node.clone(),
                key,
                clients,
                frame_limit: wire::frame_limit(options.model_bytes),
                metrics: options.metrics.clone(),
                done,
                tap: options.tap.clone(),
                recipe: options.recipe.clone(),
                model: options.model.clone(),
            },
        )
        .await
        .map_err(|e| started("agent", e))?;
        let (relay, _) = Actor::spawn(None, Relay, agent.clone())
            .await
            .map_err(|e| started("relay", e))?;
        let (host, _) = Actor::spawn(None, ClientHost, (relay.clone(), trainers, variates))
            .await
            .map_err(|e| started("client host", e))?;
        Ok::<_, Error>((agent, relay, host))
    };
    let (agent, relay, host) = match spawned.await {
        Ok(actors) => actors,
        Err(e) => {
            node.stop(None);
            return Err(e);
        }
    };

    let mut budget = options.connect_timeout;
    let mut reconnecting = false;
    let result = loop {
        // The end of the run may arrive while this node reconnects: a frame read before the
        // session closed (the server ended while this machine was frozen), or the server's
        // answer to the new hello. Either ends the attempt.
        let connected = tokio::select! {
            biased;
            result = &mut finished => break result.unwrap_or(Err(Error::AgentStopped)),
            connected = connect(&node, &options, budget, reconnecting, &mut events) => connected,
        };
        let session = match connected {
            Ok(session) => session,
            Err(e) => break Err(e),
        };
        tracing::info!(
            "connected to the server at {} as node '{}'",
            options.server,
            options.node
        );
        tokio::select! {
            biased;
            result = &mut finished => {
                break result.unwrap_or(Err(Error::AgentStopped));
            }
            () = lost(&mut events, session) => {
                tracing::warn!(
                    "lost the server at {}; reconnecting for up to {} s",
                    options.server,
                    options.reconnect_timeout.as_secs()
                );
                budget = options.reconnect_timeout;
                reconnecting = true;
            }
        }
    };
    host.stop(None);
    relay.stop(None);
    agent.stop(None);
    node.stop(None);
    result
}

/// Connects to the server, retrying while nothing answers, until a session authenticates.
///
/// A connection the server turned away for its flood limits, or closed without a byte, is
/// retried within the budget: the server has not judged this node, and under a flood it may
/// not even have a moment to say it is busy. A connection closed after the server answered
/// the handshake is a refusal (a wrong secret, TLS at one end only) and ends the attempt at
/// once, except while reconnecting: then it may also be the old server process still tearing
/// down its sockets, or the new one starting, so it is retried within the budget like an
/// unreachable server.
async fn connect(
    node: &ractor::ActorRef<ractor_cluster::NodeServerMessage>,
    options: &JoinOptions,
    budget: Duration,
    reconnecting: bool,
    events: &mut mpsc::UnboundedReceiver<SessionEvent>,
) -> Result<NodeId, Error> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        let busy = || Error::Busy(options.server.clone());
        let unanswered = || Error::Unanswered(options.server.clone());
        let retry = match node::connect(node, &options.server, options.tls.as_ref()).await {
            Ok(hearing) => match handshake(options, events).await? {
                Handshake::Authenticated(session) => return Ok(session),
                Handshake::Refused(why) => match hearing.heard() {
                    Heard::Marker(Marker::Busy) => busy(),
                    Heard::Nothing => unanswered(),
                    Heard::Marker(Marker::NotTls) | Heard::Answer if reconnecting => why,
                    Heard::Marker(Marker::NotTls) | Heard::Answer => return Err(why),
                },
            },
            Err(ConnectError::Busy) => busy(),
            Err(ConnectError::Unanswered) => unanswered(),
            Err(ConnectError::Fatal(e)) => return Err(e),
            Err(ConnectError::Unreachable(e)) => Error::Unreachable(e),
        };
        if started.elapsed() >= budget {
            return Err(Error::GaveUp {
                last: Box::new(retry),
                seconds: budget.as_secs(),
            });
        }
        tracing::debug!("{retry}; retrying");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

enum Handshake {
    Authenticated(NodeId),
    Refused(Error),
}

/// Waits for the fate of the connection just opened: authenticated, or closed before (a
/// refusal: `client_connect` succeeded, but that says nothing about the secret).
async fn handshake(
    options: &JoinOptions,
    events: &mut mpsc::UnboundedReceiver<SessionEvent>,
) -> Result<Handshake, Error> {
    let deadline = tokio::time::sleep(HANDSHAKE);
    tokio::pin!(deadline);
    let mut ours = None;
    loop {
        tokio::select! {
            () = &mut deadline => {
                return Err(Error::HandshakeTimeout {
                    server: options.server.clone(),
                    seconds: HANDSHAKE.as_secs(),
                });
            }
            event = events.recv() => match event {
                None => {
                    return Err(Error::NodeStopped {
                        when: "during the handshake",
                        reason: "its session events ended".into(),
                    });
                }
                Some(SessionEvent::Opened { node, .. }) => {
                    ours.get_or_insert(node);
                }
                Some(SessionEvent::Authenticated { node, .. }) if ours.is_none_or(|o| o == node) => {
                    return Ok(Handshake::Authenticated(node));
                }
                Some(SessionEvent::Disconnected { node, .. }) if ours == Some(node) => {
                    return Ok(Handshake::Refused(Error::NotAuthenticated(
                        options.server.clone(),
                    )));
                }
                Some(_) => {}
            }
        }
    }
}

/// Returns when the session `session` is gone.
async fn lost(events: &mut mpsc::UnboundedReceiver<SessionEvent>, session: NodeId) {
    while let Some(event) = events.recv().await {
        if let SessionEvent::Disconnected { node, .. } = event
            && node == session
        {
            return;
        }
    }
    std::future::pending::<()>().await;
}

/// The error of an actor of this node that did not start.
pub(crate) fn started(actor: &'static str, e: ractor::SpawnErr) -> Error {
    Error::Start {
        actor,
        reason: e.to_string(),
    }
}

/// Parses a client list such as `0-4,7,9`: ids and inclusive ranges, sorted. An id given twice
/// (`0-9,5`) is refused: it is a typo, and a node must not host the same client twice.
pub fn parse_ids(text: &str) -> Result<Vec<ClientId>, Error> {
    let twice = |client: ClientId| Error::ClientTwice {
        client,
        text: text.to_string(),
    };
    let mut ids = std::collections::BTreeSet::new();
    for part in text.split(',').map(str::trim) {
        let parse = |s: &str| {
            s.trim()
                .parse::<ClientId>()
                .map_err(|_| Error::NotAClientId {
                    part: s.to_string(),
                    text: text.to_string(),
                })
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (parse(a)?, parse(b)?);
                let (part, text) = (part.to_string(), text.to_string());
                if a > b {
                    return Err(Error::EmptyRange { part, text });
                }
                if b - a >= 1_000_000 {
                    return Err(Error::TooManyClients { part, text });
                }
                for id in a..=b {
                    if !ids.insert(id) {
                        return Err(twice(id));
                    }
                }
            }
            None => {
                let id = parse(part)?;
                if !ids.insert(id) {
                    return Err(twice(id));
                }
            }
        }
    }
    Ok(ids.into_iter().collect())
}

/// The shortest `0-4,7,9` form of sorted ids.
pub fn format_ids(ids: &[ClientId]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_lists_parse_and_print_back() {
        assert_eq!(parse_ids("0-2,5, 7").unwrap(), vec![0, 1, 2, 5, 7]);
        assert_eq!(parse_ids("3,1").unwrap(), vec![1, 3]);
        assert_eq!(
            parse_ids("0-9,5").unwrap_err().to_string(),
            "client 5 appears twice in `0-9,5`"
        );
        assert!(parse_ids("1,1").is_err() && parse_ids("0-3,2-4").is_err());
        assert_eq!(format_ids(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_ids(&[]), "");
        for bad in ["", "a", "3-1", "1-", "0-99999999"] {
            assert!(parse_ids(bad).is_err(), "{bad}");
        }
    }
}
