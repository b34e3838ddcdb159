//! **fedshard-actors**: the in-process actor runtime (server, coordinator, client host),
//! rounds, deadlines, checkpoints and the Prometheus exporter.
//! May depend on: `fedshard-strategies`, `fedshard-protocol`; ractor, tokio, prometheus, axum (no burn).
//!
//! The fedshard actor runtime: who talks to whom, and when.
//!
//! A [`server::Server`] actor holds the global model and drives rounds; a
//! [`coordinator::Coordinator`] keeps the client registry, clusters clients by keep ratio and
//! selects participants; a [`host::ClientHost`] on each node keeps its clients' lasting state
//! as plain data, registers them with the server, and lends a [`client::ClientActor`] (one of
//! a few it keeps) a client's state for each request, which calls the client's `LocalTrainer`
//! off the async executor, answers and comes back for the next. One round
//! engine ([`engine`]) drives synchronous, over-committed and buffered asynchronous rounds as
//! schedules ([`schedule::Schedule`]) of the same driver; the round logic it calls lives in
//! plain functions ([`round`]) so it is tested without actors. Errors are one typed [`Error`].
//! Every message payload is serde data with no in-process pointers, so the
//! transport can move to `ractor_cluster` without touching round logic.
//!
//! Not here: the mathematics (`fedshard-strategies`), the wire types (`fedshard-protocol`),
//! models, datasets and training (`fedshard-training`), the config and CLI (`fedshard`).

pub mod asynchronous;
pub mod checkpoint;
pub mod client;
pub mod clock;
pub(crate) mod collect;
pub mod coordinator;
pub mod engine;
pub mod error;
pub mod faults;
pub mod host;
pub mod live;
pub mod metrics;
pub mod policies;
pub mod privacy;
pub mod record;
pub mod round;
pub mod run_folder;
pub mod schedule;
pub(crate) mod scrape_listener;
pub mod secure;
pub mod server;
pub(crate) mod synchronous;
pub mod variates;

pub use error::{Error, Policy};

// With ractor's `cluster` feature (always on, see Cargo.toml) there is no blanket `Message`
// impl: each message type opts in. These stay in-process (the default impl is "not
// serialisable"); fedshard-cluster moves their work across machines as validated bytes.
impl ractor::Message for client::Job {}
impl ractor::Message for coordinator::CoordinatorMsg {}
impl ractor::Message for host::HostMsg {}
impl ractor::Message for server::ServerMsg {}
