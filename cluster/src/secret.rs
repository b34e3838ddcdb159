//! The shared secret (ractor_cluster's "cookie") that every node of a federation must hold.
//!
//! It is required and has no default: a default secret would let anyone who read this source
//! join a federation. It comes from a file (`--secret-file`) or from the `FEDSHARD_SECRET`
//! environment variable, never from the command line, where other users can read it in the
//! process list. It authenticates nodes (a challenge–response handshake); it does not encrypt
//! anything: use TLS for that ([`crate::tls`]).

use crate::error::Error;
use std::fmt;
use std::path::Path;

/// The environment variable read when no secret file is given.
pub const ENV_VAR: &str = "FEDSHARD_SECRET";

/// Fewer bytes than this are refused: a short secret can be guessed by anyone who can reach
/// the listener.
pub(crate) const SHORT: usize = 16;

/// The command that makes a good secret file, quoted in the refusals.
pub(crate) const MAKE_ONE: &str =
    "openssl rand -hex 32 > fedshard.secret && chmod 600 fedshard.secret";

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
    pub fn load(file: Option<&Path>) -> Result<Self, Error> {
        let in_file = |path: &Path, reason: String| Error::SecretFile {
            path: path.to_path_buf(),
            reason,
        };
        match file {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|e| in_file(path, e.to_string()))?;
                refuse_if_readable_by_others(path)?;
                Self::new(&text).map_err(|e| in_file(path, e.to_string()))
            }
            None => match std::env::var(ENV_VAR) {
                Ok(text) => Self::new(&text).map_err(|e| Error::SecretVariable(Box::new(e))),
                Err(_) => Err(Error::NoSecret),
            },
        }
    }

    /// A secret from its text (trimmed); empty or shorter than 16 bytes is an error.
    pub fn new(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::EmptySecret);
        }
        if text.len() < SHORT {
            return Err(Error::ShortSecret(text.len()));
        }
        Ok(Self(text.to_string()))
    }

    /// The cookie to hand ractor_cluster.
    pub(crate) fn cookie(&self) -> String {
        self.0.clone()
    }
}

/// A secret other users can read is no secret: refused, with the command that fixes it.
#[cfg(unix)]
fn refuse_if_readable_by_others(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| Error::SecretFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(Error::SecretExposed {
            path: path.to_path_buf(),
            mode: mode & 0o777,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn refuse_if_readable_by_others(_: &Path) -> Result<(), Error> {
    Ok(())
}

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
        let missing = Secret::load(Some(&dir.path().join("none")))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("none"), "{missing}");
        let file = dir.path().join("s");
        std::fs::write(&file, "abcdefghijklmnop\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let readable = Secret::load(Some(&file)).unwrap_err().to_string();
            assert!(readable.contains("chmod 600"), "{readable}");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert_eq!(
            Secret::load(Some(&file)).unwrap().cookie(),
            "abcdefghijklmnop"
        );
        let short = Secret::new("hunter2").unwrap_err();
        assert_eq!(short, Error::ShortSecret(7));
        let short = short.to_string();
        assert!(
            short.contains("7 bytes") && short.contains("openssl rand"),
            "{short}"
        );
    }
}
