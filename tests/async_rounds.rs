//! Rounds that do not wait for the slowest client: over-commitment's cut-off, buffered
//! asynchronous aggregation (determinism under the injector's clock, staleness, resume) and the
//! config errors of both.

mod common;

use common::run_in;
use fedshard::config::Config;
use fedshard::federation;
use fedshard_actors::faults::Stragglers;
use fedshard_actors::record::Summary;
use fedshard_protocol::model::ModelState;
use std::path::Path;

/// Six ridge clients (closed-form local fits, so the test costs the schedule, not training);
/// half of them 20× slower under a simulated 10 ms training time, so the injector's virtual
/// clock orders every answer.
const RIDGE: &str = r#"
[run]
name = "test-stragglers"
seed = 5
rounds = 4

[data]
dataset = "synthetic-linear"
clients = 6
dim = 8
test_samples = 200

[model]
kind = "ridge"

[federation]
clients_per_round = 3
over_commit = 2.0
deadline_ms = 20000

[faults.stragglers]
kind = "share"
share = 0.5
factor = 20.0
base_delay_ms = 10
"#;

/// The sharded softmax digits in async mode: 10 clients, 4 training at once, an aggregate every
/// 2 updates, polynomial staleness; lognormal stragglers on a 5 ms simulated training time fix
/// the arrival order.
const DIGITS_ASYNC: &str = r#"
[run]
name = "test-async"
seed = 3
rounds = 6

[data]
dataset = "digits"
clients = 10
alpha = 1.0
min_samples = 20

[model]
kind = "softmax"
sharded_layers = ["fc0.weight"]

[training]
learning_rate = 0.1
epochs = 1

[federation]
clients_per_round = 4
strategy = "unbiased"
keep_ratios = [{ ratio = 1.0, share = 0.5 }, { ratio = 0.4, share = 0.5 }]
deadline_ms = 20000
mode = "async"
concurrency = 4
buffer = 2
staleness = { kind = "polynomial", a = 0.5 }

[faults.stragglers]
kind = "lognormal"
sigma = 1.0
base_delay_ms = 5
"#;

fn config(text: &str) -> Config {
    Config::parse(text, Path::new("test.toml")).expect("valid test config")
}

fn run(config: &Config) -> (ModelState, Summary) {
    federation::run_to_end(config).expect("run completes")
}

fn error(text: &str) -> String {
    format!(
        "{:#}",
        Config::parse(text, Path::new("bad.toml")).expect_err("invalid config")
    )
}

/// Every round of `summary` asked `asked` clients, kept the first `kept` updates, counted the
/// rest late, and had no failure or rejection.
fn assert_cut_off(summary: &Summary, asked: usize, kept: usize) {
    for r in &summary.per_round {
        assert_eq!(
            (r.participants, r.successes, r.late),
            (asked, kept, asked - kept),
            "round {}",
            r.round
        );
        assert_eq!(
            r.failures_total() + r.rejected_total(),
            0,
            "round {}",
            r.round
        );
    }
}

/// Every client is asked (⌈2 · 3⌉ = 6) and the round closes at the first 3 accepted updates:
/// exactly the three clients at full speed, every round; the slow three are late, never failed.
#[test]
fn over_commit_closes_each_round_at_the_first_k_updates_and_counts_the_rest_late() {
    let c = config(RIDGE);
    let factors = c
        .faults
        .as_ref()
        .and_then(|f| f.stragglers.as_ref())
        .map(|s| s.factors(c.run.seed, 6))
        .expect("stragglers");
    let fast: Vec<u64> = (0..6).filter(|&i| factors[i as usize] == 1.0).collect();
    assert_eq!(fast.len(), 3);
    let (model, summary) = run(&c);
    assert_eq!(summary.rounds_completed, 4);
    assert_cut_off(&summary, 6, 3);
    for r in &summary.per_round {
        let answered: Vec<u64> = r.client_uplink_bits.keys().copied().collect();
        assert_eq!(answered, fast, "round {}", r.round);
        assert!(r.model_updated);
    }
    // The cut-off is the seed's, not the scheduler's: a second run is bit-identical.
    let (again, _) = run(&c);
    assert_eq!(model.to_bytes(), again.to_bytes());
    // Without over-commitment the round waits for everyone.
    let mut all = c.clone();
    all.federation.schedule = fedshard::config::Schedule::Sync { over_commit: None };
    all.federation.clients_per_round = 6.0;
    all.run.rounds = 1;
    let (_, summary) = run(&all);
    let r = &summary.per_round[0];
    assert_eq!((r.participants, r.successes, r.late), (6, 6, 0));
}

#[test]
fn async_runs_are_deterministic_under_the_injectors_clock_and_learn() {
    let c = config(DIGITS_ASYNC);
    let (model, summary) = run(&c);
    assert_eq!(summary.rounds_completed, 6);
    for r in &summary.per_round {
        assert_eq!(r.successes, 2, "version {}", r.round);
        assert_eq!(r.staleness.len(), 2);
        assert!(r.model_updated);
    }
    // Four clients in flight and an aggregate every two updates: some updates are stale.
    let stale: Vec<u64> = summary
        .per_round
        .iter()
        .flat_map(|r| r.staleness.clone())
        .collect();
    assert!(stale.iter().any(|&t| t > 0), "{stale:?}");
    // The first version's updates were all trained from version 0.
    assert_eq!(summary.per_round[0].staleness, vec![0, 0]);
    // Each version says where its time went (`bench job`, metrics.csv): handing out work,
    // waiting for answers, the fold and the evaluation.
    for r in &summary.per_round {
        let p = &r.phases;
        assert!(
            p.plan > 0.0 && p.train > 0.0 && p.aggregate > 0.0 && p.evaluate > 0.0,
            "version {}: {p:?}",
            r.round
        );
    }
    let first = summary.per_round[0].accuracy;
    assert!(
        summary.final_accuracy > 0.2 && summary.final_accuracy >= first - 0.05,
        "{first} -> {}",
        summary.final_accuracy
    );
    let (again, summary2) = run(&c);
    assert_eq!(model.to_bytes(), again.to_bytes(), "same seed, same model");
    let taus = |s: &Summary| -> Vec<Vec<u64>> {
        s.per_round.iter().map(|r| r.staleness.clone()).collect()
    };
    assert_eq!(taus(&summary), taus(&summary2));
    let mut other = c.clone();
    other.run.seed = 4;
    assert_ne!(run(&other).0.to_bytes(), model.to_bytes());
}

/// [`DIGITS_ASYNC`] dense (sign steps suit a dense layer's weights, not unit singular vectors)
/// with `compressor` and its `[compression]` table: 6 clients training at once, an aggregate
/// every 4 updates, 40 versions.
fn compressed(compressor: &str, compression: &str) -> Config {
    let mut text = DIGITS_ASYNC.to_string();
    for (from, to) in [
        ("sharded_layers = [\"fc0.weight\"]", "sharded_layers = []"),
        ("strategy = \"unbiased\"\n", ""),
        (
            "keep_ratios = [{ ratio = 1.0, share = 0.5 }, { ratio = 0.4, share = 0.5 }]\n",
            "",
        ),
        ("concurrency = 4", "concurrency = 6"),
        ("buffer = 2", "buffer = 4"),
        ("rounds = 6", "rounds = 40"),
        (
            "clients_per_round = 4",
            &format!("clients_per_round = 4\ncompressor = \"{compressor}\""),
        ),
    ] {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    config(&(text + compression))
}

/// SignSGD-KLMS with blocks cut per client, and QSGD-KLMS with its prior of last buffer's
/// symbols: the shipped digits settings, at a smaller block target.
const SIGNSGD_KLMS: &str = "\n[compression]\nblock_scope = \"client\"\nd_target = 4\n\
    margin_bits = 4\nselection = \"ordered\"\ntemperature = \"rms\"\ntemperature_scale = 2.0\n\
    server_lr = 0.32\nrescale_drift = true\n";
const QSGD_KLMS: &str = "\n[compression]\nblock_scope = \"client\"\nd_target = 4\n\
    margin_bits = 4\nselection = \"ordered\"\nprior_weight = 100.0\n";

/// KLMS in async mode. Each task carries the side information of the version it was handed out
/// from (its block ends, QSGD's prior), kept with it until it answers, so an update is decoded
/// against what its client coded with however many versions were applied meanwhile, while the
/// server's state moves on with every buffer. Stale updates then fold like uncompressed ones:
/// each KLMS run learns about as well as its host sending every symbol, with a fraction of the
/// bits (measured: SignSGD-KLMS 0.62 against SignSGD's 0.72 at 0.18 of its bits, QSGD-KLMS 0.64
/// against 0.70 at 0.12; 160 updates), and is bit-identical under the seed.
#[test]
fn klms_in_async_mode_codes_each_update_with_its_own_versions_side_information() {
    for (host, klms, compression) in [
        ("signsgd", "signsgd-klms", SIGNSGD_KLMS),
        ("qsgd", "qsgd-klms", QSGD_KLMS),
    ] {
        let (_, plain) = run(&compressed(host, compression));
        let c = compressed(klms, compression);
        let (model, coded) = run(&c);
        let bpp = |s: &Summary| s.mean_bits_per_parameter().expect("versions");
        eprintln!(
            "{klms} async: {:.3} at {:.4} bits per parameter; {host}: {:.3} at {:.4}",
            coded.final_accuracy,
            bpp(&coded),
            plain.final_accuracy,
            bpp(&plain)
        );
        assert_eq!(coded.rounds_completed, 40);
        assert_eq!(coded.rejected_total + coded.failures_total, 0, "{klms}");
        assert!(
            coded
                .per_round
                .iter()
                .flat_map(|r| &r.staleness)
                .any(|&t| t > 0),
            "{klms}: some updates are stale"
        );
        assert!(
            coded.per_round.iter().all(|r| r.klms.is_some()),
            "{klms}: every version records its coders"
        );
        assert!(bpp(&coded) < 0.25 * bpp(&plain), "{klms}");
        assert!(
            coded.final_accuracy > 0.5 && coded.final_accuracy > plain.final_accuracy - 0.15,
            "{klms}: {} against {host}'s {}",
            coded.final_accuracy,
            plain.final_accuracy
        );
        let (again, _) = run(&c);
        assert_eq!(model.to_bytes(), again.to_bytes(), "{klms}: same seed");
    }
}

/// Over-commitment with KLMS: each round asks 6, keeps the first 4 updates and drops the late
/// 2, whose block uploads the server never sees (those clients cut again when next asked: a
/// slow client that is always late uploads its blocks every time). The run learns and is
/// bit-identical under the injector's clock.
#[test]
fn over_committed_klms_rounds_keep_the_first_updates_and_learn() {
    let mut c = compressed("signsgd-klms", SIGNSGD_KLMS);
    c.federation.schedule = fedshard::config::Schedule::Sync {
        over_commit: Some(1.5),
    };
    c.validate().expect("valid over-committed config");
    let (model, summary) = run(&c);
    assert_cut_off(&summary, 6, 4);
    // Every kept update was KLMS-coded against the blocks its task carried.
    assert!(summary.per_round.iter().all(|r| r.klms.is_some()));
    assert!(summary.final_accuracy > 0.5, "{}", summary.final_accuracy);
    let (again, _) = run(&c);
    assert_eq!(
        model.to_bytes(),
        again.to_bytes(),
        "same seed, same cut-offs"
    );
}

/// An async QSGD-KLMS run checkpoints the server's side information with each version (the
/// clients' own block ends and last buffer's symbol counts), and a resumed run hands out its
/// fresh work with it: every resumed update decodes and is accepted.
#[test]
fn an_async_klms_run_resumes_with_its_side_information() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = compressed("qsgd-klms", QSGD_KLMS);
    c.run.rounds = 5;
    assert!(!run_in(dir.path(), &c).0);
    let checkpoint = fedshard_actors::checkpoint::load(dir.path())
        .expect("readable")
        .expect("a checkpoint");
    assert_eq!(checkpoint.rounds_completed, 5);
    assert!(!checkpoint.uplink.client_ends.is_empty(), "client blocks");
    assert_eq!(checkpoint.uplink.counts.len(), 650, "a count per value");
    c.run.rounds = 10;
    let (was_resumed, _, resumed) = run_in(dir.path(), &c);
    assert!(was_resumed);
    assert_eq!(resumed.rounds_completed, 10);
    assert_eq!(resumed.rejected_total + resumed.failures_total, 0);
    // Clients that kept their blocks through the checkpoint do not cut them again: without
    // them each client in the resumed versions would upload new ends (11 uploads in the first
    // five versions, none in the resumed five, measured).
    let distinct: std::collections::BTreeSet<u64> = resumed.per_round[5..]
        .iter()
        .flat_map(|r| r.client_uplink_bits.keys().copied())
        .collect();
    let uploads: usize = resumed.per_round[5..]
        .iter()
        .filter_map(|r| Some(r.klms.as_ref()?.block_uploads))
        .sum();
    assert!(
        distinct.len() >= 6 && uploads <= 2,
        "{uploads} re-cuts among {} resumed clients",
        distinct.len()
    );
}

/// An async run stopped after 3 versions and resumed to 5 continues from version 3 (the model
/// and history of its checkpoint), re-issuing the work that was outstanding.
#[test]
fn an_async_run_resumes_from_its_last_applied_version() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = config(DIGITS_ASYNC);
    c.run.rounds = 3;
    let (resumed, _, first) = run_in(dir.path(), &c);
    assert!(!resumed);
    assert_eq!(first.rounds_completed, 3);
    c.run.rounds = 5;
    let (resumed, _, second) = run_in(dir.path(), &c);
    assert!(resumed);
    assert_eq!(second.rounds_completed, 5);
    assert_eq!(second.per_round.len(), 5);
    assert_eq!(second.per_round[..3], first.per_round[..]);
    // The resumed versions start from fresh work: nothing in the buffer is older than the
    // checkpoint's version.
    assert!(second.per_round[3].staleness.iter().all(|&t| t == 0));
    let lines = std::fs::read_to_string(dir.path().join("metrics.jsonl")).expect("metrics");
    assert_eq!(lines.lines().count(), 5);
}

/// `fedshard run` says what an async run counts: model versions, not rounds.
#[test]
fn the_cli_counts_versions_in_async_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("async.toml");
    std::fs::write(&path, DIGITS_ASYNC.replace("rounds = 6", "rounds = 2")).expect("config");
    let out = common::fedshard(&[
        "run",
        path.to_str().expect("utf-8 path"),
        "--out",
        dir.path().join("run").to_str().expect("utf-8 path"),
        "--metrics-addr",
        "off",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in [
        "version 1/2 [",
        "version 2/2 [",
        "2 versions, final accuracy ",
    ] {
        assert!(
            stderr.lines().any(|l| l.starts_with(line)),
            "{line}: {stderr}"
        );
    }
}

#[test]
fn schedule_settings_are_validated_with_the_field_named() {
    let sync_with_async_fields = RIDGE.replace("over_commit = 2.0", "buffer = 2");
    let e = error(&sync_with_async_fields);
    assert!(
        e.contains("federation.buffer") && e.contains("async"),
        "{e}"
    );
    let e = error(&RIDGE.replace("over_commit = 2.0", "over_commit = 0.5"));
    assert!(
        e.contains("federation.over_commit") && e.contains("at least 1"),
        "{e}"
    );
    let e = error(&DIGITS_ASYNC.replace("concurrency = 4\n", ""));
    assert!(
        e.contains("federation.concurrency") && e.contains("none"),
        "{e}"
    );
    let e = error(&DIGITS_ASYNC.replace("concurrency = 4", "concurrency = 11"));
    assert!(
        e.contains("federation.concurrency") && e.contains("1..=10"),
        "{e}"
    );
    let e = error(&DIGITS_ASYNC.replace("buffer = 2", "buffer = 0"));
    assert!(e.contains("federation.buffer"), "{e}");
    let e = error(&DIGITS_ASYNC.replace(
        "clients_per_round = 4",
        "clients_per_round = 4\nselector = \"optimal-partial\"\naggregator = \"inverse-probability\"",
    ));
    assert!(
        e.contains("federation.selector") && e.contains("uniform"),
        "{e}"
    );
    let e = error(&DIGITS_ASYNC.replace("mode = \"async\"", "mode = \"async\"\nover_commit = 1.5"));
    assert!(e.contains("federation.over_commit"), "{e}");
    let e = error(&DIGITS_ASYNC.replace("a = 0.5", "a = -1"));
    assert!(e.contains("federation.staleness.a"), "{e}");
    let e = error(&DIGITS_ASYNC.replace("sigma = 1.0", "sigma = -1.0"));
    assert!(e.contains("faults.stragglers.sigma"), "{e}");
    // SGLD needs the `uniform` aggregator and async mode `fedavg`: the error names the real
    // conflict, the mode.
    for aggregator in ["fedavg", "uniform"] {
        let e = error(&DIGITS_ASYNC.replace(
            "clients_per_round = 4",
            &format!("clients_per_round = 4\ncompressor = \"sgld\"\naggregator = \"{aggregator}\""),
        ));
        assert!(
            e.contains("federation.mode") && e.contains("Langevin"),
            "{e}"
        );
    }
    // The lognormal table parses into its own variant.
    let c = config(DIGITS_ASYNC);
    assert!(matches!(
        c.faults.and_then(|f| f.stragglers),
        Some(Stragglers::Lognormal { .. })
    ));
}

/// The ridge clients of [`RIDGE`] under simulated time with a 100 ms deadline: the fast three
/// take 10 ms, the slow three 20 × 10 ms, so every slow client selected times out in simulated
/// time, and is given up on at the deadline without its real answer being waited for.
#[test]
fn a_simulated_deadline_times_out_exactly_the_slow_clients() {
    let text = RIDGE
        .replace(
            "over_commit = 2.0\ndeadline_ms = 20000",
            "deadline_ms = 100",
        )
        .replace("rounds = 4", "rounds = 4\nclock = \"virtual\"")
        + "\n[devices]\nsamples_per_second = 1e12\n";
    let config = config(&text);
    let (model, summary) = run(&config);
    let mut timeouts = 0;
    for r in &summary.per_round {
        let time = r.time.as_ref().expect("simulated time in every record");
        let slow = time.clients.values().filter(|t| t.compute > 0.1).count();
        for t in time.clients.values() {
            let fast = (t.compute - 0.01).abs() < 1e-9;
            assert!(fast || (t.compute - 0.2).abs() < 1e-9, "{t:?}");
        }
        let timed_out = r.failures.values().sum::<usize>();
        assert_eq!(timed_out, slow, "round {}: {:?}", r.round, r.failures);
        assert_eq!(r.successes + timed_out, r.participants);
        let expected_end = time.start + if slow > 0 { 0.1 } else { 0.01 };
        assert!(
            (time.end - expected_end).abs() < 1e-9,
            "round {}: {time:?}",
            r.round
        );
        timeouts += timed_out;
    }
    assert!(timeouts > 0, "no slow client was ever selected");
    assert_eq!(run(&config).0.to_bytes(), model.to_bytes());
}

/// Spins `threads` threads until dropped: a loaded machine.
struct Busy(
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    Vec<std::thread::JoinHandle<()>>,
);

impl Busy {
    fn start(threads: usize) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handles = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self(stop, handles)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        for handle in self.1.drain(..) {
            let _ = handle.join();
        }
    }
}

/// `fedshard bench job … --json`'s model digest, from the command given.
fn digest_of(command: &mut std::process::Command) -> String {
    let output = command.output().expect("fedshard runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    report["model_digest"]
        .as_str()
        .expect("a digest")
        .to_string()
}

/// Under simulated time a seed fixes the model of every schedule whatever the machine does:
/// each straggler config (synchronous, over-committed, async; 30% of the clients 5× slower)
/// gives the same model on two cores at rest and on one core (taskset) beside two busy loops.
/// On the wall clock the async and over-commit configs give a different model from run to run.
#[test]
fn simulated_time_fixes_the_model_of_each_schedule_whatever_the_load_and_cores() {
    let bin = env!("CARGO_BIN_EXE_fedshard");
    for name in [
        "digits-cnn-sync",
        "digits-cnn-over-commit",
        "digits-cnn-async",
    ] {
        let config = format!(
            "{}/config/stragglers/{name}.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        let args = [
            "bench", "job", &config, "--clock", "virtual", "--rounds", "6", "--json",
        ];
        let at_rest = digest_of(std::process::Command::new(bin).args(args));
        let busy = Busy::start(2);
        let loaded = digest_of(
            std::process::Command::new("taskset")
                .args(["-c", "0", bin])
                .args(args),
        );
        drop(busy);
        assert_eq!(at_rest, loaded, "{name}");
    }
}
