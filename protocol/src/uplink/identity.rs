//! The identity encoding: bincode of the trained tensors, f32, 32 bits per value plus framing.

use super::codec::{Codec, Symbols, Update};
use super::flatten;
use super::wire::BitsError;
use crate::error::Error;
use crate::model::ModelState;
use crate::task::{LayerShard, TrainOutput, TrainTask};
use serde::{Deserialize, Serialize};

/// The identity encoding's codec.
#[derive(Debug, Clone, Copy)]
pub struct IdentityCodec;

/// What an identity payload carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct UpdateBody {
    dense: ModelState,
    shards: Vec<LayerShard>,
}

/// Its symbols are the trained values themselves.
fn values(dense: &ModelState, shards: &[LayerShard]) -> Symbols {
    Symbols::Real(flatten(dense, shards).into_iter().map(f64::from).collect())
}

impl Codec for IdentityCodec {
    fn encode(&self, _: &TrainTask, output: &TrainOutput) -> Result<(Vec<u8>, Symbols), Error> {
        let body = UpdateBody {
            dense: output.dense.clone(),
            shards: output.shards.clone(),
        };
        let bytes = bincode::serde::encode_to_vec(&body, bincode::config::standard())
            .unwrap_or_else(|e| unreachable!("in-memory bincode encoding failed: {e}"));
        Ok((bytes, values(&body.dense, &body.shards)))
    }

    /// The tensors as sent; their names, shapes and values are checked against the task by
    /// [`crate::payload::decode_and_validate`].
    fn decode(&self, _: &TrainTask, bytes: &[u8]) -> Result<(Update, Symbols), Error> {
        // Bounded: a 17-byte payload claiming a 16 TiB tensor name aborted the server.
        let (body, used): (UpdateBody, usize) =
            crate::bounded::decode_from_slice(bytes).map_err(|e| Error::Bincode(e.to_string()))?;
        if used != bytes.len() {
            return Err(BitsError::TrailingBytes((bytes.len() - used) as u64).into());
        }
        let symbols = values(&body.dense, &body.shards);
        Ok((
            Update::Tensors {
                dense: body.dense,
                shards: body.shards,
            },
            symbols,
        ))
    }
}
