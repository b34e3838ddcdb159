//! A run killed with SIGKILL mid-run and resumed ends with the same model bytes as a run that
//! was never interrupted (real subprocesses of the `fedshard` binary): with the server
//! optimizer's state, and under SCAFFOLD with the server's variate in the checkpoint and the
//! clients' variates in the run folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fedshard");

/// `config/digits-linear.toml` for 400 rounds with `edit` applied, written to `dir`.
fn config_file(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string("config/digits-linear.toml")
        .unwrap()
        .replace("rounds = 30", "rounds = 400");
    let path = dir.join("config.toml");
    std::fs::write(&path, edit(text)).unwrap();
    path
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Runs `config` whole, and again killed after a few rounds and resumed: same `model.bin`.
fn kill_and_resume(config: &Path) {
    let tmp = config.parent().unwrap();
    let whole = tmp.join("whole");
    let status = Command::new(BIN)
        .args(["run", "--quiet", "--metrics-addr", "off", "--out"])
        .arg(&whole)
        .arg(config)
        .status()
        .unwrap();
    assert!(status.success());

    let killed = tmp.join("killed");
    let mut child = Command::new(BIN)
        .args(["run", "--quiet", "--metrics-addr", "off", "--out"])
        .arg(&killed)
        .arg(config)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while lines(&killed.join("metrics.jsonl")) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "run made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !killed.join("model.bin").exists(),
        "the run finished before it was killed"
    );

    let status = Command::new(BIN)
        .args(["run", "--quiet", "--metrics-addr", "off", "--resume"])
        .arg(&killed)
        .status()
        .unwrap();
    assert!(status.success());
    let a = std::fs::read(whole.join("model.bin")).unwrap();
    let b = std::fs::read(killed.join("model.bin")).unwrap();
    assert_eq!(a, b, "resumed model differs from the uninterrupted one");
    assert_eq!(lines(&killed.join("metrics.jsonl")), 400);
}

/// The run takes FedAdam steps on the server, so its moments must survive the kill too.
#[test]
fn killed_and_resumed_run_matches_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config_file(tmp.path(), |t| {
        t + "\n[server_optimizer]\nkind = \"adam\"\nlr = 0.01\n"
    });
    kill_and_resume(&config);
}

/// Dense softmax clients under SCAFFOLD: the server's variate comes back from the checkpoint,
/// each client's from `variates/`, and the round replayed after the kill trains from the
/// variates from before it.
#[test]
fn a_killed_scaffold_run_resumes_to_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config_file(tmp.path(), |t| {
        let dense = t
            .replace("sharded_layers = [\"fc0.weight\"]", "")
            .replace("strategy = \"unbiased\"", "")
            .replace("sampler = \"conditional-poisson\"", "");
        let dense = dense
            .lines()
            .filter(|l| !l.starts_with("keep_ratios"))
            .collect::<Vec<_>>()
            .join("\n");
        dense.replace(
            "max_update_norm = 5.0",
            "max_update_norm = 5.0\nscaffold = true",
        )
    });
    kill_and_resume(&config);
    assert!(tmp.path().join("killed/variates/client-0.bin").exists());
}

#[test]
fn a_bad_config_fails_before_starting_with_exit_code_2() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.toml");
    std::fs::write(
        &path,
        std::fs::read_to_string("config/digits-linear.toml")
            .unwrap()
            .replace("rounds = 30", "rounds = 0"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["run", "--out"])
        .arg(tmp.path().join("r"))
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("run.rounds") && err.contains("bad.toml"),
        "{err}"
    );
    assert!(!tmp.path().join("r").join("checkpoint.bin").exists());
}
