//! Starting a ractor_cluster node, hearing about its sessions, and connecting to another node.
//!
//! Two ractor_cluster behaviours shape this module. `client_connect` returns `Ok` as soon as
//! the TCP (or TLS) connection is open, before the secret is checked, and a peer with another
//! secret is simply disconnected; so a node learns whether it was accepted only from the
//! session events it subscribes to ([`SessionEvent`]): a session that closes without having
//! authenticated was refused. And ractor_cluster never reconnects by itself: the same events
//! tell a client node its server is gone, and it reconnects ([`crate::join`]).

use crate::error::Error;
use crate::secret::Secret;
use crate::turn_away::{Heard, Hearing, Marker, Sniffed};
use ractor::{Actor, ActorRef};
use ractor_cluster::node::{NodeConnectionMode, NodeServerSessionInformation};
use ractor_cluster::{
    BoxRead, BoxWrite, ClusterBidiStream, IncomingEncryptionMode, NodeEventSubscription, NodeId,
    NodeServer, NodeServerMessage,
};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Something that happened to one of a node's sessions with another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A connection opened (not yet authenticated).
    Opened { node: NodeId, peer: String },
    /// The peer proved it holds the secret.
    Authenticated { node: NodeId, peer: String },
    /// The session ended, authenticated or not.
    Disconnected { node: NodeId, peer: String },
}

/// Forwards ractor_cluster's (synchronous) session callbacks to a function, typically a cast to
/// an actor or a send on a channel.
struct Subscription<F>(F);

impl<F: Fn(SessionEvent) + Send + 'static> NodeEventSubscription for Subscription<F> {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        (self.0)(SessionEvent::Opened {
            node: ses.node_id,
            peer: ses.peer_addr,
        });
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        (self.0)(SessionEvent::Disconnected {
            node: ses.node_id,
            peer: ses.peer_addr,
        });
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        (self.0)(SessionEvent::Authenticated {
            node: ses.node_id,
            peer: ses.peer_addr,
        });
    }
}

/// How to start a node.
pub struct NodeSettings {
    /// ractor_cluster's node name; unique per process, since two sessions from nodes of the
    /// same name are taken for a duplicate connection and one is closed.
    pub name: String,
    pub secret: Secret,
    /// Where to accept other nodes (port 0: any free port).
    pub listen: SocketAddr,
    /// TLS for incoming connections.
    pub tls: Option<TlsAcceptor>,
    /// ractor_cluster's inbound frame cap ([`crate::wire::transport_cap`]).
    pub max_frame: u64,
}

/// Starts a node (isolated: it connects only to the nodes it is told to, never to its peers'
/// peers) and subscribes `on_event` to its sessions.
pub async fn start(
    settings: NodeSettings,
    on_event: impl Fn(SessionEvent) + Send + 'static,
) -> Result<ActorRef<NodeServerMessage>, Error> {
    let encryption = match settings.tls {
        Some(acceptor) => IncomingEncryptionMode::Tls(acceptor),
        None => IncomingEncryptionMode::Raw,
    };
    let server = NodeServer::new(
        settings.listen.port(),
        settings.secret.cookie(),
        settings.name,
        settings.listen.ip().to_string(),
        Some(encryption),
        Some(NodeConnectionMode::Isolated),
    )
    .with_listen_addr(settings.listen.ip())
    .with_max_inbound_frame_size(settings.max_frame);
    // ractor_cluster reports a port in use as a panic inside a panic of its listener actor;
    // binding here first gives the operating system's own words.
    if settings.listen.port() != 0
        && let Err(e) = std::net::TcpListener::bind(settings.listen)
    {
        return Err(cannot_listen(settings.listen, &e));
    }
    let (node, _) = Actor::spawn(None, server, ())
        .await
        .map_err(|e| Error::Listen {
            address: settings.listen,
            reason: startup_failure(&e.to_string()).to_string(),
            hint: "",
        })?;
    node.cast(NodeServerMessage::SubscribeToEvents {
        id: "fedshard".into(),
        subscription: Box::new(Subscription(on_event)),
    })
    .map_err(|e| Error::NodeStopped {
        when: "while starting",
        reason: e.to_string(),
    })?;
    Ok(node)
}

/// Why `listen` cannot be bound, in the operating system's words, with the fix for a port in
/// use.
pub(crate) fn cannot_listen(listen: SocketAddr, e: &std::io::Error) -> Error {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            " (another process holds the port: stop it or choose another --listen port)"
        }
        _ => "",
    };
    Error::Listen {
        address: listen,
        reason: e.to_string(),
        hint,
    }
}

/// The fix when a TLS node reaches a server without TLS.
const NOT_TLS: &str =
    "the server does not speak TLS: it was started without --tls-cert, so drop --tls-ca here";

/// Which side of a failed TLS handshake is likely wrong, and the flag that fixes it.
fn tls_failure_hint(error: &std::io::Error) -> &'static str {
    use std::io::ErrorKind as K;
    match error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => {
            "the server's certificate is not signed by --tls-ca, or does not name the host of \
             --server: check --tls-ca, or set --tls-server-name"
        }
        Some(rustls::Error::AlertReceived(_)) => {
            "the server refused this node's TLS: it may require a client certificate \
             (--tls-cert, --tls-key) signed by its --tls-client-ca"
        }
        Some(rustls::Error::InvalidMessage(_)) => NOT_TLS,
        _ if matches!(
            error.kind(),
            K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe
        ) =>
        {
            "the server closed the connection during the handshake: it did not finish within \
             its --handshake-timeout, or it stopped"
        }
        _ => "check --tls-ca and --tls-server-name",
    }
}

/// The innermost reason of a nested "Actor panicked during startup '…'" text.
fn startup_failure(text: &str) -> &str {
    const WRAPPER: &str = "Actor panicked during startup '";
    let mut text = text;
    while let Some(inner) = text.strip_prefix(WRAPPER) {
        text = inner.strip_suffix('\'').unwrap_or(inner);
    }
    text
}

/// TLS settings of an outgoing connection.
#[derive(Clone)]
pub struct TlsClient {
    pub connector: TlsConnector,
    /// The name the server's certificate must carry.
    pub server_name: ServerName<'static>,
}

/// Why a connection attempt failed.
#[derive(Debug)]
pub enum ConnectError {
    /// Nothing answered at the address (yet): worth retrying.
    Unreachable(String),
    /// The server turned the connection away for its flood limits: worth retrying.
    Busy,
    /// The server closed the connection without a byte: it could not even say it was busy,
    /// or it is stopping. Worth retrying: it has not judged this node.
    Unanswered,
    /// Something answered but the connection cannot work (TLS refused, node stopped).
    Fatal(Error),
}

/// How long one attempt to open a TCP connection may take.
const CONNECT_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens a connection from `node` to the node at `addr`, watched for a dead link
/// ([`crate::keepalive`]). `Ok` means only that the connection
/// is open: the handshake follows, and its outcome arrives as a [`SessionEvent`]; the
/// [`Hearing`] returned says what the server sent first, so that a session closed before
/// authenticating can be told apart: turned away for the server's flood limits, closed without
/// a word, or refused after an answer (a wrong secret).
///
/// The connection is opened here, not by ractor_cluster's `client_connect`, so that its reads
/// pass through a check for the server's markers (`turn_away.rs`; below TLS, where they
/// arrive).
pub async fn connect(
    node: &ActorRef<NodeServerMessage>,
    addr: &str,
    tls: Option<&TlsClient>,
) -> Result<Arc<Hearing>, ConnectError> {
    let unreachable = |e: std::io::Error| ConnectError::Unreachable(format!("{addr}: {e}"));
    // An attempt ends after a while: over a link that is down, the kernel would retry the SYN
    // for two minutes and the node would come back long after the link.
    let tcp = tokio::time::timeout(CONNECT_ATTEMPT, TcpStream::connect(addr))
        .await
        .map_err(|_| {
            ConnectError::Unreachable(format!(
                "{addr}: no answer in {} s",
                CONNECT_ATTEMPT.as_secs()
            ))
        })?
        .map_err(unreachable)?;
    let _ = tcp.set_nodelay(true);
    crate::keepalive::watch(&tcp).map_err(unreachable)?;
    let peer = tcp.peer_addr().map_err(unreachable)?.to_string();
    let local = tcp.local_addr().map_err(unreachable)?.to_string();
    let hearing = Arc::new(Hearing::default());
    let sniffed = Sniffed::new(tcp, hearing.clone());
    let (read, write): (BoxRead, BoxWrite) = match tls {
        Some(tls) => {
            match tls
                .connector
                .connect(tls.server_name.clone(), sniffed)
                .await
            {
                Ok(stream) => {
                    let (read, write) = tokio::io::split(stream);
                    (Box::new(read), Box::new(write))
                }
                Err(e) => {
                    let hint = match hearing.heard() {
                        Heard::Marker(Marker::Busy) => return Err(ConnectError::Busy),
                        Heard::Nothing => return Err(ConnectError::Unanswered),
                        Heard::Marker(Marker::NotTls) => NOT_TLS,
                        Heard::Answer => tls_failure_hint(&e),
                    };
                    return Err(ConnectError::Fatal(Error::TlsHandshake {
                        address: addr.to_string(),
                        reason: e.to_string(),
                        hint,
                    }));
                }
            }
        }
        None => {
            let (read, write) = tokio::io::split(sniffed);
            (Box::new(read), Box::new(write))
        }
    };
    let stream = Outgoing {
        read,
        write,
        peer,
        local,
    };
    ractor_cluster::client_connect_external(node, Box::new(stream))
        .await
        .map_err(|e| {
            ConnectError::Fatal(Error::NodeStopped {
                when: "while connecting",
                reason: e.to_string(),
            })
        })?;
    Ok(hearing)
}

/// A client node's connection, handed to ractor_cluster as an external stream.
struct Outgoing {
    read: BoxRead,
    write: BoxWrite,
    peer: String,
    local: String,
}

impl ClusterBidiStream for Outgoing {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        (self.read, self.write)
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.peer.clone())
    }

    fn local_label(&self) -> Option<String> {
        Some(self.local.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    #[test]
    fn a_nested_startup_panic_reads_as_its_innermost_reason() {
        let nested = "Actor panicked during startup 'Actor panicked during startup 'Address already in use (os error 98)''";
        assert_eq!(
            startup_failure(nested),
            "Address already in use (os error 98)"
        );
        assert_eq!(startup_failure("plain"), "plain");
    }

    #[tokio::test]
    async fn a_port_in_use_is_one_clean_line() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = held.local_addr().unwrap();
        let settings = NodeSettings {
            name: "port-in-use".into(),
            secret: Secret::new("0f4c9a7e2b81d6350f4c9a7e2b81d635e1a2b3c4d5e6f708").unwrap(),
            listen,
            tls: None,
            max_frame: 1 << 20,
        };
        let error = start(settings, |_| {}).await.unwrap_err().to_string();
        assert!(
            error.contains("in use") && error.contains("--listen") && !error.contains("panicked"),
            "{error}"
        );
    }
}
