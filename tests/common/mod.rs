//! Shared by the integration tests: running the `fedshard` binary as a user does (a success
//! gives its stdout, a failure must be exit code 2 with one `error: …` line on stderr), and the
//! determinism check of a federation. Each test crate uses only some of it.
#![allow(dead_code)]

pub mod process;

use std::process::{Command, Output};

pub fn fedshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fedshard"))
        .args(args)
        .output()
        .expect("spawn fedshard")
}

/// Runs a command that must succeed and returns its stdout.
pub fn stdout_of(args: &[&str]) -> String {
    let out = fedshard(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs a command that must fail with exit code 2 and one line on stderr; returns that line.
pub fn error_of(args: &[&str]) -> String {
    let out = fedshard(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} should exit with 2; stdout {}, stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "nothing on stdout on failure");
    let stderr = String::from_utf8(out.stderr).expect("utf-8 stderr");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one-line error for {args:?}: {stderr:?}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

/// The same config gives the same final model bytes, and the next seed different ones.
pub fn assert_reproducible(config: &fedshard::config::Config) {
    let run = |config: &fedshard::config::Config| {
        fedshard::federation::run_to_end(config)
            .expect("run completes")
            .0
            .to_bytes()
    };
    let first = run(config);
    assert!(first == run(config), "same seed, different model");
    let mut other = config.clone();
    other.run.seed += 1;
    assert!(first != run(&other), "another seed gave the same model");
}

/// Runs `config` in process with its run folder in `dir`, continuing from the checkpoint there
/// if there is one: whether it resumed, the final model and the summary.
pub fn run_in(
    dir: &std::path::Path,
    config: &fedshard::config::Config,
) -> (
    bool,
    fedshard_protocol::model::ModelState,
    fedshard_actors::record::Summary,
) {
    let (mut fed, trainers) = fedshard::federation::in_process(config).expect("federation");
    fed.run_dir = Some(dir.to_path_buf());
    let resumed = fed.resume_from_checkpoint().expect("resume");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (model, summary) = runtime
        .block_on(fedshard_actors::server::run(fed, trainers))
        .expect("run");
    (resumed, model, summary)
}
