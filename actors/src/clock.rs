//! Simulated time: how long a client's task takes, from a deterministic cost model instead of
//! a stopwatch, so that which answers a deadline, an over-committed round or an async buffer
//! takes depends on the seed alone (docs/async.md, "Simulated time").
//!
//! A task sent at virtual time t₀ reaches the client after the latency and its download
//! (`bits down / downlink rate`), trains for
//!
//! ```text
//!     compute = f_c · base + steps · seconds_per_step_c + epochs · samples · φ · seconds_per_sample_c
//!               (+ a `timeout` fault's delay)
//! ```
//!
//! where f_c is the client's straggler factor, base the stragglers' `base_delay_ms`, steps the
//! task's optimiser steps (`epochs · ⌈samples / batch⌉`), φ the task's share of the full model's
//! multiply-adds per sample (1 for a dense client, less for a spectral shard;
//! [`fedshard_protocol::work`] counts them, a convolution's weight at every output position),
//! and seconds_per_step_c and seconds_per_sample_c the client's device (the config's
//! `[devices]`, both already scaled by f_c): a step's fixed cost, which no sub-model lowers,
//! and the full model's arithmetic per sample. Its answer reaches the server after the latency and its upload (`bits up /
//! uplink rate`, with the bits its compressor really produced). Nothing sleeps.

use crate::faults::{FaultKind, FaultPlan};
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_protocol::work::ModelWork;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether rounds are timed by the wall clock or by the cost model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockKind {
    /// Real time: deadlines on the wall clock, stragglers sleep (real deployments).
    #[default]
    Wall,
    /// Simulated time from the cost model: deadlines, over-commitment and async decide by it,
    /// nothing sleeps, and a seed fixes the model bytes.
    Virtual,
}

/// One client's device and links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientCost {
    /// Samples in its data.
    pub samples: u64,
    /// f_c · base: a fixed time added to every task (the stragglers' `base_delay_ms`).
    pub fixed_seconds: f64,
    /// f_c / throughput: seconds per sample and epoch of the full model.
    pub seconds_per_sample: f64,
    /// f_c · a step's fixed cost: seconds per optimiser step whatever the sub-model and batch
    /// (launches, dispatch, the optimiser's pass over its state).
    pub seconds_per_step: f64,
    /// Bits per second; `f64::INFINITY` for a link that takes no time.
    pub uplink_bps: f64,
    pub downlink_bps: f64,
}

/// The cost model of a run's clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VirtualClock {
    pub kind: ClockKind,
    pub clients: BTreeMap<ClientId, ClientCost>,
    /// One-way latency of every message, seconds.
    pub latency: f64,
    /// The model's multiply-adds per sample, which φ is a task's share of.
    pub work: ModelWork,
    /// The fault plan: a `timeout` fault costs its delay in simulated time.
    pub faults: Option<FaultPlan>,
}

/// Where a client's task spent its simulated time, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskTime {
    /// Latency and download of the task.
    pub download: f64,
    pub compute: f64,
    /// Latency and upload of the answer.
    pub upload: f64,
}

impl TaskTime {
    pub fn total(&self) -> f64 {
        self.download + self.compute + self.upload
    }
}

impl VirtualClock {
    /// Whether deadlines are simulated too (else only the order of answers is).
    pub fn is_virtual(&self) -> bool {
        self.kind == ClockKind::Virtual
    }

    /// The time before `client` can answer `task` of `bits` on the downlink (`None`: only an
    /// upload of phase one's update), without the upload of the answer, which depends on its
    /// bits.
    pub fn before_upload(&self, client: ClientId, task: Option<(&TrainTask, u64)>) -> TaskTime {
        let Some(cost) = self.clients.get(&client) else {
            return TaskTime::default();
        };
        let Some((task, bits)) = task else {
            return TaskTime {
                download: self.latency,
                ..TaskTime::default()
            };
        };
        let bits = bits as f64;
        let share = self.work.share(&task.dense, &task.shards);
        let epochs = task.recipe.epochs as u64;
        let work = (epochs * cost.samples) as f64 * share;
        let steps = epochs * cost.samples.div_ceil(task.recipe.batch_size.max(1) as u64);
        let mut compute = cost.fixed_seconds
            + steps as f64 * cost.seconds_per_step
            + work * cost.seconds_per_sample;
        if let Some(plan) = &self.faults
            && plan.fault(task.seed, task.round, client) == Some(FaultKind::Timeout)
        {
            compute += plan.delay.as_secs_f64();
        }
        TaskTime {
            download: self.latency + bits / cost.downlink_bps,
            compute,
            upload: 0.0,
        }
    }

    /// The time before `client` can answer a message of `bits` that asks for no training (a
    /// step of a secure round): its download.
    pub fn before_message_answer(&self, client: ClientId, bits: u64) -> TaskTime {
        let Some(cost) = self.clients.get(&client) else {
            return TaskTime::default();
        };
        TaskTime {
            download: self.latency + bits as f64 / cost.downlink_bps,
            ..TaskTime::default()
        }
    }

    /// The time to send an answer of `bits` from `client`.
    pub fn upload(&self, client: ClientId, bits: u64) -> f64 {
        let rate = self
            .clients
            .get(&client)
            .map_or(f64::INFINITY, |c| c.uplink_bps);
        self.latency + bits as f64 / rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::model::{ModelState, NamedTensor};
    use fedshard_protocol::task::Recipe;
    use fedshard_protocol::work::{Arithmetic, WeightUse, WeightUses};

    fn task(values: usize, epochs: usize) -> TrainTask {
        TrainTask {
            round: 1,
            client: 0,
            seed: 1,
            dense: ModelState::new(vec![NamedTensor::zeros("w", vec![values])]).unwrap(),
            width: None,
            shards: vec![],
            recipe: Recipe {
                epochs,
                ..Recipe::default()
            },
            uplink: Default::default(),
            variates: None,
        }
    }

    fn clock() -> VirtualClock {
        let cost = ClientCost {
            samples: 50,
            fixed_seconds: 0.5,
            seconds_per_sample: 0.01,
            seconds_per_step: 0.0,
            uplink_bps: 1e6,
            downlink_bps: 4e6,
        };
        VirtualClock {
            kind: ClockKind::Virtual,
            clients: BTreeMap::from([(0, cost)]),
            latency: 0.02,
            work: ModelWork::new(
                Arithmetic {
                    weights: WeightUses::from([(
                        "w".to_string(),
                        WeightUse {
                            positions: 1,
                            convolution: false,
                        },
                    )]),
                    between_activations: 0,
                },
                &ModelState::new(vec![NamedTensor::zeros("w", vec![1000])]).expect("valid"),
            ),
            faults: None,
        }
    }

    /// A half-size task of 2 epochs on 50 samples at 10 ms a sample: 0.5 + 2·50·½·0.01 s.
    #[test]
    fn a_task_costs_its_latency_transfer_and_share_of_the_compute() {
        let clock = clock();
        let t = task(500, 2);
        let bits = crate::round::task_bits(&t);
        let time = clock.before_upload(0, Some((&t, bits)));
        let bits = bits as f64;
        assert!((time.download - (0.02 + bits / 4e6)).abs() < 1e-12);
        assert!((time.compute - (0.5 + 2.0 * 50.0 * 0.5 * 0.01)).abs() < 1e-12);
        assert_eq!(clock.upload(0, 1_000_000), 0.02 + 1.0);
        // An upload-only request (phase two) costs only the latency down.
        assert_eq!(clock.before_upload(0, None).total(), 0.02);
    }

    /// A step's fixed cost is paid per batch whatever the share: 2 epochs of 50 samples at
    /// batch 8 are 2 · 7 steps (the last batch of an epoch holds 2 samples).
    #[test]
    fn every_step_pays_the_devices_fixed_cost_whatever_the_share() {
        let mut clock = clock();
        clock
            .clients
            .get_mut(&0)
            .expect("client 0")
            .seconds_per_step = 0.1;
        let mut half = task(500, 2);
        half.recipe.batch_size = 8;
        let time = clock.before_upload(0, Some((&half, 0)));
        assert!((time.compute - (0.5 + 14.0 * 0.1 + 2.0 * 50.0 * 0.5 * 0.01)).abs() < 1e-12);
        let mut whole = task(1000, 2);
        whole.recipe.batch_size = 8;
        let time = clock.before_upload(0, Some((&whole, 0)));
        assert!((time.compute - (0.5 + 14.0 * 0.1 + 2.0 * 50.0 * 0.01)).abs() < 1e-12);
    }

    #[test]
    fn a_timeout_fault_costs_its_delay_in_simulated_time() {
        let mut clock = clock();
        let plan = FaultPlan {
            rate: 1.0,
            kinds: vec![FaultKind::Timeout],
            delay: std::time::Duration::from_secs(30),
            stragglers: None,
            byzantine: None,
        };
        clock.faults = Some(plan);
        let t = task(1000, 1);
        assert!((clock.before_upload(0, Some((&t, 0))).compute - (0.5 + 0.5 + 30.0)).abs() < 1e-12);
    }
}
