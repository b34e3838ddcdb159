//! The cluster transport's counters, in Prometheus form so the server node's `/metrics` shows
//! them beside the run's (`fedshard_cluster_*`), and readable in-process for tests and benches.

use crate::refusal::Refusal;
use crate::throttle::Throttle;
use crate::wire::RejectionKind;
use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A client node as the server's live page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub name: String,
    /// Its last session's peer address, as the listener saw it.
    pub peer: String,
    pub connected: bool,
    /// Clients it hosts now (0 while it is away).
    pub clients: usize,
    /// The last round (or version) for which one of its clients sent an update.
    pub last_round: Option<u64>,
}

/// Node names remembered for the live page at most: a node is remembered from its first
/// registration, so a restart loop under new names cannot grow the server's memory.
const MAX_NODES: usize = 4096;

/// Counters of one node, and on a server the client nodes it has seen. Cloning shares them.
#[derive(Clone)]
pub struct ClusterMetrics {
    rejected: IntCounterVec,
    refused_sessions: IntCounterVec,
    disconnects: IntCounter,
    sessions: IntGauge,
    clients: IntGauge,
    frame_bytes: IntCounterVec,
    /// By name; written by the gateway, read by the live page (also after the run).
    nodes: Arc<Mutex<BTreeMap<String, NodeStatus>>>,
}

impl ClusterMetrics {
    pub fn new() -> Self {
        let counter_vec = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label])
                .unwrap_or_else(|e| unreachable!("static metric {name}: {e}"))
        };
        let counter = |name: &str, help: &str| {
            IntCounter::new(name, help)
                .unwrap_or_else(|e| unreachable!("static metric {name}: {e}"))
        };
        let gauge = |name: &str, help: &str| {
            IntGauge::new(name, help).unwrap_or_else(|e| unreachable!("static metric {name}: {e}"))
        };
        let metrics = Self {
            rejected: counter_vec(
                "fedshard_cluster_frames_rejected_total",
                "Frames from other nodes dropped before they reached an actor's logic, by reason.",
                "reason",
            ),
            refused_sessions: counter_vec(
                "fedshard_cluster_sessions_refused_total",
                "Connections from other nodes closed before they authenticated, by reason (a wrong secret, TLS, a deadline, a limit).",
                "reason",
            ),
            disconnects: counter(
                "fedshard_cluster_node_disconnects_total",
                "Authenticated node sessions that were lost.",
            ),
            sessions: gauge("fedshard_cluster_nodes", "Authenticated node sessions now."),
            clients: gauge("fedshard_cluster_clients", "Remote clients registered now."),
            frame_bytes: counter_vec(
                "fedshard_cluster_frame_bytes_total",
                "Bytes of frames sent (`out`) and received (`in`), before ractor_cluster's envelope.",
                "direction",
            ),
            nodes: Arc::default(),
        };
        for kind in RejectionKind::ALL {
            metrics.rejected.with_label_values(&[kind.label()]);
        }
        for why in Refusal::ALL {
            metrics.refused_sessions.with_label_values(&[why.label()]);
        }
        for direction in ["in", "out"] {
            metrics.frame_bytes.with_label_values(&[direction]);
        }
        metrics
    }

    /// Every series, to register with a Prometheus registry.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.rejected.clone()),
            Box::new(self.refused_sessions.clone()),
            Box::new(self.disconnects.clone()),
            Box::new(self.sessions.clone()),
            Box::new(self.clients.clone()),
            Box::new(self.frame_bytes.clone()),
        ]
    }

    pub fn reject(&self, kind: RejectionKind) {
        self.rejected.with_label_values(&[kind.label()]).inc();
    }

    pub fn rejected(&self, kind: RejectionKind) -> u64 {
        self.rejected.with_label_values(&[kind.label()]).get()
    }

    pub fn rejected_total(&self) -> u64 {
        RejectionKind::ALL.iter().map(|&k| self.rejected(k)).sum()
    }

    pub fn session_refused(&self, why: Refusal) {
        self.refused_sessions
            .with_label_values(&[why.label()])
            .inc();
    }

    /// Connections refused for `why` so far.
    pub fn sessions_refused(&self, why: Refusal) -> u64 {
        self.refused_sessions
            .with_label_values(&[why.label()])
            .get()
    }

    pub fn session_up(&self) {
        self.sessions.inc();
    }

    pub fn session_lost(&self) {
        self.sessions.dec();
        self.disconnects.inc();
    }

    pub fn set_clients(&self, n: usize) {
        self.clients.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn bytes_in(&self, n: usize) {
        self.frame_bytes.with_label_values(&["in"]).inc_by(n as u64);
    }

    pub fn bytes_out(&self, n: usize) {
        self.frame_bytes
            .with_label_values(&["out"])
            .inc_by(n as u64);
    }

    /// Every reason with a count so far, as `(what, reason, count)`: connections refused before
    /// they authenticated (`session`), then frames rejected after (`frame`), as `/metrics`
    /// labels them.
    pub fn refusals(&self) -> Vec<(&'static str, &'static str, u64)> {
        let sessions = Refusal::ALL
            .iter()
            .map(|&why| ("session", why.label(), self.sessions_refused(why)));
        let frames = RejectionKind::ALL
            .iter()
            .map(|&kind| ("frame", kind.label(), self.rejected(kind)));
        sessions.chain(frames).filter(|&(_, _, n)| n > 0).collect()
    }

    /// A node registered under `name` from `peer`.
    pub fn node_registered(&self, name: &str, peer: &str) {
        let mut nodes = crate::lock(&self.nodes);
        if let Some(node) = nodes.get_mut(name) {
            node.peer = peer.to_string();
        } else if nodes.len() < MAX_NODES {
            nodes.insert(
                name.to_string(),
                NodeStatus {
                    name: name.to_string(),
                    peer: peer.to_string(),
                    connected: false,
                    clients: 0,
                    last_round: None,
                },
            );
        }
    }

    /// Whether the node called `name` is connected now, and how many clients it hosts.
    pub fn node_now(&self, name: &str, connected: bool, clients: usize) {
        if let Some(node) = crate::lock(&self.nodes).get_mut(name) {
            node.connected = connected;
            node.clients = clients;
        }
    }

    /// A client of the node called `name` sent an update for `round`.
    pub fn node_answered(&self, name: &str, round: u64) {
        if let Some(node) = crate::lock(&self.nodes).get_mut(name) {
            node.last_round = Some(node.last_round.map_or(round, |last| last.max(round)));
        }
    }

    /// Every client node registered so far, connected or not, in name order.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        crate::lock(&self.nodes).values().cloned().collect()
    }

    /// Frame bytes received and sent so far.
    pub fn frame_bytes(&self) -> (u64, u64) {
        (
            self.frame_bytes.with_label_values(&["in"]).get(),
            self.frame_bytes.with_label_values(&["out"]).get(),
        )
    }
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Logs rejected frames without flooding the log under attack: at most one line per
/// [`RejectionLog::INTERVAL`], saying how many were rejected since the previous line
/// (`fedshard_cluster_frames_rejected_total` counts every one).
#[derive(Debug, Default)]
pub(crate) struct RejectionLog {
    throttle: Throttle,
}

impl RejectionLog {
    pub(crate) const INTERVAL: Duration = Duration::from_secs(10);

    pub(crate) fn log(&mut self, what: &str, rejection: &crate::wire::Rejection) {
        match self.throttle.admit(Instant::now(), Self::INTERVAL) {
            Some(0) => tracing::warn!("{what}: rejected a frame ({rejection})"),
            Some(missed) => tracing::warn!(
                "{what}: rejected a frame ({rejection}; {missed} more rejected in the last {} s)",
                Self::INTERVAL.as_secs()
            ),
            None => {}
        }
    }
}
