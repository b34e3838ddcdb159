//! Checkpoints: written after every round atomically (write to a temporary file, fsync, rename,
//! fsync the folder), so a crash at any instant leaves either the previous or the new checkpoint,
//! never a torn one.

use crate::coordinator::Registry;
use crate::record::RoundRecord;
use crate::run_folder::CHECKPOINT_FILE;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::stored::{FileError, Format};
use fedshard_protocol::uplink::state::UplinkState;
use fedshard_strategies::server_optimizer::OptimizerState;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bumped whenever the layout changes; older checkpoints are refused with a clear error.
/// Version 4: each history record carries `update_cosine`; version 5: `late` and `staleness`;
/// version 6: `klms`; version 7: per-client KLMS blocks in the uplink state; version 8: `time`
/// (simulated time); version 9: `privacy` (ε and the clip norms of a private run); version 10:
/// `secure` (a secure round's session); version 11: the file is a [`Format`] (magic, version,
/// length, CRC-32) around the bincode of [`Checkpoint`], so a damaged one is refused; version
/// 12: the server optimizer's moments, and each history record's `byzantine` count; version 13:
/// SCAFFOLD's server variate.
pub const FORMAT_VERSION: u32 = 13;

/// The checkpoint file's header.
pub const FORMAT: Format = Format {
    what: "a fedshard checkpoint",
    magic: *b"FSCHKPT\0",
    version: FORMAT_VERSION,
};

/// Everything needed to continue a run exactly: every random stream is derived from
/// (seed, round, client, purpose), so the seed and the round are the whole RNG state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub seed: u64,
    pub rounds_completed: u64,
    pub model: ModelState,
    pub registry: Registry,
    pub history: Vec<RoundRecord>,
    /// The compressor's memory (version 3 on).
    pub uplink: UplinkState,
    /// The server optimizer's moments (version 12 on).
    pub optimizer: OptimizerState,
    /// SCAFFOLD's server variate (version 13 on; empty without SCAFFOLD).
    pub control: ModelState,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The checkpoint file cannot be read back (not a regular file, another version, damaged).
    #[error(transparent)]
    File(#[from] FileError),
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
    write_atomically(&dir.join(CHECKPOINT_FILE), &FORMAT.encode(&bytes))
}

/// Loads the checkpoint of a run folder, `None` if the run has none yet. The file is read only
/// if it is a regular one, only as far as its header says, and decoded only once its checksum
/// matches.
pub fn load(dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    let path = dir.join(CHECKPOINT_FILE);
    let bytes = match FORMAT.read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let malformed = |reason: String| FileError::malformed(&path, FORMAT.what, reason);
    let (checkpoint, used): (Checkpoint, usize) =
        fedshard_protocol::bounded::decode_from_slice(&bytes)
            .map_err(|e| malformed(e.to_string()))?;
    if used != bytes.len() {
        return Err(malformed(format!("{} trailing bytes", bytes.len() - used)).into());
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
            optimizer: OptimizerState {
                first: vec![vec![0.5, -1.0]],
                second: vec![vec![0.25, 1.0]],
            },
            control: ModelState::default(),
        };
        save(dir.path(), &cp).unwrap();
        assert_eq!(load(dir.path()).unwrap().unwrap(), cp);
        let path = dir.path().join(CHECKPOINT_FILE);
        fs::write(&path, b"garbage").unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("checkpoint.bin"), "{err}");
        // An older build's checkpoint names its version, whatever follows it.
        let older = Format {
            version: 10,
            ..FORMAT
        };
        fs::write(&path, older.encode(b"records of another layout")).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "format version 10, this build reads {FORMAT_VERSION}"
            )),
            "{err}"
        );
        // The damage: 8 bytes over the header, one flipped byte in the middle.
        save(dir.path(), &cp).unwrap();
        let good = fs::read(&path).unwrap();
        let mut over_header = good.clone();
        over_header[16..24].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        let mut flipped = good.clone();
        flipped[good.len() / 2] ^= 0x01;
        for bad in [over_header, flipped] {
            fs::write(&path, bad).unwrap();
            let err = load(dir.path()).unwrap_err().to_string();
            assert!(
                err.contains("checkpoint.bin: not a fedshard checkpoint"),
                "{err}"
            );
        }
    }
}
