//! The shared secret (ractor_cluster's "cookie") that every node of a federation must hold.
//!
//! It is required and has no default: a default secret would let anyone who read this source
//! join a federation. It comes from a file (`--secret-file`) or from the `FEDSHARD_SECRET`
//! environment variable, never from the command line, where other users can read it in the
//! process list. It authenticates nodes (a challenge–response handshake); it does not encrypt
//! anything: use TLS for that ([`crate::tls`]).

use std::fmt;
use std::path::Path;

/// The environment variable read when no secret file is given.
pub const ENV_VAR: &str = "FEDSHARD_SECRET";

/// Below this many bytes a secret is accepted but warned about.
const SHORT: usize = 16;

/// A node's secret. Its `Debug` form never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// The secret from `file` if given, else from `$FEDSHARD_SECRET`; surrounding whitespace
    /// (a trailing newline) is not part of it.
    pub fn load(file: Option<&Path>) -> Result<Self, String> {
        match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("secret file {}: {e}", path.display()))?;
                warn_if_readable_by_others(path);
                Self::new(&text).map_err(|e| format!("secret file {}: {e}", path.display()))
            }
            None => match std::env::var(ENV_VAR) {
                Ok(text) => Self::new(&text).map_err(|e| format!("${ENV_VAR}: {e}")),
                Err(_) => Err(format!(
                    "a shared secret is required: give --secret-file FILE or set {ENV_VAR} \
                     (there is no default; every node of the federation needs the same one)"
                )),
            },
        }
    }

    /// A secret from its text (trimmed); empty text is an error.
    pub fn new(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the secret is empty".into());
        }
        if text.len() < SHORT {
            tracing::warn!(
                "the shared secret is only {} bytes; use at least {SHORT} random ones \
                 (e.g. `openssl rand -hex 32`)",
                text.len()
            );
        }
        Ok(Self(text.to_string()))
    }

    /// The cookie to hand ractor_cluster.
    pub(crate) fn cookie(&self) -> String {
        self.0.clone()
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            "secret file {} is readable by other users; `chmod 600` it",
            path.display()
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_trimmed_never_empty_and_never_printed() {
        let s = Secret::new("  hunter2-hunter2-hunter2\n").unwrap();
        assert_eq!(s.cookie(), "hunter2-hunter2-hunter2");
        assert_eq!(format!("{s:?}"), "Secret(…)");
        assert!(Secret::new(" \n").is_err());
        let dir = tempfile::tempdir().unwrap();
        let missing = Secret::load(Some(&dir.path().join("none"))).unwrap_err();
        assert!(missing.contains("none"), "{missing}");
        std::fs::write(dir.path().join("s"), "abc\n").unwrap();
        assert_eq!(
            Secret::load(Some(&dir.path().join("s"))).unwrap().cookie(),
            "abc"
        );
    }
}
