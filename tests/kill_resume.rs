//! A run killed with SIGKILL mid-run and resumed ends with the same model bytes as a run that
//! was never interrupted (real subprocesses of the `fedshard` binary), server optimizer state
//! included.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fedshard");

/// The run takes FedAdam steps on the server, so its moments must survive the kill too.
fn config_file(dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string("config/digits-linear.toml")
        .unwrap()
        .replace("rounds = 30", "rounds = 400")
        + "\n[server_optimizer]\nkind = \"adam\"\nlr = 0.01\n";
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn killed_and_resumed_run_matches_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let config = config_file(tmp.path());
    let whole = tmp.path().join("whole");
    let status = Command::new(BIN)
        .args(["run", "--quiet", "--metrics-addr", "off", "--out"])
        .arg(&whole)
        .arg(&config)
        .status()
        .unwrap();
    assert!(status.success());

    let killed = tmp.path().join("killed");
    let mut child = Command::new(BIN)
        .args(["run", "--quiet", "--metrics-addr", "off", "--out"])
        .arg(&killed)
        .arg(&config)
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
