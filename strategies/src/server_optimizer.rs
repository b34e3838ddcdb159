//! Server optimizers (docs/algorithms.md §10; Reddi et al., *Adaptive Federated Optimization*,
//! ICLR 2021, Algorithm 2, and Hsu et al. 2019 for server momentum): the server treats the
//! round's aggregate change `Δ_t = x̄_t − x_t` (whatever aggregator, fold or privacy produced
//! `x̄_t`) as a pseudo-gradient and takes an optimizer step with it, `x_{t+1} = x_t + step(Δ_t)`,
//! in the dense weight space of the global model. Every formula is Flower's (`FedAvgM`,
//! `FedAdagrad`, `FedAdam`, `FedYogi` in `flwr.server.strategy`), the oracle of the tests.

use crate::{Result, StrategyError};
use serde::{Deserialize, Serialize};

/// `[server_optimizer]`: how the server applies each aggregate, a [`Table`] whose numbers were
/// checked when it was read ([`TryFrom<Table>`]), so a value of this type is always valid.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Table", into = "Table")]
pub struct ServerOptimizer(Table);

/// The `[server_optimizer]` table as written. The defaults are Flower's (`FedAvgM`: η = 1,
/// μ = 0.9 (Flower's default μ is 0, which is `sgd`); `FedAdagrad`: η = 0.1, β₁ = 0, τ = 1e-9;
/// `FedAdam`: η = 0.1, β₁ = 0.9, β₂ = 0.99, τ = 1e-9; `FedYogi`: η = 0.01, β₁ = 0.9,
/// β₂ = 0.99, τ = 1e-3).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Table {
    /// `x ← x + η Δ` (η = 1 is plain averaging).
    Sgd {
        #[serde(default = "one")]
        lr: f64,
    },
    /// FedAvgM (Hsu et al. 2019; Flower's `FedAvgM` with `server_momentum`):
    /// `v ← μ v + Δ`, `x ← x + η v`.
    Momentum {
        #[serde(default = "one")]
        lr: f64,
        #[serde(default = "nine_tenths")]
        momentum: f64,
    },
    /// FedAdagrad (Reddi et al. Algorithm 2): `m ← β₁ m + (1 − β₁) Δ`, `v ← v + Δ²`,
    /// `x ← x + η m / (√v + τ)`.
    Adagrad {
        #[serde(default = "tenth")]
        lr: f64,
        #[serde(default)]
        beta1: f64,
        #[serde(default = "tiny")]
        tau: f64,
    },
    /// FedAdam: `m ← β₁ m + (1 − β₁) Δ`, `v ← β₂ v + (1 − β₂) Δ²`,
    /// `x ← x + η_t m / (√v + τ)` with Flower's bias correction
    /// `η_t = η √(1 − β₂^{t+1}) / (1 − β₁^{t+1})` at round `t` (Reddi et al.'s Algorithm 2 has
    /// none; Flower's exponent is the round plus one).
    Adam {
        #[serde(default = "tenth")]
        lr: f64,
        #[serde(default = "nine_tenths")]
        beta1: f64,
        #[serde(default = "beta2")]
        beta2: f64,
        #[serde(default = "tiny")]
        tau: f64,
    },
    /// FedYogi: as FedAdam without the bias correction, with Yogi's second moment
    /// `v ← v − (1 − β₂) Δ² sign(v − Δ²)`.
    Yogi {
        #[serde(default = "hundredth")]
        lr: f64,
        #[serde(default = "nine_tenths")]
        beta1: f64,
        #[serde(default = "beta2")]
        beta2: f64,
        #[serde(default = "thousandth")]
        tau: f64,
    },
}

fn one() -> f64 {
    1.0
}
fn tenth() -> f64 {
    0.1
}
fn hundredth() -> f64 {
    0.01
}
fn thousandth() -> f64 {
    1e-3
}
fn nine_tenths() -> f64 {
    0.9
}
fn beta2() -> f64 {
    0.99
}
fn tiny() -> f64 {
    1e-9
}

/// The range a parameter must lie in.
#[derive(Clone, Copy)]
enum Range {
    /// A finite number > 0: rates and τ.
    Positive,
    /// A number in [0, 1): momentum and the βs.
    Decay,
}

impl Table {
    /// Every number of the table with its field and range.
    fn parameters(&self) -> Vec<(&'static str, f64, Range)> {
        use Range::{Decay, Positive};
        match *self {
            Table::Sgd { lr } => vec![("lr", lr, Positive)],
            Table::Momentum { lr, momentum } => {
                vec![("lr", lr, Positive), ("momentum", momentum, Decay)]
            }
            Table::Adagrad { lr, beta1, tau } => vec![
                ("lr", lr, Positive),
                ("beta1", beta1, Decay),
                ("tau", tau, Positive),
            ],
            Table::Adam {
                lr,
                beta1,
                beta2,
                tau,
            }
            | Table::Yogi {
                lr,
                beta1,
                beta2,
                tau,
            } => vec![
                ("lr", lr, Positive),
                ("beta1", beta1, Decay),
                ("beta2", beta2, Decay),
                ("tau", tau, Positive),
            ],
        }
    }
}

impl TryFrom<Table> for ServerOptimizer {
    type Error = StrategyError;

    /// Refuses a number out of its range, naming `server_optimizer.<field>`.
    fn try_from(table: Table) -> Result<Self> {
        for (field, x, range) in table.parameters() {
            let (ok, expected) = match range {
                Range::Positive => (x.is_finite() && x > 0.0, "a finite number > 0"),
                Range::Decay => ((0.0..1.0).contains(&x), "a number in [0, 1)"),
            };
            if !ok {
                return Err(StrategyError::InvalidInput {
                    what: "server optimizer",
                    reason: format!("server_optimizer.{field}: expected {expected}, found {x}"),
                });
            }
        }
        Ok(Self(table))
    }
}

impl From<ServerOptimizer> for Table {
    fn from(o: ServerOptimizer) -> Self {
        o.0
    }
}

/// What a server optimizer remembers between rounds, one vector per global block (tensor):
/// the first moment (momentum's velocity) and the second moment; empty until the first step.
/// Checkpointed with the model, so a resumed run continues bit for bit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimizerState {
    pub first: Vec<Vec<f32>>,
    pub second: Vec<Vec<f32>>,
}

impl ServerOptimizer {
    /// The registry name (`kind` in the table).
    pub fn name(&self) -> &'static str {
        match self.0 {
            Table::Sgd { .. } => "sgd",
            Table::Momentum { .. } => "momentum",
            Table::Adagrad { .. } => "adagrad",
            Table::Adam { .. } => "adam",
            Table::Yogi { .. } => "yogi",
        }
    }

    /// The checked table.
    pub fn table(&self) -> Table {
        self.0
    }

    /// Round `round`'s step: `aggregate[b]` holds block `b` as the round's fold left it and
    /// becomes `before[b] + step(aggregate[b] − before[b])`; `state` advances. Arithmetic in
    /// f64, stored in f32 (Flower's arrays are f32 too). Errors, leaving everything untouched,
    /// when the blocks do not match each other or the state.
    pub fn step(
        &self,
        state: &mut OptimizerState,
        round: u64,
        before: &[&[f32]],
        aggregate: &mut [&mut [f32]],
    ) -> Result<()> {
        let shapes_match = before.len() == aggregate.len()
            && before
                .iter()
                .zip(aggregate.iter())
                .all(|(b, a)| b.len() == a.len());
        if !shapes_match {
            return Err(StrategyError::invalid(
                "server optimizer",
                "the aggregate's blocks differ from the model's",
            ));
        }
        let zeros = || before.iter().map(|b| vec![0.0f32; b.len()]).collect();
        for moment in [&mut state.first, &mut state.second] {
            if moment.is_empty() {
                *moment = zeros();
            }
            let fits = moment.len() == before.len()
                && moment.iter().zip(before).all(|(m, b)| m.len() == b.len());
            if !fits {
                return Err(StrategyError::invalid(
                    "server optimizer state",
                    "its moments do not fit the model (a checkpoint of another model?)",
                ));
            }
        }
        let t = round as f64 + 1.0;
        for (b, (x0, x)) in before.iter().zip(aggregate.iter_mut()).enumerate() {
            let (m, v) = (&mut state.first[b], &mut state.second[b]);
            for i in 0..x.len() {
                let start = f64::from(x0[i]);
                let delta = f64::from(x[i]) - start;
                let (m0, v0) = (f64::from(m[i]), f64::from(v[i]));
                let moved = match self.0 {
                    Table::Sgd { lr } => lr * delta,
                    Table::Momentum { lr, momentum } => {
                        let velocity = momentum * m0 + delta;
                        m[i] = velocity as f32;
                        lr * velocity
                    }
                    Table::Adagrad { lr, beta1, tau } => {
                        let first = beta1 * m0 + (1.0 - beta1) * delta;
                        let second = v0 + delta * delta;
                        (m[i], v[i]) = (first as f32, second as f32);
                        lr * first / (second.sqrt() + tau)
                    }
                    Table::Adam {
                        lr,
                        beta1,
                        beta2,
                        tau,
                    } => {
                        let first = beta1 * m0 + (1.0 - beta1) * delta;
                        let second = beta2 * v0 + (1.0 - beta2) * delta * delta;
                        (m[i], v[i]) = (first as f32, second as f32);
                        let eta = lr * (1.0 - beta2.powf(t)).sqrt() / (1.0 - beta1.powf(t));
                        eta * first / (second.sqrt() + tau)
                    }
                    Table::Yogi {
                        lr,
                        beta1,
                        beta2,
                        tau,
                    } => {
                        let first = beta1 * m0 + (1.0 - beta1) * delta;
                        let square = delta * delta;
                        let second = v0 - (1.0 - beta2) * square * sign(v0 - square);
                        (m[i], v[i]) = (first as f32, second as f32);
                        lr * first / (second.sqrt() + tau)
                    }
                };
                x[i] = (start + moved) as f32;
            }
        }
        Ok(())
    }
}

/// NumPy's `sign`: −1, 0 or 1.
fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

#[cfg(test)]
#[path = "server_optimizer_tests.rs"]
mod tests;
