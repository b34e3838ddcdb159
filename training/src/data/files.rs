//! Reading dataset files from disk: one error type that always names the file, transparent
//! gzip, and where downloaded datasets are cached.
//!
//! [`DataError`] describes in-memory data and stays `Clone + PartialEq`; a file loader also has
//! to report I/O failures and which file was at fault, so it gets [`FileError`] instead.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use thiserror::Error;

use super::DataError;

/// Why a dataset file (or directory of files) could not be loaded. Every variant names the
/// file, and where it helps, the record, the field and the expected form. The underlying cause
/// is part of the message rather than a `source()` chain, so `{}` shows it and anyhow's `{:#}`
/// does not show it twice.
#[derive(Debug, Error)]
pub enum FileError {
    /// The operating system refused to read the file.
    #[error("cannot read {}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// A file the loader needs is not in the directory it was pointed at.
    #[error("{} has no {}: expected {expected}", dir.display(), names.join(" or "))]
    Missing {
        dir: PathBuf,
        names: Vec<String>,
        expected: String,
    },
    /// A fixed-record file whose length is not a whole number of records.
    #[error(
        "{}: {len} bytes is not a multiple of the {record}-byte {format} record; the file is truncated or not in that format",
        path.display()
    )]
    RecordLength {
        path: PathBuf,
        len: usize,
        record: usize,
        format: &'static str,
    },
    /// A label byte outside its class range.
    #[error(
        "{}: record {record}: {field} {value} is not below {classes}",
        path.display()
    )]
    LabelOutOfRange {
        path: PathBuf,
        record: usize,
        field: &'static str,
        value: u32,
        classes: usize,
    },
    /// A header's magic number is not the one of the expected format.
    #[error(
        "{}: magic number {found:#010x}, expected {expected:#010x} ({format})",
        path.display()
    )]
    Magic {
        path: PathBuf,
        found: u32,
        expected: u32,
        format: &'static str,
    },
    /// The file is shorter (truncated) or longer than its header says.
    #[error("{}: {found} bytes, but {expected} were expected ({what})", path.display())]
    Length {
        path: PathBuf,
        found: usize,
        expected: usize,
        what: String,
    },
    /// Images and labels that should pair up do not have the same count.
    #[error(
        "{} holds {images} images but {} holds {labels} labels",
        images_path.display(),
        labels_path.display()
    )]
    CountMismatch {
        images_path: PathBuf,
        images: usize,
        labels_path: PathBuf,
        labels: usize,
    },
    /// The decoded data broke a [`Dataset`](super::Dataset) invariant.
    #[error("{}: {cause}", path.display())]
    Data { path: PathBuf, cause: DataError },
    /// A text file (JSON, …) that does not have the expected form; `cause` says where it breaks.
    #[error("{}: expected {expected}: {cause}", path.display())]
    Format {
        path: PathBuf,
        expected: &'static str,
        cause: String,
    },
    /// A named part of a file (an NPZ array, a CSV column) that the loader needs is absent;
    /// `found` lists what the file does hold.
    #[error(
        "{}: no {what} `{name}` ({expected}); the file holds {}",
        path.display(),
        if found.is_empty() { "none".to_owned() } else { found.join(", ") }
    )]
    MissingPart {
        path: PathBuf,
        what: &'static str,
        name: String,
        expected: &'static str,
        found: Vec<String>,
    },
    /// A part of a file is there but has the wrong type or shape: an array's dtype or
    /// dimensions, a cell that is not a number, an image of another size.
    #[error("{}: {part}: expected {expected}, found {found}", path.display())]
    Shape {
        path: PathBuf,
        part: String,
        expected: String,
        found: String,
    },
    /// A label that is not a class index: negative, not an integer, or not below `classes`;
    /// `row` counts the file's data rows from 0 (NumPy's index; a CSV's header not counted).
    #[error("{}: row {row} (from 0): label {value} is not {expected}", path.display())]
    Label {
        path: PathBuf,
        row: usize,
        value: String,
        expected: String,
    },
    /// `classes` was given but one class index has no row in the training data.
    #[error(
        "{}: class {class} has no rows, but classes = {classes} says every label in 0..{classes} occurs; lower `classes` or add rows of class {class}",
        path.display()
    )]
    EmptyClass {
        path: PathBuf,
        class: usize,
        classes: usize,
    },
    /// The client ids of a natural split do not name the configured number of clients.
    #[error(
        "{}: the client ids name {found} clients, but data.clients = {expected}",
        path.display()
    )]
    ClientCount {
        path: PathBuf,
        found: usize,
        expected: usize,
    },
    /// An image that the PNG or JPEG decoder refused.
    #[error("{}: not a readable {format} image: {cause}", path.display())]
    Image {
        path: PathBuf,
        format: &'static str,
        cause: String,
    },
    /// The data's rows do not fit the configured model's input layer or output classes.
    #[error(
        "{}: the data has {dim} features per row and {classes} classes, but the model expects {expected}",
        path.display()
    )]
    ModelShape {
        path: PathBuf,
        dim: usize,
        classes: usize,
        expected: String,
    },
}

/// The whole file, gunzipped when it starts with the gzip magic bytes `1f 8b`. Detecting the
/// content rather than the `.gz` suffix accepts renamed files; no raw format read here starts
/// with those bytes (IDX files start with `00 00`, a CIFAR record's first byte is a label < 100).
pub fn read_maybe_gzip(path: &Path) -> Result<Vec<u8>, FileError> {
    let io = |cause| FileError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let raw = std::fs::read(path).map_err(io)?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut inflated = Vec::with_capacity(raw.len().saturating_mul(4));
    MultiGzDecoder::new(raw.as_slice())
        .read_to_end(&mut inflated)
        .map_err(io)?;
    Ok(inflated)
}

/// The first of `candidates` (file names) that exists in `dir`, or a [`FileError::Missing`]
/// naming `dir`, every name that was tried and `expected`, what the directory should hold.
pub fn find_one_of(
    dir: &Path,
    candidates: &[String],
    expected: &str,
) -> Result<PathBuf, FileError> {
    candidates
        .iter()
        .map(|name| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| FileError::Missing {
            dir: dir.to_path_buf(),
            names: candidates.to_vec(),
            expected: expected.to_owned(),
        })
}

/// Where downloaded datasets live unless a command is given `--cache`: `$FEDSHARD_CACHE`, else
/// `$XDG_CACHE_HOME/fedshard`, else `~/.cache/fedshard`. Outside the repository on purpose, so
/// nothing downloaded can be committed. `None` when none of those variables is set.
pub fn default_cache_root() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    var("FEDSHARD_CACHE")
        .map(PathBuf::from)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("fedshard")))
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache").join("fedshard")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;

    #[test]
    fn gzip_is_detected_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, [0u8, 0, 8, 3, 42]).unwrap();
        let packed = dir.path().join("packed.bin");
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&[0u8, 0, 8, 3, 42]).unwrap();
        std::fs::write(&packed, gz.finish().unwrap()).unwrap();
        assert_eq!(read_maybe_gzip(&plain).unwrap(), vec![0, 0, 8, 3, 42]);
        assert_eq!(read_maybe_gzip(&packed).unwrap(), vec![0, 0, 8, 3, 42]);
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.bin");
        let e = read_maybe_gzip(&absent).unwrap_err();
        assert!(e.to_string().contains("absent.bin"), "{e}");
        let e = find_one_of(dir.path(), &["a.bin".into(), "a.bin.gz".into()], "A").unwrap_err();
        assert!(
            e.to_string()
                .contains("has no a.bin or a.bin.gz: expected A"),
            "{e}"
        );
    }
}
