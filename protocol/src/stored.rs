//! Files fedshard writes and later reads back itself (a run's checkpoint and final model), and
//! the one way to read a file whose size must stay bounded (those, a cluster's secret file).
//!
//! A file on disk can be cut short, have a byte flipped, or be replaced by a link to a device;
//! none of that may become a model. Every such file is a [`Format`]'s header followed by its
//! payload, 24 bytes little-endian:
//!
//! | bytes  | field                                                         |
//! |--------|---------------------------------------------------------------|
//! | 0..8   | magic: names the kind of file (`FSCHKPT\0`, `FSMODEL\0`)      |
//! | 8..12  | format version (u32)                                          |
//! | 12..20 | payload length in bytes (u64)                                 |
//! | 20..24 | CRC-32 (IEEE) of bytes 8..20 and of the payload (u32)         |
//!
//! The version is checked before the checksum, so a file of another build is named as such
//! rather than as damaged; the length must match the file's size before anything is allocated,
//! so a read is bounded by what the header says and the header by what the disk holds.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Bytes before the payload.
pub const HEADER_LEN: usize = 24;

/// Why a stored file cannot be read back, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", .path.display())]
pub struct FileError {
    pub path: PathBuf,
    pub problem: Problem,
}

/// What is wrong with a file, without its name (a caller that names it its own way, as the
/// secret file's errors do, takes this part).
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A FIFO would block the read forever, a device such as `/dev/zero` never end it; `kind`
    /// says which it is (`a folder`, `a FIFO`, `a device`, `a socket`).
    #[error("{kind}, not a regular file; expected {what}")]
    NotRegular {
        kind: &'static str,
        what: &'static str,
    },
    #[error("{size} bytes or more, expected {what} of at most {max} bytes")]
    TooLarge {
        size: u64,
        max: u64,
        what: &'static str,
    },
    /// The bytes are not what `what` looks like: another kind of file, another build's format,
    /// a file cut short or damaged.
    #[error("not {what} ({reason})")]
    Malformed { what: &'static str, reason: String },
}

impl FileError {
    pub fn new(path: &Path, problem: impl Into<Problem>) -> Self {
        Self {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }

    /// `path` is not `what`, for `reason`.
    pub fn malformed(path: &Path, what: &'static str, reason: String) -> Self {
        Self::new(path, Problem::Malformed { what, reason })
    }

    /// Whether the file does not exist at all (a run that has no checkpoint yet).
    pub fn is_not_found(&self) -> bool {
        matches!(&self.problem, Problem::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The metadata of `path` if it is a regular file (links followed), checked before it is opened:
/// opening a FIFO blocks until a writer comes.
fn regular(path: &Path, what: &'static str) -> Result<Metadata, FileError> {
    let meta = std::fs::metadata(path).map_err(|e| FileError::new(path, e))?;
    if !meta.is_file() {
        let kind = file_kind(meta.file_type());
        return Err(FileError::new(path, Problem::NotRegular { kind, what }));
    }
    Ok(meta)
}

/// What a path that is not a regular file is, for its error.
fn file_kind(file_type: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_dir() {
        "a folder"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

/// The bytes of `path`, `what` (a secret file, …) of at most `max` bytes: a regular file, whose
/// size is checked before it is read and whose read stops after `max + 1` bytes whatever the
/// size said (a file that grew in between).
pub fn read_regular(path: &Path, max: u64, what: &'static str) -> Result<Vec<u8>, FileError> {
    let too_large = |size| FileError::new(path, Problem::TooLarge { size, max, what });
    let meta = regular(path, what)?;
    if meta.len() > max {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| FileError::new(path, e))?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// One kind of stored file: its magic, the version this build writes and reads, and what it is
/// called in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    /// In errors: "not {what}", e.g. "a fedshard checkpoint".
    pub what: &'static str,
    pub magic: [u8; 8],
    pub version: u32,
}

impl Format {
    /// The header, then `payload`.
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        let crc = checksum(&out[8..20], payload);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// The payload of the file at `path`, after its header has been checked: magic, version,
    /// a length equal to what follows in the file, then the checksum. Only the header and the
    /// length it states are read.
    pub fn read(&self, path: &Path) -> Result<Vec<u8>, FileError> {
        let malformed = |reason: String| FileError::malformed(path, self.what, reason);
        let io = |e| FileError::new(path, e);
        let size = regular(path, self.what)?.len();
        if size < HEADER_LEN as u64 {
            return Err(malformed(format!(
                "{size} bytes, shorter than the {HEADER_LEN}-byte header"
            )));
        }
        let mut file = File::open(path).map_err(io)?;
        let mut header = [0u8; HEADER_LEN];
        file.read_exact(&mut header).map_err(io)?;
        let length = self
            .check_header(&header, size - HEADER_LEN as u64)
            .map_err(malformed)?;
        let mut payload = Vec::with_capacity(length as usize);
        file.take(length).read_to_end(&mut payload).map_err(io)?;
        if payload.len() as u64 != length {
            return Err(malformed(format!(
                "the header says {length} bytes follow, {} could be read",
                payload.len()
            )));
        }
        let stored = u32::from_le_bytes([header[20], header[21], header[22], header[23]]);
        if checksum(&header[8..20], &payload) != stored {
            return Err(malformed(
                "its checksum does not match its bytes: the file is damaged".into(),
            ));
        }
        Ok(payload)
    }

    /// The payload length a header states, if its magic and version are this format's and the
    /// `following` bytes of the file are exactly that length.
    fn check_header(&self, header: &[u8; HEADER_LEN], following: u64) -> Result<u64, String> {
        if header[..8] != self.magic {
            return Err(format!(
                "it does not start with `{}`",
                String::from_utf8_lossy(&self.magic).trim_end_matches('\0')
            ));
        }
        let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        if version != self.version {
            return Err(format!(
                "format version {version}, this build reads {}",
                self.version
            ));
        }
        let mut length = [0u8; 8];
        length.copy_from_slice(&header[12..20]);
        let length = u64::from_le_bytes(length);
        if length != following {
            return Err(format!(
                "the header says {length} bytes follow it, the file has {following}"
            ));
        }
        Ok(length)
    }
}

/// CRC-32 of the header's version and length, then the payload.
fn checksum(header_fields: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(header_fields);
    hasher.update(payload);
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: Format = Format {
        what: "a test file",
        magic: *b"FSTEST\0\0",
        version: 3,
    };

    fn written(dir: &Path, bytes: &[u8]) -> PathBuf {
        let path = dir.join("file.bin");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn refusal(path: &Path) -> String {
        TEST.read(path).unwrap_err().to_string()
    }

    #[test]
    fn a_file_round_trips_and_any_damage_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let payload: Vec<u8> = (0..=255).collect();
        let good = TEST.encode(&payload);
        assert_eq!(TEST.read(&written(dir.path(), &good)).unwrap(), payload);

        // Every single flipped byte, header or payload, is caught.
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            let error = refusal(&written(dir.path(), &bad));
            assert!(
                error.contains("file.bin") && error.contains("not a test file"),
                "{at}: {error}"
            );
        }
        // The case: a huge length written over the header.
        let mut bad = good.clone();
        bad[16..24].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(refusal(&written(dir.path(), &bad)).contains("bytes follow"));
        let cut = refusal(&written(dir.path(), &good[..good.len() - 1]));
        assert!(cut.contains("the file has 255"), "{cut}");
        let short = refusal(&written(dir.path(), &good[..10]));
        assert!(short.contains("shorter than the 24-byte header"), "{short}");
        let mut other = good.clone();
        other[8] = 2;
        let older = refusal(&written(dir.path(), &other));
        assert!(
            older.contains("format version 2, this build reads 3"),
            "{older}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn only_regular_files_are_read_and_only_as_far_as_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for error in [
            refusal(&zero),
            read_regular(&zero, 10, "a test file")
                .unwrap_err()
                .to_string(),
            refusal(dir.path()),
        ] {
            assert!(error.contains("not a regular file"), "{error}");
        }
        let path = written(dir.path(), &[7; 11]);
        assert_eq!(read_regular(&path, 11, "a test file").unwrap(), vec![7; 11]);
        let error = read_regular(&path, 10, "a test file")
            .unwrap_err()
            .to_string();
        assert!(error.contains("at most 10 bytes"), "{error}");
        let missing = TEST.read(&dir.path().join("none")).unwrap_err();
        assert!(missing.is_not_found(), "{missing}");
    }
}
