//! The read side of a server node's incoming connection until its peer authenticates: frames
//! are capped at a hello's size and the whole handshake has a deadline. ractor_cluster applies
//! one frame cap for the life of a session (sized for models, so an unauthenticated peer could
//! make it hold 16 MiB or more per connection) and no deadline at all; this wrapper, between the
//! socket and ractor_cluster's session reader, closes the connection instead. Once the session
//! authenticates, bytes pass through untouched and ractor_cluster's model-sized cap applies.

use crate::admission::Slot;
use crate::lock;
use crate::refusal::Refusal;
use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What the acceptor and the session's reader share about one connection.
#[derive(Debug)]
pub(crate) struct Pending {
    authenticated: AtomicBool,
    /// The connection's place among the unauthenticated ones, given back on authentication.
    slot: Mutex<Option<Slot>>,
    /// Why the reader closed the connection, if it did.
    refusal: Mutex<Option<Refusal>>,
}

impl Pending {
    pub(crate) fn new(slot: Slot) -> Self {
        Self {
            authenticated: AtomicBool::new(false),
            slot: Mutex::new(Some(slot)),
            refusal: Mutex::new(None),
        }
    }

    pub(crate) fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// The peer proved it holds the secret: no cap, no deadline, and its slot is free.
    pub(crate) fn authenticate(&self) {
        self.authenticated.store(true, Ordering::Release);
        lock(&self.slot).take();
    }

    fn refuse(&self, why: Refusal) {
        lock(&self.refusal).get_or_insert(why);
    }

    /// Why the connection closed unauthenticated: the reader's reason, else the handshake's.
    pub(crate) fn refusal(&self) -> Refusal {
        lock(&self.refusal).unwrap_or(Refusal::NotAuthenticated)
    }
}

/// ractor_cluster's framing (a u64 big-endian length, then that many bytes), followed byte by
/// byte across reads of any size, to refuse a length above the cap as soon as it is read.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    header: [u8; 8],
    have: usize,
    payload_left: u64,
}

impl Frames {
    /// Follows `bytes`; `Err(length)` at the first frame length above `cap`.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], cap: u64) -> Result<(), u64> {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.payload_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = (self.header.len() - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == self.header.len() {
                self.have = 0;
                let length = u64::from_be_bytes(self.header);
                if length > cap {
                    return Err(length);
                }
                self.payload_left = length;
            }
        }
        Ok(())
    }
}

/// The read half of an incoming connection, capped and timed until [`Pending::authenticate`].
pub(crate) struct GuardedRead {
    inner: BoxRead,
    pending: Arc<Pending>,
    deadline: Pin<Box<Sleep>>,
    frames: Frames,
    cap: u64,
}

impl AsyncRead for GuardedRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_authenticated() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.pending.refuse(Refusal::HandshakeTimeout);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer did not authenticate within --handshake-timeout",
            )));
        }
        let start = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if !this.pending.is_authenticated()
            && let Err(length) = this.frames.feed(&buf.filled()[start..], this.cap)
        {
            // An error reads nothing: the bytes of this read are dropped with the connection.
            buf.set_filled(start);
            this.pending.refuse(Refusal::FrameTooLarge);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a {length}-byte frame before authenticating (--preauth-frame-cap {})",
                    this.cap
                ),
            )));
        }
        Poll::Ready(Ok(()))
    }
}

/// An accepted (and TLS-decrypted) connection, handed to ractor_cluster as an external stream
/// so that its reads go through [`GuardedRead`].
pub(crate) struct GuardedStream {
    pub(crate) read: BoxRead,
    pub(crate) write: BoxWrite,
    /// The session's name in ractor_cluster's events: the peer's address.
    pub(crate) peer: String,
    pub(crate) local: String,
    pub(crate) pending: Arc<Pending>,
    pub(crate) deadline: Instant,
    pub(crate) cap: u64,
}

impl ClusterBidiStream for GuardedStream {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        let read = GuardedRead {
            inner: self.read,
            pending: self.pending,
            deadline: Box::pin(tokio::time::sleep_until(self.deadline)),
            frames: Frames::default(),
            cap: self.cap,
        };
        (Box::new(read), self.write)
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
    use crate::admission::Admission;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    fn frame(len: u64) -> Vec<u8> {
        let mut f = len.to_be_bytes().to_vec();
        f.resize(8 + len as usize, 7);
        f
    }

    #[test]
    fn frames_under_the_cap_pass_in_reads_of_any_size() {
        let stream: Vec<u8> = [frame(0), frame(100), frame(64), frame(3)].concat();
        for chunk in [1, 3, 8, 9, 50, stream.len()] {
            let mut frames = Frames::default();
            for piece in stream.chunks(chunk) {
                assert_eq!(frames.feed(piece, 100), Ok(()), "chunk {chunk}");
            }
            assert_eq!((frames.have, frames.payload_left), (0, 0));
        }
    }

    #[test]
    fn a_length_over_the_cap_is_refused_when_its_last_byte_arrives() {
        let stream = [frame(10), (1u64 << 24).to_be_bytes().to_vec()].concat();
        let mut frames = Frames::default();
        // Everything but the big length's last byte: nothing to refuse yet.
        assert_eq!(frames.feed(&stream[..stream.len() - 1], 64), Ok(()));
        assert_eq!(frames.feed(&stream[stream.len() - 1..], 64), Err(1 << 24));
    }

    /// A guarded read of `inner` with a fresh slot, its deadline `deadline` from now.
    fn guarded(inner: BoxRead, deadline: Duration, cap: u64) -> (GuardedRead, Arc<Pending>) {
        let admission = Arc::new(Admission::new(4, 4));
        let slot = admission.admit("127.0.0.1".parse().unwrap()).unwrap();
        let pending = Arc::new(Pending::new(slot));
        let read = GuardedRead {
            inner,
            pending: pending.clone(),
            deadline: Box::pin(tokio::time::sleep(deadline)),
            frames: Frames::default(),
            cap,
        };
        (read, pending)
    }

    #[tokio::test]
    async fn a_big_frame_before_authenticating_closes_and_says_why() {
        let inner = Box::new(std::io::Cursor::new(frame(1000)));
        let (mut read, pending) = guarded(inner, Duration::from_secs(60), 64);
        let mut sink = Vec::new();
        let error = read.read_to_end(&mut sink).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert_eq!(pending.refusal(), Refusal::FrameTooLarge);
    }

    #[tokio::test]
    async fn after_authenticating_the_same_frame_passes() {
        let inner = Box::new(std::io::Cursor::new(frame(1000)));
        let (mut read, pending) = guarded(inner, Duration::from_secs(60), 64);
        pending.authenticate();
        let mut sink = Vec::new();
        read.read_to_end(&mut sink).await.unwrap();
        assert_eq!(sink, frame(1000));
    }

    #[tokio::test]
    async fn a_silent_peer_is_cut_at_the_deadline() {
        let (inner, _held_open) = tokio::io::duplex(64);
        let deadline = Duration::from_millis(200);
        let (mut read, pending) = guarded(Box::new(inner), deadline, 64);
        let started = Instant::now();
        let error = read.read_u64().await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= deadline);
        assert_eq!(pending.refusal(), Refusal::HandshakeTimeout);
    }

    #[test]
    fn authenticating_gives_the_slot_back() {
        let admission = Arc::new(Admission::new(1, 1));
        let ip = "127.0.0.1".parse().unwrap();
        let pending = Pending::new(admission.admit(ip).unwrap());
        assert!(admission.admit(ip).is_err());
        pending.authenticate();
        assert!(admission.admit(ip).is_ok());
    }
}
