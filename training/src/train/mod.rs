//! Local training for the runtime: [`LocalTrainer`] and [`Evaluator`] implementations that wire
//! the model code (`crate::models`) to the data (`crate::data`): the burn networks (softmax
//! regression among them, as an MLP without hidden layers), FedPM's masked networks, the SGLD
//! step of the neural models and closed-form ridge.
//!
//! [`LocalTrainer`]: fedshard_protocol::task::LocalTrainer
//! [`Evaluator`]: fedshard_protocol::task::Evaluator

mod batches;
pub mod cohort;
pub mod fedpm;
mod fjord;
pub mod gather;
pub mod neural;
mod proximal;
pub mod ridge;
mod scaffold;
pub mod sgld;
pub mod slots;
#[cfg(test)]
mod width_cifar_tests;
#[cfg(test)]
mod width_tests;

pub use ridge::{RidgeClient, RidgeEvaluator, synthetic_clients};
