//! SCAFFOLD's lasting client state (docs/algorithms.md §12): each client's control variate
//! `c_i`, kept by the host of its node and never by the server, and the server's variate `c`
//! moved by the changes the clients send.
//!
//! A host keeps, per client, the variate after each of its last two rounds of training, tagged
//! with the round. A task of round `r` is trained from the newest variate of a round before
//! `r`. That one rule serves an uninterrupted run and a resumed one alike: the server
//! checkpoints after every round, so a crash leaves a node at most one round ahead of the
//! server's checkpoint, and the replay of that round finds the variate from before it. With a
//! folder the host writes each client's two generations there (one file a client, written
//! atomically when it changes), so they outlive the node's process.

use crate::checkpoint::{CheckpointError, write_atomically};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::stored::{FileError, Format};
use fedshard_protocol::task::ClientId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A client's variate file's header.
pub const FORMAT: Format = Format {
    what: "a fedshard client control variate",
    magic: *b"FSCVAR\0\0",
    version: 1,
};

/// Why a host cannot keep or lend a client's variate.
#[derive(Debug, thiserror::Error)]
pub enum VariatesError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Write(#[from] CheckpointError),
    /// A task of a round that both kept generations follow: a replay further back than one
    /// round, which the server's checkpoint after every round never asks for.
    #[error(
        "client {client}: its control variate is kept from round {oldest} on, a task of round \
         {round} needs the one from before it"
    )]
    TooOld {
        client: ClientId,
        round: u64,
        oldest: u64,
    },
    /// The folder holds a file for a client whose generations are not two ascending rounds.
    #[error("{}: expected at most two generations in ascending rounds", .0.display())]
    Generations(PathBuf),
}

/// The control variates of a host's clients.
#[derive(Debug, Default)]
pub struct ClientVariates {
    /// Where each client's file lives; `None` keeps them in memory (a run without a folder).
    dir: Option<PathBuf>,
    /// Per client, at most two `(round, c_i after that round)`, ascending.
    kept: BTreeMap<ClientId, Vec<(u64, ModelState)>>,
}

impl ClientVariates {
    /// Variates kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Variates kept in `dir` (created if missing), with those already there for `clients`
    /// read back: a restarted node continues from them.
    pub fn open(
        dir: &Path,
        clients: impl IntoIterator<Item = ClientId>,
    ) -> Result<Self, VariatesError> {
        std::fs::create_dir_all(dir).map_err(|e| FileError::new(dir, e))?;
        let mut kept = BTreeMap::new();
        for client in clients {
            let path = file(dir, client);
            let bytes = match FORMAT.read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            let malformed = |reason: String| FileError::malformed(&path, FORMAT.what, reason);
            let (generations, used): (Vec<(u64, ModelState)>, usize) =
                fedshard_protocol::bounded::decode_from_slice(&bytes)
                    .map_err(|e| malformed(e.to_string()))?;
            if used != bytes.len() {
                return Err(malformed(format!("{} trailing bytes", bytes.len() - used)).into());
            }
            let ascending = generations.windows(2).all(|w| w[0].0 < w[1].0);
            if generations.len() > 2 || !ascending {
                return Err(VariatesError::Generations(path));
            }
            kept.insert(client, generations);
        }
        Ok(Self {
            dir: Some(dir.to_path_buf()),
            kept,
        })
    }

    /// Variates kept in `dir` for a run that starts at round 1: whatever an earlier start in
    /// the same folder left there (one killed before its first checkpoint, which `--resume`
    /// refuses to continue) is removed, so every client starts from zero.
    pub fn fresh(dir: &Path) -> Result<Self, VariatesError> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(FileError::new(dir, e).into());
            }
            _ => {}
        }
        Self::open(dir, [])
    }

    /// `c_i` for `client`'s task of round `round`: its newest variate of an earlier round,
    /// `None` (a zero variate) when it has trained under SCAFFOLD before no round.
    pub fn lend(&self, client: ClientId, round: u64) -> Result<Option<ModelState>, VariatesError> {
        let Some(generations) = self.kept.get(&client) else {
            return Ok(None);
        };
        match generations.iter().rev().find(|(r, _)| *r < round) {
            Some((_, variate)) => Ok(Some(variate.clone())),
            None => Err(VariatesError::TooOld {
                client,
                round,
                oldest: generations.first().map_or(0, |g| g.0),
            }),
        }
    }

    /// Keeps `variate` as `client`'s after round `round`: a generation of that round or later
    /// (from a replayed round) is replaced, the newest earlier one stays beside it.
    pub fn store(
        &mut self,
        client: ClientId,
        round: u64,
        variate: ModelState,
    ) -> Result<(), VariatesError> {
        let generations = self.kept.entry(client).or_default();
        generations.retain(|(r, _)| *r < round);
        let earlier = generations.pop();
        generations.clear();
        generations.extend(earlier);
        generations.push((round, variate));
        if let Some(dir) = &self.dir {
            let bytes = bincode::serde::encode_to_vec(&*generations, bincode::config::standard())
                .unwrap_or_else(|e| unreachable!("in-memory bincode encoding failed: {e}"));
            write_atomically(&file(dir, client), &FORMAT.encode(&bytes))?;
        }
        Ok(())
    }
}

/// `client`'s file in `dir`.
fn file(dir: &Path, client: ClientId) -> PathBuf {
    dir.join(format!("client-{client}.bin"))
}

/// `c_i + Δc_i`, `c_i` zero when `None` (Algorithm 1, line 12 as the change of line 13 adds
/// back).
pub fn updated(own: Option<&ModelState>, change: &ModelState) -> ModelState {
    let mut next = change.clone();
    if let Some(own) = own {
        for t in &mut next.tensors {
            if let Some(o) = own.get(&t.name) {
                for (v, o) in t.data.iter_mut().zip(&o.data) {
                    *v += o;
                }
            }
        }
    }
    next
}

/// The server's step of SCAFFOLD (Algorithm 1, line 17): `c ← c + (1/N) Σ_{i∈S} Δc_i` over the
/// accepted changes, `N` the registered clients. Every change has `c`'s tensors (the server
/// checked each against its task, whose tensors are the model's).
pub fn server_step(server: &mut ModelState, changes: &[&ModelState], population: usize) {
    let scale = 1.0 / population.max(1) as f64;
    for tensor in &mut server.tensors {
        let mut sum = vec![0.0f64; tensor.data.len()];
        for change in changes {
            if let Some(t) = change.get(&tensor.name) {
                for (s, v) in sum.iter_mut().zip(&t.data) {
                    *s += f64::from(*v);
                }
            }
        }
        for (c, s) in tensor.data.iter_mut().zip(sum) {
            *c = (f64::from(*c) + scale * s) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::model::NamedTensor;

    fn state(v: f32) -> ModelState {
        ModelState::new(vec![NamedTensor::new("w", vec![2], vec![v, -v]).unwrap()]).unwrap()
    }

    #[test]
    fn a_task_is_lent_the_variate_from_before_its_round_even_on_a_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = ClientVariates::open(dir.path(), [7]).unwrap();
        assert_eq!(v.lend(7, 1).unwrap(), None);
        v.store(7, 1, state(1.0)).unwrap();
        v.store(7, 3, state(3.0)).unwrap();
        assert_eq!(v.lend(7, 4).unwrap(), Some(state(3.0)));
        // A restarted node replays round 3: it trains from round 1's variate.
        let mut again = ClientVariates::open(dir.path(), [7, 8]).unwrap();
        assert_eq!(again.lend(7, 3).unwrap(), Some(state(1.0)));
        assert_eq!(again.lend(8, 3).unwrap(), None);
        again.store(7, 3, state(30.0)).unwrap();
        assert_eq!(again.lend(7, 4).unwrap(), Some(state(30.0)));
        assert_eq!(again.lend(7, 3).unwrap(), Some(state(1.0)));
        // Further back than the two generations is refused, naming the rounds.
        let err = again.lend(7, 1).unwrap_err().to_string();
        assert!(err.contains("from round 1 on, a task of round 1"), "{err}");
        // A run that starts over in the folder starts every client from zero.
        let restarted = ClientVariates::fresh(dir.path()).unwrap();
        assert_eq!(restarted.lend(7, 1).unwrap(), None);
        assert!(!dir.path().join("client-7.bin").exists());
        again.store(7, 3, state(30.0)).unwrap();
        std::fs::write(dir.path().join("client-7.bin"), b"garbage").unwrap();
        let err = ClientVariates::open(dir.path(), [7])
            .unwrap_err()
            .to_string();
        assert!(err.contains("client-7.bin"), "{err}");
    }

    #[test]
    fn the_server_variate_moves_by_the_mean_change_over_the_population() {
        let mut c = state(1.0);
        server_step(&mut c, &[&state(2.0), &state(4.0)], 4);
        assert_eq!(c, state(2.5));
    }
}
