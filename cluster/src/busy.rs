//! A node turned away by the server's flood limits (`--max-unauthenticated`, per address) is
//! not refused for its secret, and should try again: the limits free up within the handshake
//! deadline. Both closes looked the same to the node (a session that ended before
//! authenticating), so `join` gave up at once. Now the server writes [`MARKER`], bytes no
//! handshake starts with, before closing such a connection ([`turn_away`]), and a client node
//! reads its connection through [`Sniffed`], which recognises them.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// What a server writes to a connection it turns away for its limits.
pub(crate) const MARKER: [u8; 8] = *b"FSBUSY\r\n";

/// How long a turned-away connection is kept for its peer to read the marker.
const LINGER: Duration = Duration::from_secs(1);

/// Writes [`MARKER`], ends the write side, and drains the peer's bytes until it closes or
/// [`LINGER`] passes: closing a socket with unread bytes sends a reset, which would discard
/// the marker before the peer reads it.
pub(crate) async fn turn_away(mut stream: TcpStream) {
    if stream.write_all(&MARKER).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = stream.read(&mut sink).await
            && n > 0
        {}
    })
    .await;
}

/// A client node's connection to the server, read through a check of its first bytes: if they
/// are [`MARKER`], the read fails and `busy` is set.
pub(crate) struct Sniffed<S> {
    inner: S,
    /// Bytes of the marker matched so far.
    matched: usize,
    /// Whether the first bytes are known not to be the marker.
    cleared: bool,
    busy: Arc<AtomicBool>,
}

impl<S> Sniffed<S> {
    pub(crate) fn new(inner: S, busy: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            matched: 0,
            cleared: false,
            busy,
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
        if this.cleared {
            return Poll::Ready(Ok(()));
        }
        for &byte in &buf.filled()[start..] {
            if byte != MARKER[this.matched] {
                this.cleared = true;
                return Poll::Ready(Ok(()));
            }
            this.matched += 1;
            if this.matched == MARKER.len() {
                this.busy.store(true, Ordering::Release);
                buf.set_filled(start);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    "the server turned this connection away: too many wait to authenticate",
                )));
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

    async fn read_all(bytes: Vec<u8>, chunk: usize) -> (io::Result<Vec<u8>>, bool) {
        let (mut tx, rx) = tokio::io::duplex(chunk);
        tokio::spawn(async move {
            for piece in bytes.chunks(chunk) {
                let _ = tx.write_all(piece).await;
            }
        });
        let busy = Arc::new(AtomicBool::new(false));
        let mut sniffed = Sniffed::new(rx, busy.clone());
        let mut out = Vec::new();
        let result = sniffed.read_to_end(&mut out).await.map(|_| out);
        (result, busy.load(Ordering::Acquire))
    }

    #[tokio::test]
    async fn the_marker_fails_the_read_and_says_busy_in_reads_of_any_size() {
        for chunk in [1, 3, 8, 64] {
            let (result, busy) = read_all(MARKER.to_vec(), chunk).await;
            assert!(busy, "chunk {chunk}");
            assert_eq!(result.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
        }
    }

    #[tokio::test]
    async fn other_bytes_pass_unchanged_even_when_they_start_like_the_marker() {
        let handshake = [&b"FSBU"[..], &[0, 0, 0, 9], b"challenge"].concat();
        for chunk in [1, 5, 64] {
            let (result, busy) = read_all(handshake.clone(), chunk).await;
            assert!(!busy);
            assert_eq!(result.unwrap(), handshake);
        }
    }
}
