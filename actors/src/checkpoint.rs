//! Checkpoints: written after every round atomically (write to a temporary file, fsync, rename,
//! fsync the folder), so a crash at any instant leaves either the previous or the new checkpoint,
//! never a torn one.

use crate::coordinator::Registry;
use crate::record::RoundRecord;
use crate::run_folder::CHECKPOINT_FILE;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::uplink::state::UplinkState;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bumped whenever the layout changes; older checkpoints are refused with a clear error.
/// Version 4: each history record carries `update_cosine`; version 5: `late` and `staleness`;
/// version 6: `klms`; version 7: per-client KLMS blocks in the uplink state; version 8: `time`
/// (simulated time); version 9: `privacy` (ε and the clip norms of a private run); version 10:
/// `secure` (a secure round's session).
pub const FORMAT_VERSION: u32 = 10;

/// Everything needed to continue a run exactly: every random stream is derived from
/// (seed, round, client, purpose), so the seed and the round are the whole RNG state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    pub seed: u64,
    pub rounds_completed: u64,
    pub model: ModelState,
    pub registry: Registry,
    pub history: Vec<RoundRecord>,
    /// The compressor's memory (version 3 on).
    pub uplink: UplinkState,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a fedshard checkpoint ({reason})")]
    Malformed { path: PathBuf, reason: String },
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

pub fn save(dir: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let bytes = bincode::serde::encode_to_vec(checkpoint, bincode::config::standard())
        .unwrap_or_else(|e| unreachable!("in-memory bincode encoding failed: {e}"));
    write_atomically(&dir.join(CHECKPOINT_FILE), &bytes)
}

/// Loads the checkpoint of a run folder, `None` if the run has none yet.
pub fn load(dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    let path = dir.join(CHECKPOINT_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CheckpointError::Io { path, source }),
    };
    let malformed = |reason: String| CheckpointError::Malformed {
        path: path.clone(),
        reason,
    };
    // The version comes first and is read alone: another version's records have other fields,
    // and decoding them as this version's would fail with a less useful message, or not at all.
    let (version, _): (u32, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
            .map_err(|e| malformed(e.to_string()))?;
    if version != FORMAT_VERSION {
        return Err(malformed(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        )));
    }
    let (checkpoint, used): (Checkpoint, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
            .map_err(|e| malformed(e.to_string()))?;
    if used != bytes.len() {
        return Err(malformed(format!("{} trailing bytes", bytes.len() - used)));
    }
    Ok(Some(checkpoint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_strategies::selection::SelectorName;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_none());
        let cp = Checkpoint {
            version: FORMAT_VERSION,
            seed: 5,
            rounds_completed: 3,
            model: ModelState::default(),
            registry: Registry {
                clients: Default::default(),
                selector: SelectorName::Uniform,
                budget: 1.0,
                max_clusters: None,
            },
            history: vec![],
            uplink: Default::default(),
        };
        save(dir.path(), &cp).unwrap();
        assert_eq!(load(dir.path()).unwrap().unwrap(), cp);
        fs::write(dir.path().join(CHECKPOINT_FILE), b"garbage").unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("checkpoint.bin"), "{err}");
        // An older build's checkpoint names its version, whatever follows it.
        let mut older = bincode::serde::encode_to_vec(9u32, bincode::config::standard()).unwrap();
        older.extend_from_slice(b"records of another layout");
        fs::write(dir.path().join(CHECKPOINT_FILE), older).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("format version 9, this build reads 10"),
            "{err}"
        );
    }
}
