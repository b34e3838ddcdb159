//! **fedshard-secagg**: secure aggregation of integer vectors, SecAgg (Bonawitz et al. 2017,
//! "Practical Secure Aggregation for Privacy-Preserving Machine Learning") and SecAgg+ (Bell,
//! Bengtsson et al. 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead"),
//! as plain state machines over typed messages.
//! May depend on: `fedshard-bits`; x25519-dalek, chacha20poly1305, hkdf, sha2, rand,
//! rand_chacha, serde, bincode, thiserror (no actors, no async, no networking, no other fedshard
//! crate).
//!
//! What it is for: a server learns `Σ_{u ∈ U3} x_u mod 2^bits` over the clients `U3` whose
//! masked inputs arrived, and nothing else about any `x_u`, even when clients drop out
//! (up to all but `t`). The in-process round and the `serve`/`join` cluster drive a
//! [`Server`] and [`Client`]s by passing their messages (serde, bincode via [`wire`]);
//! [`simulate()`] drives them in memory. Not for: choosing clients, deadlines, transport, or
//! deciding whether an uplink coding may be used — [`UplinkCoding::check_summable`] answers
//! that question for the caller's config check.
//!
//! The rounds (docs/algorithms.md §7; docs/secagg.md for the threat model and costs):
//! 0. [`Client::advertise_keys`]: two X25519 key pairs, `c` (share encryption) and `s` (masks).
//! 1. [`Client::share_keys`]: Shamir shares ([`shamir`], GF(2⁶¹ − 1)) of the self-mask seed
//!    `b_u` and of `s_u^SK`, `t` of the neighbourhood (a [`Graph`]), each pair of shares
//!    sealed with ChaCha20-Poly1305 under HKDF-SHA256 of the `c` agreement, with associated
//!    data (session, round, sender, receiver).
//! 2. [`Client::masked_input`]:
//!    `y_u = x_u + PRG(b_u) + Σ_{v<u} PRG(s_uv) − Σ_{v>u} PRG(s_uv) mod 2^bits`, PRG =
//!    ChaCha20 seeded by HKDF of the secret with the session id as salt.
//! 3. [`Client::unmask`]: shares of `b_v` for survivors, of `s_v^SK` for the dropped, never
//!    both for one client; [`Server::finish`] rebuilds them and removes the masks.
//!
//! # What composes
//!
//! The crate sums vectors of integers in `Z_{2^bits}`, exactly. Anything whose server step is
//! that sum composes: dense f32 updates through [`FixedPoint`] (clip, scale, round, with the
//! error bound [`FixedPoint::error_bound`]), and linear integer quantisations through
//! [`IntegerRange`] — QSGD levels with a shared scale, SignSGD signs as ±1 (the sum is the
//! vote), FedPM mask bits (BayesAgg needs only the counts). Non-linear codings do not:
//! KLMS's index coding (a sum of candidate indices names no candidate) and variable-length
//! codes such as QSGD's Elias code. [`UplinkCoding`] lists fedshard's codings with this
//! verdict, for the config check that refuses the others.

pub mod client;
pub mod crypto;
pub mod encoding;
pub mod error;
pub mod field;
pub mod graph;
pub mod message;
pub mod packing;
pub mod params;
pub mod server;
pub mod shamir;
pub mod simulate;
pub mod wire;

pub use client::Client;
pub use encoding::{FixedPoint, IntegerRange, UplinkCoding};
pub use error::Error;
pub use graph::Graph;
pub use message::{ClientId, ClientMessage, Round, ServerMessage, SessionId};
pub use params::{Param, Params};
pub use server::{Aggregate, Server};
pub use simulate::{Dropouts, RoundCost, Simulation, simulate};
