//! Connections a server node closes before any handshake, and how a client node tells why.
//!
//! A node turned away by the server's flood limits (`--max-unauthenticated`, per address) is
//! not refused for its secret and should try again: the limits free up within the handshake
//! deadline. A TLS node that reached a server without TLS is misconfigured and should stop. To
//! the node both looked like a session that ended before authenticating, the same as a wrong
//! secret. So the server writes a [`Marker`] (bytes no handshake starts with) before closing
//! such a connection (`TurnAways`), and a client node reads its connection through
//! `Sniffed`, which recognises them and records what the server said first ([`Heard`]).
//!
//! Under a flood the markers are bounded (each lingering connection holds a descriptor), but
//! never by refusing the newest connection its marker: one more takes the place of the oldest.
//! A server that closes without a word (a connection it could not mark, a process stopping) is
//! [`Heard::Nothing`], which `join` retries as well: only an answered handshake can have
//! judged the node's secret.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Why a server closes a connection before any handshake, as it writes it to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// Its flood limits are reached: try again.
    Busy,
    /// A TLS handshake reached a server without TLS.
    NotTls,
}

impl Marker {
    const ALL: [Marker; 2] = [Marker::Busy, Marker::NotTls];

    /// The bytes on the wire: ractor_cluster's frames start with a big-endian length (`0x00`
    /// for any length under 2⁵⁶) and TLS records with a content type (`0x14`–`0x18`), never
    /// with `F`.
    fn bytes(self) -> &'static [u8; 8] {
        match self {
            Marker::Busy => b"FSBUSY\r\n",
            Marker::NotTls => b"FSNOTLS\n",
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Marker::Busy => "the server turned this connection away: too many wait to authenticate",
            Marker::NotTls => "the server does not speak TLS",
        }
    }
}

/// How long a turned-away connection is kept for its peer to read the marker.
const LINGER: Duration = Duration::from_secs(1);

/// Connections being turned away, each kept up to [`LINGER`] so that its peer reads the
/// marker: closing a socket with unread bytes sends a reset, which would discard the marker
/// before the peer reads it. At most `cap` at once (each holds a file descriptor); one more
/// takes the place of the oldest, which is closed at once after a last drain of what its peer
/// sent. Idle peers holding every place therefore cannot keep a node retrying from hearing
/// its marker.
pub(crate) struct TurnAways {
    cap: usize,
    lingering: Mutex<Lingering>,
}

/// The connections lingering, oldest first, each with its id and the signal that ends it.
#[derive(Default)]
struct Lingering {
    last_id: u64,
    queue: VecDeque<(u64, Arc<Notify>)>,
}

impl TurnAways {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            lingering: Mutex::default(),
        })
    }

    /// Writes `marker` to `stream` and closes it once its peer has closed, at most
    /// [`LINGER`] later, or sooner when newer ones need its place.
    pub(crate) fn turn_away(self: &Arc<Self>, stream: TcpStream, marker: Marker) {
        let end = Arc::new(Notify::new());
        let id = {
            let mut lingering = crate::lock(&self.lingering);
            lingering.last_id += 1;
            if lingering.queue.len() >= self.cap
                && let Some((_, oldest)) = lingering.queue.pop_front()
            {
                // Stored as a permit if that task is not waiting yet: it ends at once.
                oldest.notify_one();
            }
            let id = lingering.last_id;
            lingering.queue.push_back((id, end.clone()));
            id
        };
        let this = self.clone();
        tokio::spawn(async move {
            linger(stream, marker, &end).await;
            crate::lock(&this.lingering).queue.retain(|(i, _)| *i != id);
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        crate::lock(&self.lingering).queue.len()
    }
}

/// Writes the marker, ends the write side, and drains the peer's bytes until it closes,
/// [`LINGER`] passes, or `end` is signalled (then what has arrived is drained without waiting).
async fn linger(mut stream: TcpStream, marker: Marker, end: &Notify) {
    if stream.write_all(marker.bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let ended = tokio::select! {
        _ = tokio::time::timeout(LINGER, async {
            while let Ok(n) = stream.read(&mut sink).await
                && n > 0
            {}
        }) => false,
        () = end.notified() => true,
    };
    if ended {
        while let Ok(n) = stream.try_read(&mut sink)
            && n > 0
        {}
    }
}

/// What a client node's connection heard from the server first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Heard {
    /// Not a byte (or only the start of a marker): the server closed without answering.
    #[default]
    Nothing,
    /// The server turned the connection away, saying why.
    Marker(Marker),
    /// The server answered the handshake (TLS, or ractor_cluster's challenge).
    Answer,
}

/// What a connection has heard, shared by its reader (`Sniffed`) and the node that waits
/// for the handshake's outcome.
#[derive(Debug, Default)]
pub struct Hearing(Mutex<Heard>);

impl Hearing {
    pub fn heard(&self) -> Heard {
        *crate::lock(&self.0)
    }

    fn set(&self, heard: Heard) {
        *crate::lock(&self.0) = heard;
    }
}

/// A client node's connection to the server, read through a check of its first bytes: if they
/// are a [`Marker`], the read fails; either way the first bytes settle what was [`Heard`].
pub(crate) struct Sniffed<S> {
    inner: S,
    /// The first bytes, while they may still be a marker.
    seen: [u8; 8],
    have: usize,
    /// Whether the first bytes are known.
    settled: bool,
    hearing: Arc<Hearing>,
}

impl<S> Sniffed<S> {
    pub(crate) fn new(inner: S, hearing: Arc<Hearing>) -> Self {
        Self {
            inner,
            seen: [0; 8],
            have: 0,
            settled: false,
            hearing,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sniffed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let start = buf.filled().len();
        let this = self.get_mut();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if this.settled {
            return Poll::Ready(Ok(()));
        }
        for &byte in &buf.filled()[start..] {
            this.seen[this.have] = byte;
            this.have += 1;
            let seen = &this.seen[..this.have];
            match Marker::ALL
                .into_iter()
                .find(|m| m.bytes().starts_with(seen))
            {
                None => {
                    this.settled = true;
                    this.hearing.set(Heard::Answer);
                    return Poll::Ready(Ok(()));
                }
                Some(marker) if this.have == this.seen.len() => {
                    this.settled = true;
                    this.hearing.set(Heard::Marker(marker));
                    buf.set_filled(start);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        marker.reason(),
                    )));
                }
                Some(_) => {}
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sniffed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn read_all(bytes: Vec<u8>, chunk: usize) -> (io::Result<Vec<u8>>, Heard) {
        let (mut tx, rx) = tokio::io::duplex(chunk);
        tokio::spawn(async move {
            for piece in bytes.chunks(chunk) {
                let _ = tx.write_all(piece).await;
            }
        });
        let hearing = Arc::new(Hearing::default());
        let mut sniffed = Sniffed::new(rx, hearing.clone());
        let mut out = Vec::new();
        let result = sniffed.read_to_end(&mut out).await.map(|_| out);
        (result, hearing.heard())
    }

    #[tokio::test]
    async fn a_marker_fails_the_read_and_says_which_in_reads_of_any_size() {
        for marker in Marker::ALL {
            for chunk in [1, 3, 8, 64] {
                let (result, heard) = read_all(marker.bytes().to_vec(), chunk).await;
                assert_eq!(heard, Heard::Marker(marker), "chunk {chunk}");
                assert_eq!(result.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
            }
        }
    }

    #[tokio::test]
    async fn other_bytes_pass_unchanged_even_when_they_start_like_a_marker() {
        let handshake = [&b"FSBU"[..], &[0, 0, 0, 9], b"challenge"].concat();
        for chunk in [1, 5, 64] {
            let (result, heard) = read_all(handshake.clone(), chunk).await;
            assert_eq!(heard, Heard::Answer);
            assert_eq!(result.unwrap(), handshake);
        }
    }

    #[tokio::test]
    async fn a_close_without_a_byte_or_mid_marker_is_heard_as_nothing() {
        for bytes in [&b""[..], b"FSNO"] {
            let (result, heard) = read_all(bytes.to_vec(), 8).await;
            assert_eq!(heard, Heard::Nothing);
            assert_eq!(result.unwrap(), bytes);
        }
    }

    /// Idle peers that never read nor close fill every place: the newest connection still
    /// reads its marker at once, and the oldest is closed early to make room.
    #[tokio::test]
    async fn idle_peers_in_every_place_cannot_keep_the_newest_from_its_marker() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let turn_aways = TurnAways::new(2);
        let mut peers = Vec::new();
        for _ in 0..3 {
            let peer = TcpStream::connect(addr).await.unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            turn_aways.turn_away(accepted, Marker::Busy);
            peers.push(peer);
        }
        let read = |mut peer: TcpStream| async move {
            let mut got = Vec::new();
            let within = tokio::time::timeout(LINGER / 4, peer.read_to_end(&mut got)).await;
            (within.is_ok(), got)
        };
        let newest = peers.pop().unwrap();
        // Closed before its linger: its place was taken.
        assert_eq!(
            read(peers.remove(0)).await,
            (true, Marker::Busy.bytes().to_vec())
        );
        let mut marker = [0u8; 8];
        let mut newest = newest;
        newest.read_exact(&mut marker).await.unwrap();
        assert_eq!(&marker, Marker::Busy.bytes());
        assert!(turn_aways.len() <= 2);
    }
}
