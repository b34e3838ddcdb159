//! Shared by the integration tests: running the `fedshard` binary as a user does (a success
//! gives its stdout, a failure must be exit code 2 with one `error: …` line on stderr), and the
//! determinism check of a federation. Each test crate uses only some of it.
#![allow(dead_code)]

pub mod browser;
pub mod process;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output};
use std::time::Duration;

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
    let resumed = dir
        .join(fedshard_actors::run_folder::CHECKPOINT_FILE)
        .exists();
    if resumed {
        fed.resume_from_checkpoint().expect("resume");
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (model, summary) = runtime
        .block_on(fedshard_actors::server::run(fed, trainers))
        .expect("run");
    (resumed, model, summary)
}

/// A port free on 127.0.0.1 now, for a server the test starts.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET path` from an HTTP server on 127.0.0.1:`port`, when it answers 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    stream.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// Writes a file only its owner can read, as a secret file must be.
pub fn write_private(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}
