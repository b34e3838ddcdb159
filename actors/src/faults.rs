//! Deterministic fault injection, so failure handling is exercised by real runs and tests: a
//! [`FaultyTrainer`] wraps a client's trainer and, in a fraction of (round, client) pairs drawn
//! from the stream (seed, round, client, Experiment), fails in one of the configured ways.

use fedshard_protocol::task::{ClientId, LocalTrainer, TrainOutput, TrainTask};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// One way a client can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The trainer returns an error.
    Error,
    /// The trainer panics.
    Panic,
    /// The trainer takes longer than `delay` and misses the deadline.
    Timeout,
    /// The update contains a NaN.
    NonFinite,
    /// A dense tensor of the update has the wrong length.
    WrongShape,
    /// A sharded layer reports indices it was not given.
    ForeignIndices,
    /// Every factor value of the first sharded layer is `f32::MAX`: finite, so the update passes
    /// the server's checks, but the recomposed layer `Σ u_i v_iᵀ` overflows to infinity.
    Overflow,
}

/// Which faults to inject and how often.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPlan {
    /// Probability that a client fails in a given round.
    pub rate: f64,
    /// The kinds, chosen uniformly among these when a fault happens.
    pub kinds: Vec<FaultKind>,
    /// How long a `timeout` fault sleeps (longer than the round deadline).
    #[serde(with = "millis", rename = "delay_ms")]
    pub delay: Duration,
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

impl FaultPlan {
    /// The fault of `client` in `round`, if any.
    pub fn fault(&self, seed: u64, round: u64, client: ClientId) -> Option<FaultKind> {
        if self.kinds.is_empty() {
            return None;
        }
        let mut rng = stream(seed, round, client, Purpose::Experiment);
        let u = uniform(&mut rng);
        (u < self.rate).then(|| {
            let k =
                ((uniform(&mut rng) * self.kinds.len() as f64) as usize).min(self.kinds.len() - 1);
            self.kinds[k]
        })
    }
}

/// A trainer that fails as its [`FaultPlan`] says and otherwise defers to the wrapped one.
pub struct FaultyTrainer {
    pub inner: Arc<dyn LocalTrainer>,
    pub plan: FaultPlan,
}

impl LocalTrainer for FaultyTrainer {
    fn samples(&self) -> u64 {
        self.inner.samples()
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, String> {
        let fault = self.plan.fault(task.seed, task.round, task.client);
        match fault {
            Some(FaultKind::Error) => return Err("injected error".into()),
            Some(FaultKind::Panic) => panic!("injected panic in client {}", task.client),
            Some(FaultKind::Timeout) => std::thread::sleep(self.plan.delay),
            _ => {}
        }
        let mut output = self.inner.train(task)?;
        match fault {
            Some(FaultKind::NonFinite) => {
                if let Some(v) = output
                    .dense
                    .tensors
                    .iter_mut()
                    .flat_map(|t| t.data.iter_mut())
                    .next()
                {
                    *v = f32::NAN;
                }
            }
            Some(FaultKind::WrongShape) => {
                if let Some(t) = output.dense.tensors.first_mut() {
                    t.data.push(0.0);
                }
            }
            Some(FaultKind::ForeignIndices) => match output.shards.first_mut() {
                Some(shard) => {
                    for i in shard.indices.iter_mut() {
                        *i += 1_000_000;
                    }
                }
                None => return Err("foreign-indices fault needs a sharded layer".into()),
            },
            Some(FaultKind::Overflow) => match output.shards.first_mut() {
                Some(shard) => {
                    shard.left.fill(f32::MAX);
                    shard.right.fill(f32::MAX);
                }
                None => return Err("overflow fault needs a sharded layer".into()),
            },
            _ => {}
        }
        Ok(output)
    }
}
