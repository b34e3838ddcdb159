//! Bytes on a wire: bincode 2 (serde, standard configuration) with every peer-controlled length
//! bounded.
//!
//! A frame longer than the longest honest message of the session
//! ([`Params::max_frame_bytes`]) is refused before decoding. Inside a frame, the messages hold
//! no strings and no byte buffers (byte vectors and arrays decode as sequences), and serde
//! pre-allocates a sequence for at most 1 MiB whatever length it claims, so decoding allocates
//! in proportion to the bytes that arrived (compare `fedshard_protocol::bounded`, which must
//! also cap strings). What a decoded message claims (how many shares, which clients, how long
//! a vector) is then checked against the parameters by [`crate::Server::receive`] and the
//! [`crate::Client`] methods.

use bincode::config::standard;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::message::{ClientMessage, ServerMessage};
use crate::params::Params;

/// The bincode bytes of any message.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(message, standard())
        .expect("messages hold only integers, arrays and vectors, which always encode")
}

fn decode<T: DeserializeOwned>(bytes: &[u8], params: &Params) -> Result<T, Error> {
    let limit = params.max_frame_bytes();
    if bytes.len() > limit {
        return Err(Error::FrameTooLarge {
            got: bytes.len(),
            limit,
        });
    }
    let (message, used) = bincode::serde::decode_from_slice(bytes, standard())
        .map_err(|e| Error::Decode(e.to_string()))?;
    if used != bytes.len() {
        return Err(Error::Decode(format!(
            "{} trailing bytes",
            bytes.len() - used
        )));
    }
    Ok(message)
}

/// A client's message from its frame, for the server.
pub fn decode_client_message(bytes: &[u8], params: &Params) -> Result<ClientMessage, Error> {
    decode(bytes, params)
}

/// The server's message from its frame, for a client.
pub fn decode_server_message(bytes: &[u8], params: &Params) -> Result<ServerMessage, Error> {
    decode(bytes, params)
}
