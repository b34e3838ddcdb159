//! The live page at `GET /` of the metrics address: the run's records so far, drawn by a
//! [`LivePage`] that the binary supplies (the figures live in the `fedshard` crate's report
//! module, which this crate cannot see), refreshed by the page itself through `GET /live`.
//!
//! The exporter's updater task appends every record it applies to the registry, so the page and
//! `/metrics` show the same rounds. Drawing happens on a blocking thread, at most once a second
//! whatever the number of viewers (the last drawing is served until a record arrives, the run
//! ends or a second passes), so a page left open, or many, never takes the run's cores.

use crate::error::Error;
use crate::record::RoundRecord;
use crate::scrape_listener::{HttpServer, ScrapeLimits};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// How the run stands, as the page says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    Running,
    Finished,
    /// The run stopped with this error.
    Failed(String),
}

/// What a page is drawn from.
pub struct LiveView<'a> {
    /// Every record so far, in order (a resumed run's history first).
    pub records: &'a [Arc<RoundRecord>],
    pub state: &'a RunState,
    /// Since the page started serving, until the run ended (then it stays).
    pub elapsed: Duration,
}

/// Draws the live page.
pub trait LivePage: Send + Sync + 'static {
    /// The part of the page that changes, served alone at `GET /live`.
    fn live(&self, view: &LiveView<'_>) -> String;
    /// The whole page at `GET /`, around the part drawn by [`LivePage::live`] (a finished
    /// page need not refresh itself).
    fn document(&self, live: &str, state: &RunState) -> String;
}

/// The records and state the page is drawn from, shared by the updater and the handlers.
pub(crate) struct Live {
    records: RwLock<Vec<Arc<RoundRecord>>>,
    state: RwLock<RunState>,
    page: OnceLock<Arc<dyn LivePage>>,
    started: Instant,
    /// When the state left [`RunState::Running`].
    ended: RwLock<Option<Instant>>,
    /// The last drawing of the live part and what it was drawn from.
    drawn: tokio::sync::Mutex<Option<(DrawKey, Arc<str>)>>,
}

/// A drawing stays valid while the records, the state and the second are the same.
#[derive(PartialEq)]
struct DrawKey {
    records: usize,
    state: RunState,
    second: u64,
}

impl Live {
    pub(crate) fn new() -> Self {
        Self {
            records: RwLock::new(Vec::new()),
            state: RwLock::new(RunState::Running),
            page: OnceLock::new(),
            started: Instant::now(),
            ended: RwLock::new(None),
            drawn: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn push(&self, record: RoundRecord) {
        self.records
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::new(record));
    }

    pub(crate) fn set_state(&self, state: RunState) {
        *self
            .ended
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            (state != RunState::Running).then(Instant::now);
        *self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = state;
    }

    /// Serves `page` from now on; a second page is ignored (a run has one).
    pub(crate) fn serve(&self, page: Arc<dyn LivePage>) {
        let _ = self.page.set(page);
    }

    /// `GET /` and `GET /live` over `live`.
    pub(crate) fn routes(live: &Arc<Self>) -> Router {
        Router::new()
            .route("/", get(document))
            .route("/live", get(part))
            .with_state(Arc::clone(live))
    }

    /// The live part, drawn again only when something it shows may have changed.
    async fn draw(&self) -> Option<(Arc<dyn LivePage>, Arc<str>, RunState)> {
        let page = Arc::clone(self.page.get()?);
        let records = self
            .records
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let state = self
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let ended = *self
            .ended
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let elapsed = ended.unwrap_or_else(Instant::now) - self.started;
        let key = DrawKey {
            records: records.len(),
            state,
            second: elapsed.as_secs(),
        };
        // Held while drawing: viewers arriving meanwhile get this drawing instead of another.
        let mut drawn = self.drawn.lock().await;
        if let Some((last, text)) = drawn.as_ref()
            && *last == key
        {
            return Some((page, Arc::clone(text), key.state));
        }
        let drawer = Arc::clone(&page);
        let state = key.state.clone();
        let text: Arc<str> = tokio::task::spawn_blocking(move || {
            drawer
                .live(&LiveView {
                    records: &records,
                    state: &state,
                    elapsed,
                })
                .into()
        })
        .await
        .ok()?;
        let state = key.state.clone();
        *drawn = Some((key, Arc::clone(&text)));
        Some((page, text, state))
    }
}

/// A live page served on its own, with no records and no `/metrics`: `fedshard report
/// --serve`, whose page reads run folders as they are written.
pub struct PageServer {
    live: Arc<Live>,
    server: HttpServer,
}

impl PageServer {
    /// Binds `addr` and serves `page` there; must be called inside a Tokio runtime.
    pub async fn start(addr: SocketAddr, page: Arc<dyn LivePage>) -> Result<Self, Error> {
        let live = Arc::new(Live::new());
        live.serve(page);
        let server = HttpServer::start(addr, Live::routes(&live), ScrapeLimits::default()).await?;
        Ok(Self { live, server })
    }

    /// The bound address (the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Tells the page how what it shows stands (it starts [`RunState::Running`]).
    pub fn set_state(&self, state: RunState) {
        self.live.set_state(state);
    }

    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

const NO_PAGE: &str = "this address serves /metrics and /healthz only\n";

fn html(body: String) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the whole page.
pub(crate) async fn document(State(live): State<Arc<Live>>) -> Response {
    match live.draw().await {
        Some((page, part, state)) => html(page.document(&part, &state)),
        None => (StatusCode::NOT_FOUND, NO_PAGE).into_response(),
    }
}

/// `GET /live`: the part of the page that changes.
pub(crate) async fn part(State(live): State<Arc<Live>>) -> Response {
    match live.draw().await {
        Some((_, part, _)) => html(part.to_string()),
        None => (StatusCode::NOT_FOUND, NO_PAGE).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Exporter;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A page that says what it was drawn from and counts its drawings.
    #[derive(Default)]
    struct Counting {
        drawn: AtomicUsize,
    }

    impl LivePage for Counting {
        fn live(&self, view: &LiveView<'_>) -> String {
            self.drawn.fetch_add(1, Ordering::SeqCst);
            let last = view.records.last().map_or(0, |r| r.round);
            format!(
                "{} records, last {last}, {:?}",
                view.records.len(),
                view.state
            )
        }

        fn document(&self, live: &str, state: &RunState) -> String {
            format!(
                "<main>{live}</main> running={}",
                *state == RunState::Running
            )
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_page_shows_the_records_so_far_and_is_drawn_once_per_change() {
        let mut exporter = Exporter::start("127.0.0.1:0".parse().unwrap(), "demo")
            .await
            .unwrap();
        let addr = exporter.addr();
        // No page: `/` says what the address serves instead.
        assert!(get(addr, "/").await.starts_with("HTTP/1.1 404"));
        let page = Arc::new(Counting::default());
        exporter.serve_page(Arc::clone(&page) as _);
        for round in [1, 2] {
            let mut record = crate::metrics::tests::record(round);
            record.round = round;
            exporter.sender().send(record).unwrap();
        }
        exporter.flush().await;
        let document = get(addr, "/").await;
        assert!(document.starts_with("HTTP/1.1 200"), "{document}");
        assert!(
            document.contains("<main>2 records, last 2, Running</main> running=true"),
            "{document}"
        );
        // Many viewers within the same second share one drawing.
        let before = page.drawn.load(Ordering::SeqCst);
        for _ in 0..20 {
            assert!(
                get(addr, "/live")
                    .await
                    .ends_with("2 records, last 2, Running")
            );
        }
        let drawn = page.drawn.load(Ordering::SeqCst) - before;
        assert!(drawn <= 2, "drawn {drawn} times for 20 viewers");
        // The end of the run is drawn at once, and the document stops refreshing.
        exporter.set_state(RunState::Finished);
        assert!(get(addr, "/live").await.ends_with("Finished"));
        assert!(get(addr, "/").await.ends_with("running=false"));
        exporter.shutdown().await;
    }
}
