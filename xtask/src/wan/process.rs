//! The processes of a run and the scratch folder they share: each process is killed and the
//! folder removed when the run ends, however it ends, so a failed run leaves nothing behind.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A child process, killed if still running when dropped; its stderr goes to `log`.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `command` as `name`, its stdout discarded and its stderr in `dir/NAME.log`.
    pub fn spawn(name: &str, command: Command, dir: &Path) -> Result<Self, String> {
        Self::spawn_to(name, command, dir, Stdio::null())
    }

    /// [`Proc::spawn`] with its stdout going to `stdout`.
    pub fn spawn_to(
        name: &str,
        mut command: Command,
        dir: &Path,
        stdout: impl Into<Stdio>,
    ) -> Result<Self, String> {
        let log = dir.join(format!("{name}.log"));
        let file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Self {
            name: name.into(),
            child,
            log,
        })
    }

    /// What it wrote to its stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its log, for an error message.
    fn tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a run's processes stand, from [`progress`].
pub enum Progress {
    Running,
    /// Every process exited with success.
    Done,
    /// One exited with a failure: its name and status, and the end of its log.
    Failed {
        name: String,
        tail: String,
    },
}

impl Progress {
    /// The error of a failed process.
    pub fn failure(name: &str, tail: &str) -> String {
        format!("{name} failed; the end of its log:\n{tail}")
    }
}

/// Waits on nothing: whether `processes` all ended well, one failed, or they still run.
pub fn progress(processes: &mut [Proc]) -> Result<Progress, String> {
    let mut running = false;
    for p in processes.iter_mut() {
        match p.child.try_wait().map_err(|e| format!("{}: {e}", p.name))? {
            Some(status) if !status.success() => {
                return Ok(Progress::Failed {
                    name: format!("{} ({status})", p.name),
                    tail: p.tail(),
                });
            }
            Some(_) => {}
            None => running = true,
        }
    }
    Ok(if running {
        Progress::Running
    } else {
        Progress::Done
    })
}

/// A folder of this process's own, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    /// An empty folder: one left by an earlier process of the same id (killed before it could
    /// remove it) is removed first.
    pub fn new() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("fedshard-wan-{}", std::process::id()));
        let error = |e: std::io::Error| format!("{}: {e}", dir.display());
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(error(e)),
            _ => {}
        }
        fs::create_dir_all(&dir).map_err(error)?;
        Ok(Self(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A fresh random secret in `secret`, a file only its owner can read from its creation on
    /// (mode 0600 when it is made, not changed after the secret is in it).
    pub fn secret_file(&self) -> Result<PathBuf, String> {
        let path = self.0.join("secret");
        let error = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(error)?;
        file.write_all((random_secret()? + "\n").as_bytes())
            .map_err(error)?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// 32 random bytes in hex, as `openssl rand -hex 32` makes a federation's secret.
pub fn random_secret() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The secret is never readable by others, not even between its creation and a chmod: the
    /// file is made with mode 0600 (under a umask that would otherwise leave it 0644).
    #[test]
    fn the_secret_file_is_created_owner_only_with_a_64_digit_secret() {
        let scratch = Scratch::new().unwrap();
        let path = scratch.secret_file().unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        let secret = fs::read_to_string(&path).unwrap();
        assert_eq!(secret.trim_end().len(), 64, "{secret}");
        assert!(secret.trim_end().bytes().all(|b| b.is_ascii_hexdigit()));
        // A second secret in the same folder is refused rather than written over the first.
        assert!(scratch.secret_file().is_err());
        let dir = scratch.path().to_path_buf();
        drop(scratch);
        assert!(!dir.exists());
    }
}
