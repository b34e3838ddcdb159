//! The live page at the metrics address, looked at in headless Chromium as a person would: a
//! run's page refreshing while the run goes and showing the whole run once it is over, a
//! `serve`'s page with its two client nodes, and `report --serve` following a run folder as it
//! is written. Needs `chromium` on PATH (`cargo xtask test` installs it). Everything listens on
//! 127.0.0.1, every process is killed at the end, every wait is bounded; screenshots are left in
//! `target/test-artefacts/`.

mod common;

use common::browser::{Chromium, artefacts};
use common::process::{Proc, wait_for};
use common::{free_port, http_get, write_private};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

const BIN: &str = env!("CARGO_BIN_EXE_fedshard");
const ROUNDS: u64 = 40;
/// Virtual time for reading a page until its run is over: its refreshes stop then, and
/// Chromium returns as soon as nothing is left to do (each refresh takes real time to fetch).
const UNTIL_OVER_MS: u64 = 3_600_000;

/// The tests share two cores and pace runs in real time: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Chromium with a window tall enough for the status, the nodes and the first figures.
fn browser(tmp: &Path, budget_ms: u64) -> Chromium<'_> {
    Chromium {
        tmp,
        width: 1280,
        height: 1400,
        budget_ms,
    }
}

/// The value of the first `name="…"` attribute in `html`.
fn attribute(html: &str, name: &str) -> Option<String> {
    let start = html.find(&format!("{name}=\""))? + name.len() + 2;
    let end = html[start..].find('"')? + start;
    Some(html[start..end].to_string())
}

fn number(html: &str, name: &str) -> u64 {
    attribute(html, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number in {name}=\"…\": {html}"))
}

/// digits-linear for `ROUNDS` rounds, paced so that it lasts tens of seconds: a round waits up
/// to 200 ms for its slowest client and about half the rounds have one sleeping past it.
fn paced_config(dir: &Path, name: &str) -> PathBuf {
    let text = std::fs::read_to_string("config/digits-linear.toml")
        .unwrap()
        .replace("name = \"digits-linear\"", &format!("name = \"{name}\""))
        .replace("rounds = 30", &format!("rounds = {ROUNDS}"))
        .replace("deadline_ms = 30000", "deadline_ms = 200")
        + "\n[faults]\nrate = 0.05\nkinds = [\"timeout\"]\ndelay_ms = 400\n";
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn spawn(dir: &Path, name: &str, args: &[&str]) -> Proc {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("FEDSHARD_SECRET")
        .env_remove("RUST_LOG");
    Proc::spawn(command, dir, name)
}

/// Waits until the page at `port` shows at least `round`; returns its live part.
fn wait_for_round(port: u16, round: u64, process: &Proc) -> String {
    let mut part = String::new();
    wait_for(&format!("round {round} on the live page"), || {
        part = http_get(port, "/live").unwrap_or_default();
        let shown = attribute(&part, "data-round").and_then(|r| r.parse::<u64>().ok());
        shown.is_some_and(|r| r >= round)
    });
    assert!(
        !part.contains("data-state=\"failed\""),
        "the run failed: {}",
        process.log()
    );
    part
}

/// Figures drawn inline, and the sections a run page always has.
fn assert_figures(html: &str, what: &str) {
    let svgs = html.matches("<svg").count();
    assert!(svgs >= 5, "{what}: {svgs} figures: {html}");
    for id in ["accuracy", "loss", "bits", "participation"] {
        assert!(
            html.contains(&format!("<section id=\"{id}\"")),
            "{what}: no {id} figure"
        );
    }
}

#[test]
fn a_run_page_refreshes_while_the_run_goes_and_shows_the_whole_run_at_the_end() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let config = paced_config(tmp, "live-run");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let out = tmp.join("run");
    let mut run = spawn(
        tmp,
        "run",
        &[
            "run",
            config.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--metrics-addr",
            &addr,
            "--linger",
            "60",
        ],
    );
    wait_for_round(port, 2, &run);
    assert!(
        run.log().contains(&format!("live page on http://{addr}/")),
        "the run does not say where its page is: {}",
        run.log()
    );
    let chromium = browser(tmp, 5_000);
    let url = format!("http://{addr}/");
    // Mid-run, after two refreshes of virtual time.
    let shot = artefacts().join("live-page-running.png");
    chromium.screenshot(&url, &shot).unwrap();
    assert!(std::fs::metadata(&shot).unwrap().len() > 20_000, "{shot:?}");

    // Read until the run is over: the page refreshed, its round counter advanced, and it
    // ended on the whole run.
    let dom = browser(tmp, UNTIL_OVER_MS).dom(&url).unwrap();
    let refreshes = number(&dom, "data-refreshes");
    let first = number(&dom, "data-first-round");
    let last = number(&dom, "data-round");
    assert!(refreshes >= 2, "{refreshes} refreshes: {dom}");
    assert!(first < last, "the round stayed at {first}: {dom}");
    assert_eq!(attribute(&dom, "data-state").as_deref(), Some("finished"));
    assert_eq!(last, ROUNDS);
    assert_figures(&dom, "the page read until the end");

    // The page of the finished run, as someone opening it during --linger gets it.
    let page = http_get(port, "/").unwrap();
    assert!(page.contains("data-state=\"finished\""), "{page}");
    assert!(page.contains(&format!("Finished: {ROUNDS} rounds of {ROUNDS}")));
    assert!(
        !page.contains("http-equiv=\"refresh\""),
        "a finished page reloads"
    );
    assert_figures(&page, "the finished page");
    chromium
        .screenshot(&url, &artefacts().join("live-page-finished.png"))
        .unwrap();
    // /metrics is still there beside the page.
    let metrics = http_get(port, "/metrics").unwrap();
    assert!(metrics.contains(&format!("fedshard_round{{run=\"live-run\"}} {ROUNDS}")));
    run.sigkill();
}

#[test]
fn a_serve_page_shows_its_client_nodes() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let config = paced_config(tmp, "live-serve");
    let secret = tmp.join("secret");
    write_private(&secret, "live-page-test-secret-0123456789abcdef\n");
    let listen = format!("127.0.0.1:{}", free_port());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let out = tmp.join("serve");
    let (config, secret) = (config.to_str().unwrap(), secret.to_str().unwrap());
    let mut server = spawn(
        tmp,
        "serve",
        &[
            "serve",
            config,
            "--listen",
            &listen,
            "--out",
            out.to_str().unwrap(),
            "--secret-file",
            secret,
            "--metrics-addr",
            &addr,
            "--linger",
            "60",
        ],
    );
    // Before any node: the page says so.
    wait_for("the serve page", || {
        http_get(port, "/live").is_some_and(|p| p.contains("No client node has registered yet"))
    });
    let mut nodes: Vec<Proc> = [("node-a", "0-9"), ("node-b", "10-19")]
        .iter()
        .map(|(name, clients)| {
            let args = [
                "join",
                config,
                "--server",
                &listen,
                "--clients",
                clients,
                "--name",
                name,
                "--secret-file",
                secret,
            ];
            spawn(tmp, name, &args)
        })
        .collect();
    let part = wait_for_round(port, 3, &server);
    for name in ["node-a", "node-b"] {
        let row = part
            .split("<tr ")
            .find(|r| r.contains(&format!("data-node=\"{name}\"")))
            .unwrap_or_else(|| panic!("no row for {name}: {part}"));
        assert!(row.contains("data-connected=\"true\""), "{row}");
        assert!(row.contains("<td class=\"n\">10</td>"), "10 clients: {row}");
    }
    assert!(part.contains("Refused: none."), "{part}");

    let chromium = browser(tmp, UNTIL_OVER_MS);
    let url = format!("http://{addr}/");
    let dom = chromium.dom(&url).unwrap();
    assert_eq!(attribute(&dom, "data-state").as_deref(), Some("finished"));
    assert!(number(&dom, "data-refreshes") >= 2, "{dom}");
    assert_figures(&dom, "the serve page");
    // Every node answered up to the last round (whether it has left yet or not).
    for name in ["node-a", "node-b"] {
        let row = dom
            .split("<tr ")
            .find(|r| r.contains(&format!("data-node=\"{name}\"")))
            .unwrap_or_else(|| panic!("no row for {name}: {dom}"));
        assert!(
            row.contains(&format!("<td class=\"n\">{ROUNDS}</td>")),
            "{row}"
        );
    }
    chromium
        .screenshot(&url, &artefacts().join("live-page-serve.png"))
        .unwrap();
    for node in &mut nodes {
        node.expect_success();
    }
    server.sigkill();
}

#[test]
fn report_serve_follows_run_folders_while_they_are_written() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let config = paced_config(tmp, "live-report");
    let out = tmp.join("run");
    let grid = tmp.join("grid");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // The report is served before the run folder and the grid exist.
    let mut report = spawn(
        tmp,
        "report",
        &[
            "report",
            "--serve",
            &addr,
            out.to_str().unwrap(),
            grid.to_str().unwrap(),
        ],
    );
    wait_for("the report page", || {
        http_get(port, "/live").is_some_and(|p| p.contains("Waiting:"))
    });
    let mut run = spawn(
        tmp,
        "run",
        &[
            "run",
            config.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--metrics-addr",
            "off",
        ],
    );
    wait_for("the run's first rounds in the report", || {
        http_get(port, "/live").is_some_and(|p| p.contains("<svg"))
    });
    let mut compare = spawn(
        tmp,
        "compare",
        &[
            "compare",
            "config/digits-linear.toml",
            "--strategies",
            "unbiased",
            "--keep-ratios",
            "0.4",
            "--seeds",
            "1",
            "--rounds",
            "3",
            "--out",
            grid.to_str().unwrap(),
        ],
    );
    let url = format!("http://{addr}/");
    let dom = browser(tmp, UNTIL_OVER_MS).dom(&url).unwrap();
    run.expect_success();
    compare.expect_success();
    assert!(number(&dom, "data-refreshes") >= 2, "{dom}");
    assert_eq!(attribute(&dom, "data-state").as_deref(), Some("finished"));
    assert!(dom.contains("2 of 2 finished"), "{dom}");
    // The grid's two runs (the strategy and the no-sharding reference) and their curves.
    assert!(dom.contains("2 runs finished; the grid is done"), "{dom}");
    assert!(dom.contains("<section class=\"grid\">"), "{dom}");
    assert!(dom.matches("<svg").count() >= 6, "{dom}");
    report.sigkill();
}
