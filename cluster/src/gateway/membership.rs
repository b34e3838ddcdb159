//! Which node hosts which client: a node's hello checked against the federation and the nodes
//! already registered, its clients registered with the server, and the sessions followed, so
//! that a lost node's clients are unreachable at once and a node restarted under its name takes
//! them back.

use super::{GatewayState, Node};
use crate::node::SessionEvent;
use crate::wire::{Body, Hello, Rejection, RejectionKind as K, SessionKey};
use fedshard_actors::server::ServerMsg;
use fedshard_protocol::task::ClientId;
use ractor::ActorRef;
use std::collections::BTreeSet;

/// Displaced agents remembered at most: a node displaced over and over (a restart loop)
/// must not grow the gateway's memory.
pub(super) const MAX_DISPLACED: usize = 64;

impl GatewayState {
    /// Registers a node's clients, or refuses the hello and tells the node why.
    pub(super) fn hello(&mut self, hello: Hello) -> Result<(), Rejection> {
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

    pub(super) fn session(&mut self, event: SessionEvent) {
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
