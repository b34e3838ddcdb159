//! The server node's listener, in front of ractor_cluster's. ractor_cluster accepts sockets and
//! runs each TLS handshake inline in one loop with no timeout (one idle socket stalls every
//! node behind it), and gives an unauthenticated session its model-sized frame cap and no
//! deadline. Here every connection is admitted against the limits ([`Limits`]), its TLS
//! handshake runs in a task of its own under the handshake deadline, and the decrypted stream
//! reaches ractor_cluster as an external stream whose reads are guarded (`guard.rs`) until
//! the session authenticates. Every connection closed on the way is a counted, rate-limited
//! [`Refusal`].
//!
//! ractor_cluster's own listener still runs (its node server always starts one), bound to
//! loopback on a free port and sealed: its TLS configuration has no certificate, so no
//! handshake there ever completes and nothing reaches a session through it.

use crate::admission::{Admission, Slot};
use crate::error::Error;
use crate::guard::{GuardedStream, Pending};
use crate::node::{self, NodeSettings, SessionEvent};
use crate::refusal::{Refusal, Refusals};
use crate::throttle::Throttle;
use crate::turn_away::{Marker, TurnAways};
use ractor::ActorRef;
use ractor_cluster::NodeServerMessage;
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// A server node behind the guarded listener; [`GuardedNode::stop`] ends both.
pub struct GuardedNode {
    pub node: ActorRef<NodeServerMessage>,
    accepting: JoinHandle<()>,
}

impl GuardedNode {
    pub fn stop(self) {
        self.accepting.abort();
        self.node.stop(None);
    }
}

/// Starts a server node that other nodes reach at `settings.listen` through the guarded
/// listener, with `settings.tls` (if any) for their connections, and subscribes `on_event` to
/// its sessions as [`node::start`] does.
pub async fn start(
    settings: NodeSettings,
    limits: Limits,
    refusals: Refusals,
    on_event: impl Fn(SessionEvent) + Send + 'static,
) -> Result<GuardedNode, Error> {
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| node::cannot_listen(settings.listen, &e))?;
    let tls = settings.tls;
    let sealed = NodeSettings {
        listen: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0),
        tls: Some(sealed_acceptor()?),
        ..settings
    };
    let front_cell: Arc<OnceLock<Arc<Front>>> = Arc::default();
    let observer = front_cell.clone();
    let node = node::start(sealed, move |event| {
        if let Some(front) = observer.get() {
            front.observe(&event);
        }
        on_event(event);
    })
    .await?;
    let front = Arc::new(Front::new(node.clone(), tls, limits, refusals));
    let _ = front_cell.set(front.clone());
    let accepting = tokio::spawn(front.run(listener));
    Ok(GuardedNode { node, accepting })
}

/// A TLS configuration no handshake completes with (it has no certificate to present), for
/// ractor_cluster's own listener, which nothing should reach.
fn sealed_acceptor() -> Result<TlsAcceptor, Error> {
    #[derive(Debug)]
    struct NoCertificate;
    impl rustls::server::ResolvesServerCert for NoCertificate {
        fn resolve(
            &self,
            _: rustls::server::ClientHello<'_>,
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            None
        }
    }
    let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(NoCertificate));
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// What a peer that has not authenticated may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From accept to authenticated: the TLS handshake and the secret's challenge.
    pub handshake_timeout: Duration,
    /// Connections waiting to authenticate, in all.
    pub max_unauthenticated: usize,
    /// Connections waiting to authenticate from one IP address.
    pub max_unauthenticated_per_ip: usize,
    /// The largest frame before authenticating, in bytes (ractor_cluster's handshake frames
    /// are well under 1 KiB; the model-sized cap applies after).
    pub preauth_frame_cap: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(5),
            max_unauthenticated: 512,
            max_unauthenticated_per_ip: 32,
            preauth_frame_cap: 64 * 1024,
        }
    }
}

/// The listener's shared state: limits, the connections not yet authenticated, the counters.
pub(crate) struct Front {
    node: ActorRef<NodeServerMessage>,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    admission: Arc<Admission>,
    /// Connections handed to ractor_cluster, by the peer address its session events carry.
    pending: Mutex<HashMap<String, Arc<Pending>>>,
    refusals: Refusals,
    /// Connections being turned away with a marker, each holding a file descriptor for a
    /// moment.
    turning_away: Arc<TurnAways>,
}

impl Front {
    pub(crate) fn new(
        node: ActorRef<NodeServerMessage>,
        tls: Option<TlsAcceptor>,
        limits: Limits,
        refusals: Refusals,
    ) -> Self {
        Self {
            node,
            tls,
            limits,
            admission: Arc::new(Admission::new(
                limits.max_unauthenticated,
                limits.max_unauthenticated_per_ip,
            )),
            pending: Mutex::new(HashMap::new()),
            refusals,
            turning_away: TurnAways::new(64),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Pending>>> {
        crate::lock(&self.pending)
    }

    /// Follows ractor_cluster's session events: an authenticated connection is free of its
    /// limits, one that closes unauthenticated is a refusal.
    pub(crate) fn observe(&self, event: &SessionEvent) {
        match event {
            SessionEvent::Opened { .. } => {}
            SessionEvent::Authenticated { peer, .. } => {
                if let Some(pending) = self.pending().get(peer) {
                    pending.authenticate();
                }
            }
            SessionEvent::Disconnected { peer, .. } => {
                let Some(pending) = self.pending().remove(peer) else {
                    return;
                };
                if !pending.is_authenticated()
                    && let Ok(addr) = peer.parse::<SocketAddr>()
                {
                    self.refusals.refuse(addr, pending.refusal());
                }
            }
        }
    }

    /// Accepts connections until the task is aborted.
    pub(crate) async fn run(self: Arc<Self>, listener: TcpListener) {
        let mut errors = Throttle::default();
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => match self.admission.admit(peer.ip()) {
                    Ok(slot) => {
                        let front = self.clone();
                        tokio::spawn(async move { front.open(stream, peer, slot).await });
                    }
                    Err(why) => {
                        self.refusals.refuse(peer, why);
                        // Told so, the node retries rather than taking this for a wrong
                        // secret.
                        self.turning_away.turn_away(stream, Marker::Busy);
                    }
                },
                Err(e) => {
                    // Out of file descriptors, typically: wait for some to close, and say so
                    // once a second, not ten times.
                    match errors.admit(std::time::Instant::now(), Duration::from_secs(1)) {
                        Some(0) => tracing::warn!("cannot accept a node connection: {e}"),
                        Some(missed) => tracing::warn!(
                            "cannot accept a node connection: {e} ({missed} more failed accepts \
                             in the last second)"
                        ),
                        None => {}
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Runs the TLS handshake if any, within the deadline, and hands the stream to
    /// ractor_cluster.
    async fn open(&self, stream: TcpStream, peer: SocketAddr, slot: Slot) {
        let deadline = Instant::now() + self.limits.handshake_timeout;
        let _ = stream.set_nodelay(true);
        if let Err(e) = crate::keepalive::watch(&stream) {
            tracing::warn!(
                "{peer}: no keepalive on the connection ({e}); a dead link to it goes unnoticed"
            );
        }
        let local = stream
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let (read, write): (ractor_cluster::BoxRead, ractor_cluster::BoxWrite) = match &self.tls {
            None => {
                // A node speaks first in ractor_cluster's handshake, so nothing is lost by
                // waiting for its first byte here.
                match tokio::time::timeout_at(deadline, first_byte(&stream)).await {
                    Err(_) => return self.refusals.refuse(peer, Refusal::HandshakeTimeout),
                    Ok(None) => return self.refusals.refuse(peer, Refusal::NotAuthenticated),
                    Ok(Some(TLS_HANDSHAKE)) => {
                        // Told so, the node stops and names the flag, rather than retrying
                        // as for a server that closed without a word.
                        self.refusals.refuse(peer, Refusal::TlsOnPlaintext);
                        drop(slot);
                        return self.turning_away.turn_away(stream, Marker::NotTls);
                    }
                    Ok(Some(_)) => {}
                }
                let (read, write) = stream.into_split();
                (Box::new(read), Box::new(write))
            }
            Some(acceptor) => {
                match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let (read, write) = tokio::io::split(tls);
                        (Box::new(read), Box::new(write))
                    }
                    Ok(Err(e)) => return self.refusals.refuse(peer, tls_refusal(&e)),
                    Err(_) => return self.refusals.refuse(peer, Refusal::HandshakeTimeout),
                }
            }
        };
        let pending = Arc::new(Pending::new(slot));
        let label = peer.to_string();
        self.pending().insert(label.clone(), pending.clone());
        let stream = GuardedStream {
            read,
            write,
            peer: label.clone(),
            local,
            pending,
            deadline,
            cap: self.limits.preauth_frame_cap,
        };
        let opened = self.node.cast(NodeServerMessage::ConnectionOpenedExternal {
            stream: Box::new(stream),
            is_server: true,
        });
        if opened.is_err() {
            // The node is stopping.
            self.pending().remove(&label);
        }
    }
}

/// The first byte of a TLS record that starts a handshake (a ClientHello). ractor_cluster's
/// frames start with a big-endian length, whose first byte is 0 for any frame it accepts.
const TLS_HANDSHAKE: u8 = 0x16;

/// The first byte the peer sent, left unread; `None` if it closed (or failed) first.
async fn first_byte(stream: &TcpStream) -> Option<u8> {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte).await {
        Ok(1) => Some(byte[0]),
        _ => None,
    }
}

/// Why a TLS handshake failed, from rustls's error.
fn tls_refusal(error: &io::Error) -> Refusal {
    use rustls::Error as E;
    match error.get_ref().and_then(|e| e.downcast_ref::<E>()) {
        Some(E::InvalidMessage(_)) => Refusal::TlsPlaintext,
        Some(E::NoCertificatesPresented) => Refusal::TlsNoClientCert,
        Some(E::InvalidCertificate(_)) => Refusal::TlsBadClientCert,
        _ => Refusal::TlsFailed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ClusterMetrics;
    use crate::secret::Secret;

    #[tokio::test]
    async fn a_port_in_use_is_one_clean_line() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let settings = NodeSettings {
            name: "port-in-use".into(),
            secret: Secret::new("0f4c9a7e2b81d6350f4c9a7e2b81d635e1a2b3c4d5e6f708").unwrap(),
            listen: held.local_addr().unwrap(),
            tls: None,
            max_frame: 1 << 20,
        };
        let refusals = Refusals::new(ClusterMetrics::new());
        let Err(error) = start(settings, Limits::default(), refusals, |_| {}).await else {
            panic!("a node started on a port another socket holds");
        };
        assert!(matches!(error, Error::Listen { .. }), "{error:?}");
        let error = error.to_string();
        assert!(
            error.contains("in use") && error.contains("--listen"),
            "{error}"
        );
    }

    /// ractor_cluster's own listener must not be a way around the guarded one: it has no
    /// certificate to present, so a client completes no handshake with it, whatever it trusts.
    #[tokio::test]
    async fn no_tls_handshake_completes_with_the_sealed_listener() {
        let dir = tempfile::tempdir().unwrap();
        let files = crate::tls::generate(dir.path(), &["127.0.0.1".into()], 1, false).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sealed = sealed_acceptor().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            sealed.accept(tcp).await.is_ok()
        });
        let connector = crate::tls::connector(&files.ca_cert, None).unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = crate::tls::server_name("127.0.0.1").unwrap();
        assert!(connector.connect(name, tcp).await.is_err());
        assert!(
            !server.await.unwrap(),
            "the sealed listener completed a handshake"
        );
    }

    #[test]
    fn rustls_errors_map_to_the_side_at_fault() {
        let wrap = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
        assert_eq!(
            tls_refusal(&wrap(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))),
            Refusal::TlsPlaintext
        );
        assert_eq!(
            tls_refusal(&wrap(rustls::Error::NoCertificatesPresented)),
            Refusal::TlsNoClientCert
        );
        assert_eq!(
            tls_refusal(&wrap(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))),
            Refusal::TlsBadClientCert
        );
        assert_eq!(
            tls_refusal(&io::Error::from(io::ErrorKind::UnexpectedEof)),
            Refusal::TlsFailed
        );
    }
}
