//! The `/metrics` listener (and the live page's, [`HttpServer`]): at most
//! [`ScrapeLimits::max_connections`] connections at once, each cut after [`ScrapeLimits::idle`]
//! without a byte either way. Without them, idle connections to the metrics port held one file
//! descriptor each for ever, and enough of them starved the rest of the process (a server node
//! then could not accept its client nodes). At the cap, a new connection takes the place of the
//! one idle longest rather than being closed itself: otherwise 64 idle connections, renewed
//! every 10 s, shut every scrape out.

use axum::serve::Listener;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// What one scraper may hold of the metrics listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeLimits {
    /// Connections open at once; one more takes the place of the one idle longest.
    pub max_connections: usize,
    /// A connection with no byte read or written for this long is closed (a scraper keeping
    /// its connection alive between scrapes opens a new one).
    pub idle: Duration,
}

impl Default for ScrapeLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            idle: Duration::from_secs(10),
        }
    }
}

/// An HTTP server on a capped listener, stopped gracefully by [`HttpServer::shutdown`]: the
/// metrics address, or `fedshard report --serve`'s page.
pub(crate) struct HttpServer {
    pub(crate) addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<io::Result<()>>,
}

impl HttpServer {
    /// Binds `addr` and serves `app` on it; must be called inside a Tokio runtime.
    pub(crate) async fn start(
        addr: SocketAddr,
        app: axum::Router,
        limits: ScrapeLimits,
    ) -> Result<Self, crate::error::Error> {
        let serve = |source| crate::error::Error::Serve { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(serve)?;
        let addr = listener.local_addr().map_err(serve)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(CappedListener::new(listener, limits), app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Self { addr, stop, task })
    }

    /// Stops serving once the connections in flight are answered.
    pub(crate) async fn shutdown(self) {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(Err(e)) => tracing::warn!("http server on {}: {e}", self.addr),
            Err(e) => tracing::warn!("http server on {} panicked: {e}", self.addr),
            Ok(Ok(())) => {}
        }
    }
}

/// A TCP listener that hands axum at most `max_connections` idle-timed streams at once. At the
/// cap, a new connection takes the place of the one idle longest, which is closed: holding
/// every place with idle connections would otherwise shut scrapes out until the idle cut.
pub(crate) struct CappedListener {
    inner: TcpListener,
    open: Arc<Open>,
    idle: Duration,
}

impl CappedListener {
    pub(crate) fn new(inner: TcpListener, limits: ScrapeLimits) -> Self {
        Self {
            inner,
            open: Arc::new(Open {
                cap: limits.max_connections.max(1),
                since: Instant::now(),
                streams: Mutex::default(),
            }),
            idle: limits.idle,
        }
    }
}

impl Listener for CappedListener {
    type Io = IdleStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (IdleStream, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, peer)) => {
                    return (IdleStream::new(stream, &self.open, self.idle), peer);
                }
                Err(e) => {
                    tracing::debug!("metrics: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// The connections open, each with when it last made progress.
struct Open {
    cap: usize,
    /// The origin of [`Activity::last`].
    since: Instant,
    streams: Mutex<Streams>,
}

/// The open connections by id.
#[derive(Default)]
struct Streams {
    last_id: u64,
    by_id: HashMap<u64, Arc<Activity>>,
}

impl Open {
    fn lock(&self) -> std::sync::MutexGuard<'_, Streams> {
        self.streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a new connection; at the cap, first closes the one idle longest.
    fn add(&self) -> (u64, Arc<Activity>) {
        let activity = Arc::new(Activity {
            last: AtomicU64::new(self.now()),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        let mut streams = self.lock();
        if streams.by_id.len() >= self.cap
            && let Some((&oldest, _)) = streams
                .by_id
                .iter()
                .min_by_key(|(_, a)| a.last.load(Ordering::Relaxed))
            && let Some(evicted) = streams.by_id.remove(&oldest)
        {
            tracing::debug!("metrics: closed the connection idle longest (cap)");
            evicted.evict();
        }
        streams.last_id += 1;
        let id = streams.last_id;
        streams.by_id.insert(id, activity.clone());
        (id, activity)
    }

    fn remove(&self, id: u64) {
        self.lock().by_id.remove(&id);
    }

    /// Milliseconds since [`Open::since`].
    fn now(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// One connection's last progress, and whether a newer connection took its place.
struct Activity {
    last: AtomicU64,
    evicted: AtomicBool,
    /// The task waiting on the connection, woken when it is evicted.
    waker: Mutex<Option<Waker>>,
}

impl Activity {
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A connection that fails with `TimedOut` once idle for its limit, or once evicted, and frees
/// its place under the cap when dropped.
pub(crate) struct IdleStream {
    inner: TcpStream,
    open: Arc<Open>,
    id: u64,
    activity: Arc<Activity>,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl IdleStream {
    fn new(inner: TcpStream, open: &Arc<Open>, idle: Duration) -> Self {
        let (id, activity) = open.add();
        Self {
            inner,
            open: open.clone(),
            id,
            activity,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// After progress, the connection has `idle` again; while pending, it fails at the deadline
    /// or when evicted.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let evicted = || {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "metrics connection closed for a newer one (cap)",
            )))
        };
        if self.activity.evicted.load(Ordering::Acquire) {
            return evicted();
        }
        match polled {
            Poll::Ready(result) => {
                let next = Instant::now() + self.idle;
                self.deadline.as_mut().reset(next);
                self.activity.last.store(self.open.now(), Ordering::Relaxed);
                Poll::Ready(result)
            }
            Poll::Pending => {
                *self
                    .activity
                    .waker
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(cx.waker().clone());
                // Evicted between the check above and the waker being stored: nobody wakes us.
                if self.activity.evicted.load(Ordering::Acquire) {
                    return evicted();
                }
                match self.deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "idle metrics connection",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl Drop for IdleStream {
    fn drop(&mut self) {
        self.open.remove(self.id);
    }
}

impl AsyncRead for IdleStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // `IdleStream` is `Unpin`: its fields are reached through the pin.
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.watch(cx, polled)
    }
}

impl AsyncWrite for IdleStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// 600 idle connections held against the default limits (64 at once, cut after 10 s of
    /// idleness) shut scrapes out until the idle cut: a new connection was closed at accept.
    /// Now it takes an idle one's place, and a scrape is answered at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_is_answered_while_600_idle_connections_are_held() {
        let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { "up 1\n" }));
        let limits = ScrapeLimits::default();
        let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), app, limits)
            .await
            .unwrap();
        let mut held = Vec::new();
        for _ in 0..600 {
            held.push(TcpStream::connect(server.addr).await.unwrap());
        }
        let scrape = async {
            let mut s = TcpStream::connect(server.addr).await?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await?;
            let mut out = String::new();
            s.read_to_string(&mut out).await?;
            Ok::<_, io::Error>(out)
        };
        let bound = Duration::from_secs(2);
        let answer = tokio::time::timeout(bound, scrape).await;
        assert!(bound < limits.idle);
        let page = answer
            .expect("no answer within 2 s")
            .expect("the scrape's connection failed");
        assert!(
            page.starts_with("HTTP/1.1 200") && page.ends_with("up 1\n"),
            "{page}"
        );
        drop(held);
        server.shutdown().await;
    }
}
