//! The Prometheus exporter: a task fed by the same [`RoundRecord`]s that go to `metrics.jsonl`,
//! owning a [`prometheus::Registry`] served as text at `GET /metrics` (and `GET /healthz`), and
//! the live page at `GET /` drawn from the same records ([`crate::live`]).
//!
//! The round loop only sends records into an unbounded channel; one updater task applies them to
//! the registry, and scrapes only read the registry. A slow or stuck scraper therefore never
//! delays a round, and a round never waits for a scrape.
//!
//! Naming follows Prometheus conventions: the `fedshard_` prefix, base units (`_seconds`,
//! `_bits`), `_total` for counters, and a constant `run` label (the run name) on every series.

use crate::error::Error;
use crate::live::Live;
use crate::live::{LivePage, RunState};
use crate::record::RoundRecord;
use crate::round::FailureKind;
use crate::scrape_listener::HttpServer;
pub use crate::scrape_listener::ScrapeLimits;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use fedshard_protocol::payload::RejectionKind;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The default listen address of `fedshard run`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

/// The run's metrics: every series lives in one registry with a constant `run` label.
pub struct Metrics {
    registry: Registry,
    round: IntGaugeVec,
    test_accuracy: GaugeVec,
    test_loss: GaugeVec,
    train_loss: GaugeVec,
    uplink_bits: IntCounterVec,
    downlink_bits: IntCounterVec,
    bits_per_parameter: GaugeVec,
    participants: IntGaugeVec,
    successes: IntCounterVec,
    failures: IntCounterVec,
    rejected: IntCounterVec,
    model_updates: IntCounterVec,
    round_duration: HistogramVec,
    client_train_duration: HistogramVec,
    client_uplink_bits: HistogramVec,
    anme: GaugeVec,
    anme_mean: GaugeVec,
    expected_discrepancy: GaugeVec,
    learning_rate: GaugeVec,
    update_cosine: GaugeVec,
    model_version: IntGaugeVec,
    klms_block_kl_bits: GaugeVec,
    klms_drift_ratio: GaugeVec,
    staleness: HistogramVec,
    late: IntCounterVec,
    byzantine: IntCounterVec,
    simulated_seconds: GaugeVec,
    privacy_epsilon: GaugeVec,
    secure_dropped: IntCounterVec,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

impl Metrics {
    /// Registers every metric for the run called `run`.
    pub fn new(run: &str) -> Result<Self, prometheus::Error> {
        let labels = HashMap::from([("run".to_string(), run.to_string())]);
        let registry = Registry::new_custom(None, Some(labels))?;
        let none: &[&str] = &[];
        let gauge =
            |name: &str, help: &str, labels: &[&str]| -> Result<GaugeVec, prometheus::Error> {
                let g = GaugeVec::new(opts(name, help), labels)?;
                registry.register(Box::new(g.clone()))?;
                Ok(g)
            };
        let int_gauge = |name: &str, help: &str| -> Result<IntGaugeVec, prometheus::Error> {
            let g = IntGaugeVec::new(opts(name, help), none)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(opts(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let histogram = |name: &str,
                         help: &str,
                         buckets: Vec<f64>|
         -> Result<HistogramVec, prometheus::Error> {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), none)?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        let metrics = Self {
            round: int_gauge("fedshard_round", "Last completed round.")?,
            test_accuracy: gauge(
                "fedshard_test_accuracy",
                "Accuracy of the global model on the held-out set after the last round.",
                none,
            )?,
            test_loss: gauge(
                "fedshard_test_loss",
                "Loss of the global model on the held-out set after the last round.",
                none,
            )?,
            train_loss: gauge(
                "fedshard_train_loss",
                "Mean local training loss of the accepted clients in the last round.",
                none,
            )?,
            uplink_bits: counter(
                "fedshard_uplink_bits_total",
                "Bits uploaded by clients.",
                none,
            )?,
            downlink_bits: counter(
                "fedshard_downlink_bits_total",
                "Bits sent to clients.",
                none,
            )?,
            bits_per_parameter: gauge(
                "fedshard_bits_per_parameter",
                "Uplink bits per model parameter per accepted client in the last round.",
                none,
            )?,
            participants: int_gauge(
                "fedshard_participants",
                "Clients asked to train in the last round.",
            )?,
            successes: counter(
                "fedshard_client_successes_total",
                "Client updates accepted into the aggregate.",
                none,
            )?,
            failures: counter(
                "fedshard_client_failures_total",
                "Clients that failed, by reason.",
                &["reason"],
            )?,
            rejected: counter(
                "fedshard_rejected_updates_total",
                "Client updates rejected by validation, by reason.",
                &["reason"],
            )?,
            model_updates: counter(
                "fedshard_model_updates_total",
                "Rounds that changed the global model.",
                none,
            )?,
            round_duration: histogram(
                "fedshard_round_duration_seconds",
                "Wall-clock duration of a round.",
                prometheus::exponential_buckets(0.001, 2.0, 18)?,
            )?,
            client_train_duration: histogram(
                "fedshard_client_train_duration_seconds",
                "Time an accepted client spent training.",
                prometheus::exponential_buckets(0.0001, 2.0, 22)?,
            )?,
            client_uplink_bits: histogram(
                "fedshard_client_uplink_bits",
                "Bits of one client's update on the wire (every received update).",
                // 64 bits to 2^34 (2 GiB), ×4 per bucket.
                prometheus::exponential_buckets(64.0, 4.0, 15)?,
            )?,
            anme: gauge(
                "fedshard_anme",
                "Average normalised mean error of the sharded layer for the keep-ratio cluster, last round.",
                &["layer", "cluster"],
            )?,
            anme_mean: gauge(
                "fedshard_anme_mean",
                "Mean ANME over sharded layers and clusters, last round (0 when nothing is sharded).",
                none,
            )?,
            expected_discrepancy: gauge(
                "fedshard_expected_discrepancy",
                "Expected discrepancy of the sharded layer for the keep-ratio cluster, last round.",
                &["layer", "cluster"],
            )?,
            learning_rate: gauge(
                "fedshard_learning_rate",
                "Learning rate of the last round.",
                none,
            )?,
            update_cosine: gauge(
                "fedshard_update_cosine",
                "Cosine similarity between the applied update of the global model and the sample-weighted mean of the accepted clients' updates, last round (NaN when the model did not change).",
                none,
            )?,
            model_version: int_gauge(
                "fedshard_model_version",
                "Versions of the global model applied so far (aggregates that changed it).",
            )?,
            klms_block_kl_bits: gauge(
                "fedshard_klms_block_kl_bits",
                "KLMS: the accepted clients' mean KL per block in bits against the broadcast blocks, last round that reported it (d_target ideally).",
                none,
            )?,
            klms_drift_ratio: gauge(
                "fedshard_klms_drift_ratio",
                "KLMS with rescale_drift or report_drift: the mean share of their drift the accepted clients' candidates carried, last round.",
                none,
            )?,
            staleness: histogram(
                "fedshard_update_staleness",
                "Staleness of each accepted update in async mode: model versions applied between the one its client trained from and the one it was folded into.",
                vec![0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0],
            )?,
            late: counter(
                "fedshard_late_clients_total",
                "Clients cut off by over-commitment: still training when their round had its updates.",
                none,
            )?,
            byzantine: counter(
                "fedshard_byzantine_updates_total",
                "With [faults.byzantine]: updates of byzantine clients accepted into the aggregate (none counted in secure rounds).",
                none,
            )?,
            simulated_seconds: gauge(
                "fedshard_simulated_seconds",
                "Simulated time at the end of the last round or version, under --clock virtual (docs/async.md); absent on the wall clock.",
                none,
            )?,
            privacy_epsilon: gauge(
                "fedshard_privacy_epsilon",
                "With [privacy]: the run's ε at its δ after the last round's release (docs/privacy.md); absent without privacy.",
                none,
            )?,
            secure_dropped: counter(
                "fedshard_secure_dropped_total",
                "With [secure_aggregation]: clients that shared their keys but whose masked input never came; the server removed their masks with the others' shares (docs/secagg.md).",
                none,
            )?,
            registry,
        };
        // Series that exist from the start, so dashboards show zeros rather than "no data".
        metrics.uplink_bits.with_label_values(none);
        metrics.downlink_bits.with_label_values(none);
        metrics.successes.with_label_values(none);
        metrics.model_updates.with_label_values(none);
        metrics.model_version.with_label_values(none);
        metrics.late.with_label_values(none);
        metrics.byzantine.with_label_values(none);
        metrics.staleness.with_label_values(none);
        for kind in FailureKind::ALL {
            metrics.failures.with_label_values(&[kind.label()]);
        }
        for kind in RejectionKind::ALL {
            metrics.rejected.with_label_values(&[kind.label()]);
        }
        Ok(metrics)
    }

    /// Applies one round's record.
    pub fn observe(&self, r: &RoundRecord) {
        let none: &[&str] = &[];
        self.round
            .with_label_values(none)
            .set(i64::try_from(r.round).unwrap_or(i64::MAX));
        self.test_accuracy.with_label_values(none).set(r.accuracy);
        self.test_loss.with_label_values(none).set(r.loss);
        self.train_loss.with_label_values(none).set(r.train_loss);
        self.uplink_bits
            .with_label_values(none)
            .inc_by(r.uplink_bits);
        self.downlink_bits
            .with_label_values(none)
            .inc_by(r.downlink_bits);
        self.bits_per_parameter
            .with_label_values(none)
            .set(r.bits_per_parameter);
        self.participants
            .with_label_values(none)
            .set(i64::try_from(r.participants).unwrap_or(i64::MAX));
        self.successes
            .with_label_values(none)
            .inc_by(r.successes as u64);
        for (kind, n) in &r.failures {
            self.failures
                .with_label_values(&[kind.label()])
                .inc_by(*n as u64);
        }
        for (kind, n) in &r.rejected {
            self.rejected
                .with_label_values(&[kind.label()])
                .inc_by(*n as u64);
        }
        if r.model_updated {
            self.model_updates.with_label_values(none).inc();
            self.model_version.with_label_values(none).inc();
        }
        self.late.with_label_values(none).inc_by(r.late as u64);
        self.byzantine
            .with_label_values(none)
            .inc_by(r.byzantine as u64);
        if let Some(time) = &r.time {
            self.simulated_seconds.with_label_values(none).set(time.end);
        }
        if let Some(p) = &r.privacy {
            self.privacy_epsilon.with_label_values(none).set(p.epsilon);
        }
        if let Some(session) = &r.secure {
            let dropped = self.secure_dropped.with_label_values(none);
            dropped.inc_by(session.dropped as u64);
        }
        let staleness = self.staleness.with_label_values(none);
        for tau in &r.staleness {
            staleness.observe(*tau as f64);
        }
        self.round_duration
            .with_label_values(none)
            .observe(r.seconds);
        let train = self.client_train_duration.with_label_values(none);
        for s in &r.client_train_seconds {
            train.observe(*s);
        }
        let uplink = self.client_uplink_bits.with_label_values(none);
        for bits in r.client_uplink_bits.values() {
            uplink.observe(*bits as f64);
        }
        self.anme_mean.with_label_values(none).set(r.anme);
        for g in &r.groups {
            let cluster = cluster_label(g.keep_ratio);
            let labels = [g.layer.as_str(), cluster.as_str()];
            self.anme.with_label_values(&labels).set(g.anme);
            if let Some(d) = g.expected_discrepancy {
                self.expected_discrepancy.with_label_values(&labels).set(d);
            }
        }
        self.learning_rate
            .with_label_values(none)
            .set(r.learning_rate);
        self.update_cosine
            .with_label_values(none)
            .set(r.update_cosine.unwrap_or(f64::NAN));
        if let Some(kl) = r.klms.and_then(|k| k.block_kl_bits) {
            self.klms_block_kl_bits.with_label_values(none).set(kl);
        }
        if let Some(rho) = r.klms.and_then(|k| k.drift_ratio) {
            self.klms_drift_ratio.with_label_values(none).set(rho);
        }
    }

    /// The registry in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encoding metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// The `cluster` label of a keep ratio: the ratio itself, shortest form (`1`, `0.4`).
pub fn cluster_label(keep_ratio: f64) -> String {
    format!("{keep_ratio}")
}

/// A running exporter: send records with [`Exporter::sender`], stop with [`Exporter::shutdown`].
pub struct Exporter {
    /// The served registry, so other parts of a node can add their series.
    registry: Registry,
    sender: Option<mpsc::UnboundedSender<RoundRecord>>,
    updater: JoinHandle<()>,
    live: Arc<Live>,
    server: HttpServer,
}

impl Exporter {
    /// Binds `addr` and starts serving with the default [`ScrapeLimits`]; must be called
    /// inside a Tokio runtime.
    pub async fn start(addr: SocketAddr, run: &str) -> Result<Self, Error> {
        Self::start_with(addr, run, ScrapeLimits::default()).await
    }

    /// [`Exporter::start`] with its connections capped and idle-timed by `limits`.
    pub async fn start_with(
        addr: SocketAddr,
        run: &str,
        limits: ScrapeLimits,
    ) -> Result<Self, Error> {
        let metrics = Arc::new(Metrics::new(run)?);
        let live = Arc::new(Live::new());
        let app = Router::new()
            .route("/metrics", get(scrape))
            .route("/healthz", get(|| async { "ok\n" }))
            .with_state(Arc::clone(&metrics))
            .merge(Live::routes(&live));
        let server = HttpServer::start(addr, app, limits).await?;
        let registry = metrics.registry.clone();
        let (sender, mut receiver) = mpsc::unbounded_channel::<RoundRecord>();
        let records = Arc::clone(&live);
        let updater = tokio::spawn(async move {
            while let Some(record) = receiver.recv().await {
                metrics.observe(&record);
                records.push(record);
            }
        });
        Ok(Self {
            registry,
            sender: Some(sender),
            updater,
            live,
            server,
        })
    }

    /// Serves `page` at `GET /` (and its changing part at `GET /live`), drawn from the records
    /// sent so far; without one, `/` answers 404.
    pub fn serve_page(&self, page: Arc<dyn LivePage>) {
        self.live.serve(page);
    }

    /// Tells the page how the run stands (it starts [`RunState::Running`]).
    pub fn set_state(&self, state: RunState) {
        self.live.set_state(state);
    }

    /// Serves `collector`'s series beside the run's (with the same `run` label): the cluster
    /// transport's counters on a server node.
    pub fn register(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> Result<(), prometheus::Error> {
        self.registry.register(collector)
    }

    /// The bound address (the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Where to send the run's records.
    pub fn sender(&self) -> mpsc::UnboundedSender<RoundRecord> {
        self.sender
            .clone()
            .expect("the sender lives until the exporter is finished")
    }

    /// Waits until every record sent so far (by every sender, once they are dropped) is applied;
    /// the server keeps serving.
    pub async fn flush(&mut self) {
        self.sender = None;
        let updater = std::mem::replace(&mut self.updater, tokio::spawn(async {}));
        let _ = updater.await;
    }

    /// Stops serving.
    pub async fn shutdown(mut self) {
        self.flush().await;
        self.server.shutdown().await;
    }
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render(),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fedshard_protocol::shard_plan::GroupStats;
    use std::collections::BTreeMap;

    pub(crate) fn record(round: u64) -> RoundRecord {
        RoundRecord {
            round,
            participants: 10,
            successes: 8,
            failures: BTreeMap::from([(FailureKind::Timeout, 2)]),
            rejected: BTreeMap::new(),
            model_updated: true,
            accuracy: 0.5,
            loss: 1.25,
            train_loss: 1.5,
            uplink_bits: 1000,
            downlink_bits: 2000,
            bits_per_parameter: 32.0,
            anme: 0.1,
            groups: vec![GroupStats {
                layer: "weight".into(),
                keep_ratio: 0.4,
                clients: 4,
                kept: 3,
                anme: 0.2,
                expected_discrepancy: Some(0.3),
            }],
            learning_rate: 0.1,
            client_train_seconds: vec![0.01; 8],
            client_uplink_bits: (0..8).map(|c| (c, 125)).collect(),
            seconds: 0.2,
            update_cosine: Some(0.75),
            late: 2,
            byzantine: 3,
            staleness: vec![0, 1, 3],
            phases: Default::default(),
            klms: Some(crate::record::KlmsStats {
                block_uploads: 0,
                block_kl_bits: Some(2.5),
                drift_ratio: Some(0.75),
            }),
            time: Some(crate::record::SimulatedTime {
                start: 10.0 * (round - 1) as f64,
                end: 10.0 * round as f64,
                clients: Default::default(),
            }),
            privacy: None,
            secure: None,
        }
    }

    #[test]
    fn records_become_prometheus_series() {
        let m = Metrics::new("demo").unwrap();
        m.observe(&record(1));
        m.observe(&record(2));
        let text = m.render();
        for line in [
            "fedshard_round{run=\"demo\"} 2",
            "fedshard_uplink_bits_total{run=\"demo\"} 2000",
            "fedshard_downlink_bits_total{run=\"demo\"} 4000",
            "fedshard_client_failures_total{reason=\"timeout\",run=\"demo\"} 4",
            "fedshard_client_failures_total{reason=\"panic\",run=\"demo\"} 0",
            "fedshard_rejected_updates_total{reason=\"shape\",run=\"demo\"} 0",
            "fedshard_client_successes_total{run=\"demo\"} 16",
            "fedshard_test_accuracy{run=\"demo\"} 0.5",
            "fedshard_anme{cluster=\"0.4\",layer=\"weight\",run=\"demo\"} 0.2",
            "fedshard_expected_discrepancy{cluster=\"0.4\",layer=\"weight\",run=\"demo\"} 0.3",
            "fedshard_round_duration_seconds_count{run=\"demo\"} 2",
            "fedshard_client_train_duration_seconds_count{run=\"demo\"} 16",
            "fedshard_client_uplink_bits_count{run=\"demo\"} 16",
            "fedshard_client_uplink_bits_sum{run=\"demo\"} 2000",
            "fedshard_update_cosine{run=\"demo\"} 0.75",
            "fedshard_rejected_updates_total{reason=\"norm_bound\",run=\"demo\"} 0",
            "fedshard_late_clients_total{run=\"demo\"} 4",
            "fedshard_byzantine_updates_total{run=\"demo\"} 6",
            "fedshard_model_version{run=\"demo\"} 2",
            "fedshard_update_staleness_count{run=\"demo\"} 6",
            "fedshard_update_staleness_sum{run=\"demo\"} 8",
            "fedshard_update_staleness_bucket{run=\"demo\",le=\"1\"} 4",
            "fedshard_klms_block_kl_bits{run=\"demo\"} 2.5",
            "fedshard_klms_drift_ratio{run=\"demo\"} 0.75",
            "fedshard_simulated_seconds{run=\"demo\"} 20",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_metrics_and_health_over_http() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut exporter = Exporter::start("127.0.0.1:0".parse().unwrap(), "demo")
            .await
            .unwrap();
        exporter.sender().send(record(7)).unwrap();
        exporter.flush().await;
        let get = |path: &'static str| {
            let addr = exporter.addr();
            async move {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                out
            }
        };
        let metrics = get("/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("fedshard_round{run=\"demo\"} 7"),
            "{metrics}"
        );
        let health = get("/healthz").await;
        assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"));
        // A second exporter on the same address fails with a message naming it.
        let err = Exporter::start(exporter.addr(), "demo")
            .await
            .err()
            .unwrap();
        assert!(
            err.to_string().contains(&exporter.addr().to_string()),
            "{err}"
        );
        exporter.shutdown().await;
    }

    /// Idle connections to the metrics port are cut after the idle limit, and those over the
    /// cap as newer ones take their places, so they cannot hold the process's file
    /// descriptors; a scrape still works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_and_excess_metrics_connections_are_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limits = ScrapeLimits {
            max_connections: 4,
            idle: std::time::Duration::from_millis(300),
        };
        let exporter = Exporter::start_with("127.0.0.1:0".parse().unwrap(), "demo", limits)
            .await
            .unwrap();
        let mut idle = Vec::new();
        for _ in 0..10 {
            idle.push(
                tokio::net::TcpStream::connect(exporter.addr())
                    .await
                    .unwrap(),
            );
        }
        // Every one of them is closed by the server: the first six to make room for newer
        // ones, the last four once idle. A read returns end of file (or a reset), never hangs.
        for stream in &mut idle {
            let mut byte = [0u8; 1];
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(60), stream.read(&mut byte))
                    .await
                    .expect("an idle metrics connection stayed open");
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        }
        drop(idle);
        let mut s = tokio::net::TcpStream::connect(exporter.addr())
            .await
            .unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        exporter.shutdown().await;
    }
}
