//! A child process of a test: killed when the test ends, whatever happened, with its stderr in
//! a file that a failing assertion prints.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Every wait on a process; far above what a test needs, so a slow CI machine only slows it.
pub const PATIENCE: Duration = Duration::from_secs(120);

pub struct Proc {
    pub child: Child,
    log: PathBuf,
    name: String,
}

impl Proc {
    /// Starts `command` with stdout discarded and stderr in `DIR/NAME.log`.
    pub fn spawn(mut command: Command, dir: &Path, name: &str) -> Self {
        let log = dir.join(format!("{name}.log"));
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            log,
            name: name.into(),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many times `text` is in the log so far.
    pub fn count(&self, text: &str) -> usize {
        self.log().matches(text).count()
    }

    /// Waits for the exit, failing with the process's log after [`PATIENCE`].
    pub fn wait(&mut self) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "{} did not exit in {PATIENCE:?}; its log:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn expect_success(&mut self) {
        let status = self.wait();
        assert!(
            status.success(),
            "{} exited with {status}; its log:\n{}",
            self.name,
            self.log()
        );
    }

    /// Sends `signal` (`STOP`, `CONT`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.name);
    }

    pub fn sigkill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `done` until it holds, failing after [`PATIENCE`].
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
