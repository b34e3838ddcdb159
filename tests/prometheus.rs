//! A real Prometheus scrapes a real `fedshard run` (the sharded digits config, its updates sent
//! with SignSGD-KLMS), and every PromQL query of `dashboards/fedshard.json` returns data; the
//! scraped final values agree with `metrics.jsonl`; and, while the run is still up, headless
//! Chromium screenshots Prometheus's own graph page for the accuracy and the uplink bitrate (the
//! live view without Grafana), saved as test artefacts in `target/test-artefacts/`.
//!
//! Needs the `prometheus` binary on `PATH` (Debian: `apt-get install prometheus`; `cargo xtask test`
//! installs it). Without it every test fails and says how to get it: a pass always means a real
//! Prometheus scraped a real run. The screenshot test needs `chromium` as well (Debian: `apt-get
//! install chromium`) and fails likewise without it. Everything listens on 127.0.0.1; every
//! process is killed at the end; every wait is bounded.

mod common;

use common::browser::{Chromium, artefacts};
use common::free_port;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_fedshard");
const RUN: &str = "prom-test";
const ROUNDS: usize = 80;
/// What `$__rate_interval` becomes: several 1 s scrapes.
const RATE_INTERVAL: &str = "10s";
/// A round waits for its slowest client up to this deadline …
const DEADLINE_MS: u64 = 200;
/// … and about two rounds in three have a client that sleeps past it: the run then lasts long
/// enough (tens of 1 s scrapes) for Prometheus to record curves, not just the final values.
const PACING_FAULTS: &str = "\n[faults]\nrate = 0.1\nkinds = [\"timeout\"]\ndelay_ms = 400\n";
/// The clients send their updates with SignSGD-KLMS and a rescaled drift, so that the KLMS
/// panels (KL per block, drift ratio) have data too.
const KLMS_UPLINK: &str = "compressor = \"signsgd-klms\"";
const KLMS_TABLE: &str =
    "\n[compression]\nd_target = 4\nmargin_bits = 4\nrescale_drift = true\nserver_lr = 0.05\n";
/// `--linger`: long enough that the run still serves `/metrics` while the queries are evaluated
/// and the screenshots taken (the processes are killed at the end anyway).
const LINGER_S: &str = "40";
/// The live-view screenshots: (file name in `target/test-artefacts/`, PromQL on the graph page).
fn screenshot_queries() -> [(&'static str, String); 2] {
    [
        (
            "prometheus-accuracy.png",
            format!("fedshard_test_accuracy{{run=\"{RUN}\"}}"),
        ),
        (
            "prometheus-uplink-bitrate.png",
            format!("rate(fedshard_uplink_bits_total{{run=\"{RUN}\"}}[{RATE_INTERVAL}])"),
        ),
    ]
}

struct Outcome {
    /// (expr, number of series) for every query of the dashboard.
    queries: Vec<(String, Result<usize, String>)>,
    scraped_accuracy: f64,
    scraped_uplink_total: f64,
    jsonl_accuracy: f64,
    jsonl_uplink_total: f64,
    /// The saved screenshots, or why there are none.
    screenshots: Result<Vec<Screenshot>, String>,
}

struct Screenshot {
    path: PathBuf,
    /// The page's DOM after the same rendering time, to tell a graph from "no data".
    dom: String,
    /// Whether `fedshard run` was still running when it was taken.
    during_run: bool,
}

/// Kills and reaps its processes when dropped, panics included.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How to get the binary, for the failure message.
const INSTALL_HINT: &str = "these tests start a real Prometheus: install it (Debian/Ubuntu: \
    `apt-get install prometheus`; elsewhere https://prometheus.io/download/) or run `cargo xtask test`, \
    which installs it";

/// Fails, saying how to install it, unless `prometheus --version` runs and succeeds.
fn require_prometheus() {
    let status = Command::new("prometheus")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("`prometheus --version` failed ({status}); {INSTALL_HINT}"),
        Err(e) => panic!("cannot run `prometheus` ({e}): is it on PATH? {INSTALL_HINT}"),
    }
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` over HTTP/1.0 (no chunked bodies); the body of a 200 answer.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or("no HTTP header")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!("{}: {body}", head.lines().next().unwrap_or("")));
    }
    Ok(body.to_string())
}

/// The result vector of an instant query evaluated at `time`.
fn query(port: u16, expr: &str, time: f64) -> Result<Vec<Value>, String> {
    let body = http_get(
        port,
        &format!("/api/v1/query?query={}&time={time:.3}", encode(expr)),
    )?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if v["status"] != "success" {
        return Err(body);
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// The value of a single-series instant query.
fn scalar(port: u16, expr: &str, time: f64) -> Option<f64> {
    let result = query(port, expr, time).ok()?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Every `expr` of the dashboard, with the Grafana variables substituted.
fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string("dashboards/fedshard.json").unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    walk(&dashboard, &mut exprs);
    exprs
        .into_iter()
        .map(|e| {
            e.replace("${run}", RUN)
                .replace("$run", RUN)
                .replace("$__rate_interval", RATE_INTERVAL)
        })
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn scenario(tmp: &Path) -> Outcome {
    let config = tmp.join("config.toml");
    let text = std::fs::read_to_string("config/digits-linear.toml")
        .unwrap()
        .replace("name = \"digits-linear\"", &format!("name = \"{RUN}\""))
        .replace("rounds = 30", &format!("rounds = {ROUNDS}"))
        .replace(
            "deadline_ms = 30000",
            &format!("deadline_ms = {DEADLINE_MS}\n{KLMS_UPLINK}"),
        )
        + PACING_FAULTS
        + KLMS_TABLE;
    std::fs::write(&config, text).unwrap();
    let started = Instant::now();
    let metrics_port = free_port();
    let prom_port = free_port();
    let run_dir = tmp.join("run");
    let mut processes = Processes(Vec::new());
    processes.0.push(
        Command::new(BIN)
            .args(["run", "--quiet", "--linger", LINGER_S, "--metrics-addr"])
            .arg(format!("127.0.0.1:{metrics_port}"))
            .arg("--out")
            .arg(&run_dir)
            .arg(&config)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let prom_config = tmp.join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: fedshard\n    scrape_timeout: 1s\n    static_configs:\n      - targets: [\"127.0.0.1:{metrics_port}\"]\n"
        ),
    )
    .unwrap();
    let prom_log = std::fs::File::create(tmp.join("prometheus.log")).unwrap();
    processes.0.push(
        Command::new("prometheus")
            .arg(format!("--config.file={}", prom_config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(prom_log)
            .spawn()
            .unwrap(),
    );

    // At least two successful scrapes, then the final round seen by Prometheus (during --linger).
    let limit = Duration::from_secs(180);
    let up = "sum_over_time(up{job=\"fedshard\"}[10m])";
    wait_for("two successful scrapes", limit, || {
        scalar(prom_port, up, now()).is_some_and(|n| n >= 2.0)
    });
    let jsonl = run_dir.join("metrics.jsonl");
    let lines = || {
        std::fs::read_to_string(&jsonl)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    wait_for("the run to finish", limit, || lines() == ROUNDS);
    let round = format!("fedshard_round{{run=\"{RUN}\"}}");
    let mut at = 0.0;
    wait_for(
        "a scrape of the final round",
        Duration::from_secs(8),
        || {
            at = now();
            scalar(prom_port, &round, at) == Some(ROUNDS as f64)
        },
    );
    // Leave a scrape or two after `at`, then evaluate everything at `at`.
    std::thread::sleep(Duration::from_millis(1500));

    // The live view, taken while `fedshard run` still serves `/metrics` (it lingers).
    let range_s = started.elapsed().as_secs() + 5;
    let screenshots = screenshot_queries()
        .iter()
        .map(|(name, expr)| {
            let url = format!(
                "http://127.0.0.1:{prom_port}/graph?g0.expr={}&g0.tab=0&g0.range_input={range_s}s",
                encode(expr)
            );
            let path = artefacts().join(name);
            let chromium = Chromium {
                tmp,
                width: 1280,
                height: 800,
                budget_ms: 10_000,
            };
            chromium.screenshot(&url, &path)?;
            let dom = chromium.dom(&url)?;
            let during_run = processes.0[0].try_wait().is_ok_and(|s| s.is_none());
            Ok(Screenshot {
                path,
                dom,
                during_run,
            })
        })
        .collect();

    let queries = dashboard_exprs()
        .into_iter()
        .map(|e| {
            let n = query(prom_port, &e, at).map(|r| r.len());
            (e, n)
        })
        .collect();
    let records: Vec<Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = records.last().unwrap();
    let outcome = Outcome {
        queries,
        scraped_accuracy: scalar(
            prom_port,
            &format!("fedshard_test_accuracy{{run=\"{RUN}\"}}"),
            at,
        )
        .unwrap_or(f64::NAN),
        scraped_uplink_total: scalar(
            prom_port,
            &format!("fedshard_uplink_bits_total{{run=\"{RUN}\"}}"),
            at,
        )
        .unwrap_or(f64::NAN),
        jsonl_accuracy: last["accuracy"].as_f64().unwrap(),
        jsonl_uplink_total: records
            .iter()
            .map(|r| r["uplink_bits"].as_u64().unwrap() as f64)
            .sum(),
        screenshots,
    };
    drop(processes);
    outcome
}

/// Runs the scenario once for both tests; fails both when `prometheus` is missing.
fn outcome() -> &'static Outcome {
    static OUTCOME: OnceLock<Outcome> = OnceLock::new();
    OUTCOME.get_or_init(|| {
        require_prometheus();
        let tmp = tempfile::tempdir().unwrap();
        scenario(tmp.path())
    })
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let outcome = outcome();
    assert!(outcome.queries.len() >= 10, "too few queries found");
    let bad: Vec<String> = outcome
        .queries
        .iter()
        .filter(|(_, n)| !matches!(n, Ok(n) if *n > 0))
        .map(|(e, n)| format!("{e}: {n:?}"))
        .collect();
    assert!(bad.is_empty(), "queries without data:\n{}", bad.join("\n"));
}

#[test]
fn scraped_final_values_agree_with_metrics_jsonl() {
    let o = outcome();
    assert!(
        (o.scraped_accuracy - o.jsonl_accuracy).abs() < 1e-12,
        "accuracy: scraped {} vs metrics.jsonl {}",
        o.scraped_accuracy,
        o.jsonl_accuracy
    );
    assert_eq!(
        o.scraped_uplink_total, o.jsonl_uplink_total,
        "uplink bits: scraped vs the sum of metrics.jsonl"
    );
}

/// The live view without Grafana: Prometheus's own graph page, rendered by headless Chromium
/// during the run, shows the accuracy and the uplink bitrate of this run.
#[test]
fn prometheus_graph_page_screenshots_show_accuracy_and_bitrate() {
    let screenshots = match &outcome().screenshots {
        Ok(screenshots) => screenshots,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(screenshots.len(), screenshot_queries().len());
    for shot in screenshots {
        let png =
            std::fs::read(&shot.path).unwrap_or_else(|e| panic!("{}: {e}", shot.path.display()));
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{} is not a PNG",
            shot.path.display()
        );
        // IHDR, the first chunk, holds the width and height (big-endian) at bytes 16..24.
        assert_eq!(&png[12..16], b"IHDR", "{}", shot.path.display());
        let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((width, height), (1280, 800), "{}", shot.path.display());
        // A blank 1280×800 page compresses to a few kB; the graph page with its plot and legend
        // is tens of kB.
        assert!(
            png.len() > 20_000,
            "{}: only {} bytes, hardly a rendered graph",
            shot.path.display(),
            png.len()
        );
        // The rendered page drew this run's series: its legend names the run, and the page has
        // no "no data" notice.
        assert!(
            shot.dom.contains(&format!("run=\"{RUN}\"")),
            "{}: the rendered page has no series of the run:\n{}",
            shot.path.display(),
            shot.dom
        );
        assert!(
            !shot.dom.contains("No datapoints found"),
            "{}",
            shot.path.display()
        );
        assert!(
            shot.during_run,
            "{}: `fedshard run` had already exited when it was taken",
            shot.path.display()
        );
    }
}
