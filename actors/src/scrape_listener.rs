//! The `/metrics` listener (and the live page's, [`HttpServer`]): at most [`ScrapeLimits::max_connections`] connections at once, each
//! cut after [`ScrapeLimits::idle`] without a byte either way. Without them, idle connections
//! to the metrics port held one file descriptor each for ever, and enough of them starved the
//! rest of the process (a server node then could not accept its client nodes).

use axum::serve::Listener;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// What one scraper may hold of the metrics listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
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

/// A TCP listener that hands axum at most `max_connections` idle-timed streams at once.
pub(crate) struct CappedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl CappedListener {
    pub(crate) fn new(inner: TcpListener, limits: ScrapeLimits) -> Self {
        Self {
            inner,
            permits: Arc::new(Semaphore::new(limits.max_connections)),
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
                Ok((stream, peer)) => match self.permits.clone().try_acquire_owned() {
                    Ok(permit) => return (IdleStream::new(stream, permit, self.idle), peer),
                    // Over the cap: closed at once, so the descriptor is not held.
                    Err(_) => tracing::debug!("metrics: closed a connection from {peer} (cap)"),
                },
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

/// A connection that fails with `TimedOut` once idle for its limit, and frees its place under
/// the cap when dropped.
pub(crate) struct IdleStream {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl IdleStream {
    fn new(inner: TcpStream, permit: OwnedSemaphorePermit, idle: Duration) -> Self {
        Self {
            inner,
            _permit: permit,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// After progress, the connection has `idle` again; while pending, it fails at the deadline.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                let next = Instant::now() + self.idle;
                self.deadline.as_mut().reset(next);
                Poll::Ready(result)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "idle metrics connection",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
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
