//! What a finished run leaves for a person to read, through the real `fedshard` binary: the run
//! folder's `metrics.csv` (the same numbers as `metrics.jsonl`) and `plots/`, the HTML page of
//! `fedshard report`, the output folder of `fedshard compare --out`, and the progress lines
//! printed when stderr is not a terminal.
//!
//! Two 3-round softmax federations on the embedded digits (about a second each) are shared by
//! the tests, in `CARGO_TARGET_TMPDIR/report-runs`.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

const CONFIG: &str = r#"
[run]
name = "report-test"
seed = 1
rounds = 3

[data]
dataset = "digits"
clients = 8
alpha = 1.0
min_samples = 20

[model]
kind = "softmax"
sharded_layers = ["fc0.weight"]

[training]
learning_rate = 0.05
epochs = 1

[federation]
clients_per_round = 4
strategy = "unbiased"
keep_ratios = [{ ratio = 1.0, share = 0.5 }, { ratio = 0.4, share = 0.5 }]
deadline_ms = 30000
"#;

/// The plots every run folder gets, by file stem.
const PLOTS: [&str; 6] = [
    "accuracy",
    "loss",
    "bits",
    "bits-per-parameter",
    "participation",
    "anme",
];

struct Fixture {
    root: PathBuf,
    /// Seed 1, `/metrics` on an ephemeral port, default progress (every round for 3 rounds).
    first: PathBuf,
    first_output: Output,
    /// Seed 2, no exporter, `--progress-every 2`.
    second: PathBuf,
    second_output: Output,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-runs");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let config = root.join("report-test.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let run = |name: &str, extra: &[&str]| {
            let dir = root.join(name);
            let mut args = vec![
                "run",
                config.to_str().unwrap(),
                "--out",
                dir.to_str().unwrap(),
            ];
            args.extend(extra);
            // `output()` pipes stderr, so the binary sees no terminal there.
            let out = common::fedshard(&args);
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            (dir, out)
        };
        let (first, first_output) = run("seed-1", &["--metrics-addr", "127.0.0.1:0"]);
        let (second, second_output) = run(
            "seed-2",
            &[
                "--seed",
                "2",
                "--metrics-addr",
                "off",
                "--progress-every",
                "2",
            ],
        );
        Fixture {
            root,
            first,
            first_output,
            second,
            second_output,
        }
    })
}

fn jsonl(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The CSV as one map column → cell per row.
fn csv(dir: &Path) -> (Vec<String>, Vec<BTreeMap<String, String>>) {
    let text = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    let rows = lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), header.len(), "row {l:?}");
            header
                .iter()
                .cloned()
                .zip(cells.iter().map(|c| c.to_string()))
                .collect()
        })
        .collect();
    (header, rows)
}

/// One row per round, a header, and every number equal to the JSON line's; a `null` (NaN) is an
/// empty cell. Both files hold the shortest round-trip form of the same f64, but serde_json's
/// default parser may miss the last bit, so floats are compared to 1e-15 relative.
#[test]
fn metrics_csv_has_the_jsonl_numbers_one_row_per_round() {
    let f = fixture();
    let records = jsonl(&f.first);
    let (header, rows) = csv(&f.first);
    assert_eq!(records.len(), 3);
    assert_eq!(rows.len(), 3);
    for column in [
        "failures_timeout",
        "rejected_stale",
        "client_train_seconds_mean",
    ] {
        assert!(header.iter().any(|h| h == column), "no column {column}");
    }
    for (record, row) in records.iter().zip(&rows) {
        for field in [
            "round",
            "participants",
            "successes",
            "accuracy",
            "loss",
            "train_loss",
            "uplink_bits",
            "downlink_bits",
            "bits_per_parameter",
            "anme",
            "learning_rate",
            "seconds",
        ] {
            let cell = &row[field];
            match record[field].as_f64() {
                Some(value) => {
                    let parsed = cell.parse::<f64>().unwrap();
                    assert!(
                        (parsed - value).abs() <= 1e-15 * value.abs(),
                        "{field}: csv {cell}, jsonl {value}"
                    );
                }
                None => assert_eq!(cell, "", "{field} is null in the JSON"),
            }
        }
        let failures: u64 = record["failures"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(row["failures_total"], failures.to_string());
        let groups = record["groups"].as_array().unwrap().len();
        assert_eq!(row["groups"], groups.to_string());
        let seconds = record["client_train_seconds"].as_array().unwrap();
        assert_eq!(row["client_train_seconds_count"], seconds.len().to_string());
        assert_eq!(row["model_updated"], record["model_updated"].to_string());
    }
}

/// Every plot exists as SVG and PNG; the SVG is one well-formed `<svg>` element holding the title
/// and a line with a point per round; the PNG decodes to the figure's size and shows the first
/// series' colour.
#[test]
fn run_folder_has_svg_and_png_plots() {
    let f = fixture();
    let plots = f.first.join("plots");
    for stem in PLOTS {
        let svg = std::fs::read_to_string(plots.join(format!("{stem}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{stem}.svg"
        );
        assert_balanced(&svg, stem);
        // The first series is drawn in the palette's first colour (the axes are black).
        let lines: Vec<&str> = svg
            .lines()
            .filter(|l| l.contains("<polyline") && l.contains("stroke=\"#1F77B4\""))
            .collect();
        assert!(!lines.is_empty(), "{stem}.svg draws no series");
        let points = lines[0].split("points=\"").nth(1).unwrap();
        let points = points.split('"').next().unwrap().split_whitespace().count();
        assert!(
            points == 3,
            "{stem}.svg: the first line has {points} points, not 3"
        );

        let bytes = std::fs::read(plots.join(format!("{stem}.png"))).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{stem}.png magic");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert_eq!((info.width, info.height), (800, 480), "{stem}.png size");
        let blue = pixels.chunks(3).filter(|p| p[..] == [31, 119, 180]).count();
        assert!(
            blue > 50,
            "{stem}.png: {blue} pixels of the first series' colour"
        );
    }
    let accuracy = std::fs::read_to_string(plots.join("accuracy.svg")).unwrap();
    assert!(accuracy.contains("Test accuracy per round"));
    let loss = std::fs::read_to_string(plots.join("loss.svg")).unwrap();
    assert!(loss.contains("test loss") && loss.contains("training loss"));
}

/// Every opening tag is closed in order (self-closing ones aside): enough to catch a truncated
/// or interleaved file without an XML parser.
fn assert_balanced(svg: &str, what: &str) {
    let mut open: Vec<&str> = Vec::new();
    for tag in svg.split('<').skip(1) {
        let tag = tag.split('>').next().unwrap();
        if tag.starts_with('?') || tag.starts_with('!') || tag.ends_with('/') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                open.pop(),
                Some(name.trim()),
                "{what}: unbalanced </{name}>"
            );
        } else {
            open.push(tag.split_whitespace().next().unwrap());
        }
    }
    assert!(open.is_empty(), "{what}: unclosed {open:?}");
}

/// Two run folders give one page: both names, a table row each with the final accuracy, one
/// inline SVG per metric and nothing fetched from elsewhere.
#[test]
fn report_overlays_two_runs_in_one_self_contained_page() {
    let f = fixture();
    let out = f.root.join("report");
    let stdout = common::stdout_of(&[
        "report",
        f.first.to_str().unwrap(),
        f.second.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let page_path = out.join("report.html");
    assert_eq!(stdout.trim(), page_path.display().to_string());
    let page = std::fs::read_to_string(&page_path).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    for name in ["seed-1", "seed-2"] {
        // In the table, and as a legend entry of every figure.
        assert!(page.matches(name).count() >= 9, "{name} is missing");
    }
    assert_eq!(page.matches("<svg").count(), 8, "one figure per metric");
    for external in ["src=", "href=\"http", "<script", "<link", "<img", "url("] {
        assert!(!page.contains(external), "the page refers to {external}…");
    }
    for dir in [&f.first, &f.second] {
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        let accuracy = format!("{:.4}", summary["final_accuracy"].as_f64().unwrap());
        assert!(page.contains(&accuracy), "final accuracy {accuracy}");
    }
}

/// A folder that is not a run folder, a missing one and a corrupt metrics line are one-line
/// errors naming the path and what was expected.
#[test]
fn report_refuses_what_is_not_a_run_folder() {
    let f = fixture();
    let empty = f.root.join("not-a-run");
    std::fs::create_dir_all(&empty).unwrap();
    let error = common::error_of(&["report", empty.to_str().unwrap()]);
    assert!(
        error.contains(&empty.display().to_string()) && error.contains("metrics.jsonl"),
        "{error}"
    );
    let missing = f.root.join("no-such-folder");
    let error = common::error_of(&["report", missing.to_str().unwrap()]);
    assert!(error.contains("no-such-folder"), "{error}");

    let corrupt = f.root.join("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    let good = std::fs::read_to_string(f.first.join("metrics.jsonl")).unwrap();
    let first_line = good.lines().next().unwrap();
    std::fs::write(
        corrupt.join("metrics.jsonl"),
        format!("{first_line}\n{{\"round\": 2\n"),
    )
    .unwrap();
    let error = common::error_of(&["report", corrupt.to_str().unwrap()]);
    assert!(error.contains("metrics.jsonl line 2"), "{error}");
}

/// With stderr piped, each round gets a plain line (every round by default on 3 rounds, every
/// second and the last with `--progress-every 2`), and the first says where /metrics is served.
#[test]
fn without_a_terminal_progress_is_a_line_per_round() {
    let f = fixture();
    let first = String::from_utf8_lossy(&f.first_output.stderr);
    for round in 1..=3 {
        assert!(
            first
                .lines()
                .any(|l| l.starts_with(&format!("round {round}/3 ")) && l.contains("acc ")),
            "no line for round {round}: {first}"
        );
    }
    assert!(
        first.contains("metrics on http://127.0.0.1:") && first.contains("/metrics\n"),
        "{first}"
    );
    assert!(first.contains("\n3 rounds, final accuracy "), "{first}");
    let second = String::from_utf8_lossy(&f.second_output.stderr);
    let rounds: Vec<&str> = second
        .lines()
        .filter(|l| l.starts_with("round "))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(rounds, ["2/3", "3/3"], "{second}");
    assert!(!second.contains("metrics on"), "{second}");
}

/// `compare --out` writes the table as markdown and CSV, every run, and an accuracy figure per
/// setup with a line per strategy and the no-sharding reference.
#[test]
fn compare_writes_tables_and_a_figure_per_setup() {
    let f = fixture();
    let out = f.root.join("compare");
    let config = f.root.join("report-test.toml");
    let stdout = common::stdout_of(&[
        "compare",
        config.to_str().unwrap(),
        "--strategies",
        "top-n",
        "--keep-ratios",
        "0.5",
        "--seeds",
        "1",
        "--rounds",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    let markdown = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert_eq!(markdown, stdout, "table.md is the printed table");
    let table = std::fs::read_to_string(out.join("table.csv")).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[1].starts_with("top-n,0.5,") && lines[2].starts_with("no sharding,full,"));
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert_eq!(runs.lines().count(), 3, "{runs}");
    let svg = std::fs::read_to_string(out.join("accuracy-0.5.svg")).unwrap();
    assert_balanced(&svg, "accuracy-0.5.svg");
    assert!(svg.contains("top-n") && svg.contains("no sharding") && svg.contains("r = 0.5"));
    let png = std::fs::read(out.join("accuracy-0.5.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

/// A resumed run rewrites `metrics.csv` from the checkpoint's history, then appends to it: one
/// header and one row per round, in order, as in `metrics.jsonl`.
#[test]
fn a_resumed_run_keeps_one_csv_row_per_round() {
    let f = fixture();
    let dir = f.root.join("resumed");
    let config = f.root.join("report-test.toml");
    let dir_arg = dir.to_str().unwrap();
    let flags = ["--quiet", "--metrics-addr", "off"];
    let mut first = vec![
        "run",
        config.to_str().unwrap(),
        "--out",
        dir_arg,
        "--rounds",
        "2",
    ];
    first.extend(flags);
    common::stdout_of(&first);
    let mut resumed = vec!["run", "--resume", dir_arg, "--rounds", "4"];
    resumed.extend(flags);
    common::stdout_of(&resumed);
    let (_, rows) = csv(&dir);
    let rounds: Vec<&str> = rows.iter().map(|r| r["round"].as_str()).collect();
    assert_eq!(rounds, ["1", "2", "3", "4"]);
    assert_eq!(jsonl(&dir).len(), 4);
}

/// `fedshard eval` scores a run folder's saved model exactly as the run's last round did, the
/// SVD round trip (`--keep-top 1`) to within f32 rounding, and a rank-1 cut of the sharded
/// layer as a different model; bad input is a one-line error.
#[test]
fn eval_scores_the_saved_model_and_its_spectral_truncations() {
    let f = fixture();
    let dir = f.first.to_str().unwrap();
    let stdout = common::stdout_of(&["eval", dir, "--keep-top", "1,0.1", "--json"]);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{report}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(f.first.join("summary.json")).unwrap())
            .unwrap();
    let number = |row: &Value, key: &str| row[key].as_f64().unwrap();
    assert!(rows[0]["keep_top"].is_null());
    assert_eq!(rows[0]["accuracy"], summary["final_accuracy"]);
    assert_eq!(rows[0]["loss"], summary["final_loss"]);
    assert_eq!(number(&rows[1], "keep_top"), 1.0);
    assert!((number(&rows[1], "loss") - number(&rows[0], "loss")).abs() < 1e-4);
    assert!((number(&rows[1], "accuracy") - number(&rows[0], "accuracy")).abs() <= 0.01);
    assert_eq!(number(&rows[2], "keep_top"), 0.1);
    assert!((number(&rows[2], "loss") - number(&rows[0], "loss")).abs() > 1e-3);

    let table = common::stdout_of(&["eval", dir]);
    assert!(
        table.starts_with("| model | test accuracy % | test loss |"),
        "{table}"
    );
    assert!(table.contains("| whole | "), "{table}");

    let m = common::error_of(&["eval", f.root.to_str().unwrap()]);
    assert!(m.contains("not a run folder"), "{m}");
    for bad in ["mixed", "1.5"] {
        let m = common::error_of(&["eval", dir, "--keep-top", bad]);
        assert!(m.contains("--keep-top"), "{m}");
    }
}

/// A client's error is said on stderr with its reason, once per round that lost clients (the
/// metrics only count failures by kind).
#[test]
fn failed_clients_are_reported_with_their_reason() {
    let f = fixture();
    let config = f.root.join("faulty.toml");
    let faults = "\n[faults]\nrate = 1.0\nkinds = [\"error\"]\ndelay_ms = 0\n";
    std::fs::write(&config, format!("{CONFIG}{faults}")).unwrap();
    let dir = f.root.join("faulty");
    let out = common::fedshard(&[
        "run",
        config.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--rounds",
        "2",
        "--quiet",
        "--metrics-addr",
        "off",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("clients failed"))
        .collect();
    assert_eq!(warnings.len(), 2, "one line per round: {stderr}");
    for line in warnings {
        assert!(
            line.contains("4 of 4 clients failed: client ")
                && line.contains(" error: injected error"),
            "{line}"
        );
    }
}
