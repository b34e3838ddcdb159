//! The shared secret (ractor_cluster's "cookie") that every node of a federation must hold.
//!
//! It is required and has no default: a default secret would let anyone who read this source
//! join a federation. It comes from a file (`--secret-file`) or from the `FEDSHARD_SECRET`
//! environment variable, never from the command line, where other users can read it in the
//! process list. It authenticates nodes (a challenge–response handshake); it does not encrypt
//! anything: use TLS for that ([`crate::tls`]).

use crate::error::Error;
use fedshard_protocol::stored::{Problem, read_regular};
use std::fmt;
use std::path::Path;

/// The environment variable read when no secret file is given.
pub const ENV_VAR: &str = "FEDSHARD_SECRET";

/// Fewer bytes than this are refused: a short secret can be guessed by anyone who can reach
/// the listener.
pub(crate) const SHORT: usize = 16;

/// Bits of entropy a secret must show at least, by [`entropy_bits`]: 32 times the same letter
/// is 32 bytes and no secret.
pub(crate) const MIN_BITS: f64 = 128.0;

/// The largest secret file read: a secret is tens of bytes, and a path such as `/dev/zero`
/// must not be read until memory runs out.
pub(crate) const MAX_FILE: u64 = 4096;

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
                let text = read_small_file(path)?;
                Self::new(&text).map_err(|e| in_file(path, e.to_string()))
            }
            None => match std::env::var(ENV_VAR) {
                Ok(text) => Self::new(&text).map_err(|e| Error::SecretVariable(Box::new(e))),
                Err(_) => Err(Error::NoSecret),
            },
        }
    }

    /// A secret from its text (trimmed); empty, shorter than 16 bytes or with less than 128
    /// bits of entropy (length times the Shannon entropy of its bytes) is an error.
    pub fn new(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::EmptySecret);
        }
        if text.len() < SHORT {
            return Err(Error::ShortSecret(text.len()));
        }
        let bits = entropy_bits(text);
        if bits < MIN_BITS {
            return Err(Error::WeakSecret {
                bits: bits.floor() as u32,
                length: text.len(),
            });
        }
        Ok(Self(text.to_string()))
    }

    /// The cookie to hand ractor_cluster.
    pub(crate) fn cookie(&self) -> String {
        self.0.clone()
    }
}

/// An estimate of the entropy of `text` in bits: its length times the Shannon entropy of its
/// bytes' frequencies. It underrates a short random string a little (64 hex digits score about
/// 240) and gives a repeated pattern what it deserves (`a` × 32: 0; `hunter2-` × 4: 96).
pub(crate) fn entropy_bits(text: &str) -> f64 {
    let mut counts = [0usize; 256];
    for &byte in text.as_bytes() {
        counts[usize::from(byte)] += 1;
    }
    let n = text.len() as f64;
    let per_byte: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum();
    per_byte * n
}

/// The text of the secret file `path`: a regular file of at most [`MAX_FILE`] bytes
/// ([`read_regular`]), that other users cannot read.
fn read_small_file(path: &Path) -> Result<String, Error> {
    let in_file = |reason: String| Error::SecretFile {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = read_regular(path, MAX_FILE, "a file holding the secret").map_err(|e| {
        in_file(match e.problem {
            Problem::TooLarge { size, .. } => format!(
                "{size} bytes or more, and a secret file holds at most {MAX_FILE}; make one: \
                 `{MAKE_ONE}`"
            ),
            problem => problem.to_string(),
        })
    })?;
    let meta = std::fs::metadata(path).map_err(|e| in_file(e.to_string()))?;
    refuse_if_readable_by_others(path, &meta)?;
    String::from_utf8(bytes)
        .map_err(|_| in_file("not UTF-8 text; expected the secret as text".into()))
}

/// A secret other users can read is no secret: refused, with the command that fixes it.
#[cfg(unix)]
fn refuse_if_readable_by_others(path: &Path, meta: &std::fs::Metadata) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
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
fn refuse_if_readable_by_others(_: &Path, _: &std::fs::Metadata) -> Result<(), Error> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `openssl rand -hex 32` makes.
    const GOOD: &str = "2d1e2381f9d3c1d56fccc3b0b2da32b4c659fca9468823bac64879f1e5b69e50";

    #[test]
    fn a_long_secret_without_entropy_is_refused_and_told_how_to_make_one() {
        for weak in ["a".repeat(32), "hunter2-".repeat(4), "ab".repeat(40)] {
            let error = Secret::new(&weak).unwrap_err();
            assert!(
                matches!(error, Error::WeakSecret { .. }),
                "{weak}: {error:?}"
            );
            let text = error.to_string();
            assert!(
                text.contains("128 bits") && text.contains("openssl rand -hex 32"),
                "{text}"
            );
        }
        assert!(entropy_bits(GOOD) > 200.0);
        assert_eq!(entropy_bits(&"a".repeat(32)), 0.0);
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_file_is_a_small_regular_file_checked_before_it_is_read() {
        use std::os::unix::fs::PermissionsExt;
        // /dev/zero never ends: refused from its metadata, not read.
        let error = Secret::load(Some(Path::new("/dev/zero")))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("/dev/zero") && error.contains("not a regular file"),
            "{error}"
        );
        // A folder (a FIFO is refused the same way, before it could block the read).
        let dir = tempfile::tempdir().unwrap();
        let error = Secret::load(Some(dir.path())).unwrap_err().to_string();
        assert!(error.contains("not a regular file"), "{error}");
        let big = dir.path().join("big");
        std::fs::write(&big, "x".repeat(1 << 20)).unwrap();
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = Secret::load(Some(&big)).unwrap_err().to_string();
        assert!(
            error.contains("big") && error.contains("at most 4096"),
            "{error}"
        );
    }

    #[test]
    fn a_secret_is_trimmed_never_empty_and_never_printed() {
        let s = Secret::new(&format!("  {GOOD}\n")).unwrap();
        assert_eq!(s.cookie(), GOOD);
        assert_eq!(format!("{s:?}"), "Secret(…)");
        assert!(Secret::new(" \n").is_err());
        let dir = tempfile::tempdir().unwrap();
        let missing = Secret::load(Some(&dir.path().join("none")))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("none"), "{missing}");
        let file = dir.path().join("s");
        std::fs::write(&file, format!("{GOOD}\n")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let readable = Secret::load(Some(&file)).unwrap_err().to_string();
            assert!(readable.contains("chmod 600"), "{readable}");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert_eq!(Secret::load(Some(&file)).unwrap().cookie(), GOOD);
        let short = Secret::new("hunter2").unwrap_err();
        assert_eq!(short, Error::ShortSecret(7));
        let short = short.to_string();
        assert!(
            short.contains("7 bytes") && short.contains("openssl rand"),
            "{short}"
        );
    }
}
