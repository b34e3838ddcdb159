//! The fedshard actor runtime: who talks to whom, and when.
//!
//! A [`server::Server`] actor holds the global model and drives rounds; a
//! [`coordinator::Coordinator`] keeps the client registry, clusters clients by keep ratio and
//! selects participants; one [`client::ClientActor`] per client runs a [`trainer::LocalTrainer`]
//! off the async executor. Round logic lives in plain functions ([`round`]) so it is tested
//! without actors. Every message payload is serde data with no in-process pointers, so the
//! transport can move to `ractor_cluster` without touching round logic.
//!
//! Not here: the mathematics (`fedshard-strategies`), models, datasets and the CLI (`fedshard`).

pub mod checkpoint;
pub mod client;
pub mod coordinator;
pub mod faults;
pub mod metrics;
pub mod model;
pub mod payload;
pub mod record;
pub mod round;
pub mod server;
pub mod trainer;
