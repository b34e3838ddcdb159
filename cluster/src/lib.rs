//! **fedshard-cluster**: the same runtime across machines: server and client nodes over
//! ractor_cluster, the wire frames, the shared secret and TLS.
//! May depend on: `fedshard-protocol`, `fedshard-actors`; ractor_cluster, rustls (no burn).
//!
//! fedshard across machines: a server node and client nodes joined by `ractor_cluster`.
//!
//! Only the transport changes; the round logic is the in-process one. On the server node a
//! [`gateway::Gateway`] registers the remote clients with the unchanged `Server` actor under a
//! local host actor that speaks the `HostMsg` protocol, so the server cannot tell a remote
//! client from a local one: a deadline is the same deadline, a lost node
//! is the same `unreachable` failure. On a client node an [`agent::Agent`] receives the
//! server's requests and drives an ordinary `ClientHost` and its client actors.
//!
//! Nodes find each other through process groups ([`GATEWAY_GROUP`], [`agent_group`]), not the
//! named registry, which does not hold remote actors. Everything that crosses the wire is a
//! versioned frame of bytes ([`wire`]) that the receiving actor decodes and checks itself, so a
//! malformed, replayed or forged frame is a counted rejection ([`metrics`]), never a panic and
//! never a change to the model. Nodes authenticate with a shared secret ([`secret`]; a node
//! with another secret is refused and counted) and may talk TLS ([`tls`]). A server node
//! accepts connections through its own listener ([`acceptor`]), which bounds what a peer can
//! hold before it authenticates: a deadline, a small frame cap (`guard.rs`), a number of
//! waiting connections in all and per address (`admission.rs`); every connection it closes is
//! counted and logged by reason ([`refusal`]).
//!
//! Not here: the rounds themselves (`fedshard-actors`), building a federation from a config and
//! the command line (`fedshard`).

pub mod acceptor;
pub(crate) mod admission;
pub mod agent;
pub mod descriptors;
pub mod error;
pub mod gateway;
pub(crate) mod guard;
pub mod join;
pub mod keepalive;
pub mod message;
pub mod metrics;
pub mod model_spec;
pub mod node;
pub mod refusal;
pub mod request;
pub mod secret;
pub mod serve;
pub(crate) mod throttle;
pub mod tls;
pub mod turn_away;
pub mod wire;

/// Locks `mutex` even if a holder panicked: every lock of this crate guards counters and maps
/// that each update leaves consistent, so a panic elsewhere must not take the listener down.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The process group of the server node's gateway; client nodes watch it to find the server.
pub const GATEWAY_GROUP: &str = "fedshard.gateway";

/// The process group of the client-node agent whose session key is `key`: the gateway finds
/// the agent that sent a hello here, and only that node knows its key.
pub fn agent_group(key: wire::SessionKey) -> String {
    format!("fedshard.agent.{key:032x}")
}
