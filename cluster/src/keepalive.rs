//! Noticing a dead link. A cable pulled, a route gone or a host frozen by its hypervisor closes
//! nothing: without these settings a TCP connection to a node that can no longer answer stays
//! open for the kernel's default of about 15 minutes of retransmissions (2 hours when idle), so
//! a client node would never reconnect and a server would keep a dead node's clients.
//!
//! Every node-to-node connection, at both ends, therefore probes its peer when idle (TCP
//! keepalive) and gives up when what it sent stays unacknowledged (TCP_USER_TIMEOUT): after
//! [`DEAD_AFTER`] without a sign of life from the peer's kernel the connection closes, the
//! session ends, the server counts the node's clients as gone and the node reconnects
//! ([`crate::join`]). The peer's *kernel* answers probes, so a node busy training, or even
//! stopped by SIGSTOP, is not cut; only a link (or a host) that is down is.

use std::io;
use std::time::Duration;
use tokio::net::TcpStream;

/// How long a peer may stay silent (no acknowledgement, no answer to a probe) before its
/// connection is taken for dead. Far above a round trip on any real link, and short enough
/// that a node is back within a round or two after its link comes back.
pub const DEAD_AFTER: Duration = Duration::from_secs(10);

/// Silence before the first probe, and between probes.
const IDLE: Duration = Duration::from_secs(2);
const INTERVAL: Duration = Duration::from_secs(1);

/// Sets keepalive probes and the user timeout on a node-to-node connection.
pub fn watch(stream: &TcpStream) -> io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    let probes = (DEAD_AFTER - IDLE).as_secs() / INTERVAL.as_secs();
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(IDLE)
        .with_interval(INTERVAL)
        .with_retries(u32::try_from(probes).unwrap_or(u32::MAX));
    socket.set_tcp_keepalive(&keepalive)?;
    socket.set_tcp_user_timeout(Some(DEAD_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watched_connection_carries_the_settings() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        watch(&stream).unwrap();
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(DEAD_AFTER));
        assert_eq!(socket.tcp_keepalive_time().unwrap(), IDLE);
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), INTERVAL);
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), 8);
    }
}
