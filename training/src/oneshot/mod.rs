//! One-shot federated learning experiments: the synthetic ridge experiment of FESC
//! (docs/algorithms.md §3.3, Figure 1 of Garin, Evgeniou & Vayatis).
//!
//! * [`data`] draws the node sizes and each node's sufficient statistics `XᵢᵀXᵢ`, `Xᵢᵀyᵢ`
//!   (never the data themselves).
//! * [`ridge`] fits local and centralised ridge estimators from those statistics and computes
//!   the oracle variance and bias of each local fit.
//! * [`experiment`] runs the γ × runs grid in parallel and averages the errors of the
//!   centralised, FedAvg, FESC and oracle-FESC estimators.

pub mod data;
pub mod error;
pub mod experiment;
pub mod ridge;

pub use error::OneshotError;
pub use experiment::{RidgeConfig, RidgeReport, RidgeRow, run_ridge};
pub use ridge::RidgeForm;
