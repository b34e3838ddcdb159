//! Models exchange their parameters as the runtime's named tensors: one type from the server's
//! global model to a client's trainer, so nothing is converted or copied at the boundary.

pub use fedshard_protocol::model::{ModelState, NamedTensor};
