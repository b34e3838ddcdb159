//! Byzantine clients (`[faults.byzantine]`): a fixed share of the clients sends malicious
//! updates, so that robust aggregators can be measured against an attack and the plain mean can
//! be seen to fail.
//!
//! Which clients attack is drawn from the seed alone ([`Byzantine::clients`]), as the
//! stragglers are, so a node hosting a client (`fedshard join`) attacks exactly as the
//! in-process run does, and the server can record how many attackers each aggregate took in
//! without being told. An attack on the update ([`Attack::apply`]) changes the trained output
//! after training and before it is encoded, in the space the client sends: a dense tensor's
//! values (a width-sliced task's sliced tensors), a spectral shard's factor values `U'`, `V'`
//! (never the frozen multipliers ω, which are not sent). Label flipping instead changes the
//! client's examples where its trainer is built (the `fedshard` crate), and leaves the output
//! alone.

use crate::error::Error;
use fedshard_protocol::task::{ClientId, TrainOutput, TrainTask};
use fedshard_strategies::rng::{ChaCha20Rng, Purpose, stream, uniform};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use thiserror::Error;

/// What a byzantine client does. x₀ is a value the task sent, x_c the value the client trained.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attack {
    /// Sends the opposite change: x₀ − (x_c − x₀).
    SignFlip,
    /// Sends the change scaled by `factor` k: x₀ + k (x_c − x₀).
    Scale { factor: f64 },
    /// Sends x_c + N(0, σ²) per value, from the stream (seed, round, client, Byzantine).
    Gaussian { sigma: f64 },
    /// Sends `value` c for every value.
    Constant { value: f64 },
    /// Trains honestly on flipped labels, y → classes − 1 − y, and sends what it trained.
    LabelFlip,
}

/// The `[faults.byzantine]` table: round(`share` · N) clients, chosen by the seed, attack with
/// `attack`. Built only through [`Byzantine::new`] (which serde goes through too), so it never
/// holds a share outside [0, 1] or an attack that is not finite.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Table", into = "Table")]
pub struct Byzantine {
    share: f64,
    attack: Attack,
}

/// The stream slot of the draws that choose the attackers: `round` = this, client = the
/// client's index. Rounds start at 1, and the Gaussian attack draws with the task's round, so
/// no attack's draw shares it.
const CHOICE_ROUND: u64 = u64::MAX;

impl Byzantine {
    /// The table of `share` and `attack`, refused with the name of the field that is out of
    /// its domain: `share` outside [0, 1], a scale `factor` or constant `value` that is not a
    /// finite number (a constant is sent as a 32-bit float, so it must be finite as one), a
    /// `sigma` that is negative or not finite.
    pub fn new(share: f64, attack: Attack) -> Result<Self, Error> {
        let bad = |field, expected, found: f64| {
            Err(Error::Invalid {
                field,
                expected,
                found: found.to_string(),
            })
        };
        if !(0.0..=1.0).contains(&share) {
            return bad("faults.byzantine.share", "a share in [0, 1]", share);
        }
        match attack {
            Attack::Scale { factor } if !factor.is_finite() => {
                return bad("faults.byzantine.factor", "a finite number", factor);
            }
            Attack::Gaussian { sigma } if !(sigma >= 0.0 && sigma.is_finite()) => {
                return bad("faults.byzantine.sigma", "a non-negative number", sigma);
            }
            Attack::Constant { value } if !(value as f32).is_finite() => {
                return bad(
                    "faults.byzantine.value",
                    "a number finite as a 32-bit float",
                    value,
                );
            }
            _ => {}
        }
        Ok(Self { share, attack })
    }

    pub fn share(&self) -> f64 {
        self.share
    }

    pub fn attack(&self) -> Attack {
        self.attack
    }

    /// The attackers among the clients `0..clients`: the round(share · N) with the smallest
    /// draws of the stream (seed, u64::MAX, c, Byzantine), deterministic under `seed` and the
    /// same in every process that knows the number of clients.
    pub fn clients(&self, seed: u64, clients: usize) -> BTreeSet<ClientId> {
        let draws: Vec<f64> = (0..clients as u64)
            .map(|c| uniform(&mut stream(seed, CHOICE_ROUND, c, Purpose::Byzantine)))
            .collect();
        let count = ((self.share * clients as f64).round() as usize).min(clients);
        let mut order: Vec<usize> = (0..clients).collect();
        order.sort_by(|&a, &b| draws[a].total_cmp(&draws[b]).then(a.cmp(&b)));
        order[..count].iter().map(|&c| c as ClientId).collect()
    }
}

impl Attack {
    /// Replaces the trained `output` of `task` with what the attacker sends. Label flipping
    /// acts on the examples, not here: the output is left as trained. Every value is computed
    /// in f64 and rounded once to f32; a value that overflows is sent as it is, and the
    /// server's finiteness check rejects the update.
    pub fn apply(&self, task: &TrainTask, output: &mut TrainOutput) -> Result<(), AttackError> {
        let change =
            |x0: f32, xc: f32, k: f64| (f64::from(x0) + k * (f64::from(xc) - f64::from(x0))) as f32;
        match *self {
            Attack::SignFlip => each_sent_pair(task, output, |x0, xc| change(x0, xc, -1.0)),
            Attack::Scale { factor } => {
                each_sent_pair(task, output, |x0, xc| change(x0, xc, factor))
            }
            Attack::Gaussian { sigma } => {
                let mut normals = Normals::new(stream(
                    task.seed,
                    task.round,
                    task.client,
                    Purpose::Byzantine,
                ));
                for x in sent_values(output) {
                    *x = (f64::from(*x) + sigma * normals.next_normal()) as f32;
                }
                Ok(())
            }
            Attack::Constant { value } => {
                for x in sent_values(output) {
                    *x = value as f32;
                }
                Ok(())
            }
            Attack::LabelFlip => Ok(()),
        }
    }
}

/// Every value a client sends, in a fixed order: the dense tensors, then each shard's left
/// and right factor values (the multipliers ω are frozen and not sent).
fn sent_values(output: &mut TrainOutput) -> impl Iterator<Item = &mut f32> {
    let dense = output
        .dense
        .tensors
        .iter_mut()
        .flat_map(|t| t.data.iter_mut());
    let shards = output
        .shards
        .iter_mut()
        .flat_map(|s| s.left.iter_mut().chain(s.right.iter_mut()));
    dense.chain(shards)
}

/// Sets every sent value x_c of `output` to `f(x₀, x_c)`, x₀ the value at the same place in
/// `task`: the dense tensor of the same name, the shard at the same position (of the same
/// layer and length).
fn each_sent_pair(
    task: &TrainTask,
    output: &mut TrainOutput,
    f: impl Fn(f32, f32) -> f32,
) -> Result<(), AttackError> {
    for tensor in &mut output.dense.tensors {
        let sent = task
            .dense
            .get(&tensor.name)
            .filter(|t| t.data.len() == tensor.data.len())
            .ok_or_else(|| AttackError::NotInTask(tensor.name.clone()))?;
        for (x, &x0) in tensor.data.iter_mut().zip(&sent.data) {
            *x = f(x0, *x);
        }
    }
    if output.shards.len() != task.shards.len() {
        return Err(AttackError::Shards {
            sent: task.shards.len(),
            trained: output.shards.len(),
        });
    }
    for (shard, sent) in output.shards.iter_mut().zip(&task.shards) {
        if shard.name != sent.name
            || shard.left.len() != sent.left.len()
            || shard.right.len() != sent.right.len()
        {
            return Err(AttackError::NotInTask(shard.name.clone()));
        }
        let pairs = shard
            .left
            .iter_mut()
            .zip(&sent.left)
            .chain(shard.right.iter_mut().zip(&sent.right));
        for (x, &x0) in pairs {
            *x = f(x0, *x);
        }
    }
    Ok(())
}

/// Why an attack could not be applied: the trained output does not match its task, which a
/// trainer that keeps the task's tensors never produces.
#[derive(Debug, Error, PartialEq)]
pub enum AttackError {
    #[error("byzantine attack: the trained tensor `{0}` is not the one of that name the task sent")]
    NotInTask(String),
    #[error("byzantine attack: the task sent {sent} shards and training returned {trained}")]
    Shards { sent: usize, trained: usize },
}

/// Standard normal draws by Box–Muller, both of each pair used.
struct Normals {
    rng: ChaCha20Rng,
    spare: Option<f64>,
}

impl Normals {
    fn new(rng: ChaCha20Rng) -> Self {
        Self { rng, spare: None }
    }

    fn next_normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        // 1 − u ∈ (0, 1]: the logarithm is finite.
        let radius = (-2.0 * (1.0 - uniform(&mut self.rng)).ln()).sqrt();
        let angle = std::f64::consts::TAU * uniform(&mut self.rng);
        self.spare = Some(radius * angle.sin());
        radius * angle.cos()
    }
}

/// `[faults.byzantine]` as written: the kind with its own parameter, so that a parameter of
/// another kind (a `sigma` on `scale`) is an unknown field, not silently ignored.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum Table {
    SignFlip { share: f64 },
    Scale { share: f64, factor: f64 },
    Gaussian { share: f64, sigma: f64 },
    Constant { share: f64, value: f64 },
    LabelFlip { share: f64 },
}

impl TryFrom<Table> for Byzantine {
    type Error = Error;

    fn try_from(table: Table) -> Result<Self, Error> {
        let (share, attack) = match table {
            Table::SignFlip { share } => (share, Attack::SignFlip),
            Table::Scale { share, factor } => (share, Attack::Scale { factor }),
            Table::Gaussian { share, sigma } => (share, Attack::Gaussian { sigma }),
            Table::Constant { share, value } => (share, Attack::Constant { value }),
            Table::LabelFlip { share } => (share, Attack::LabelFlip),
        };
        Byzantine::new(share, attack)
    }
}

impl From<Byzantine> for Table {
    fn from(b: Byzantine) -> Self {
        let share = b.share;
        match b.attack {
            Attack::SignFlip => Table::SignFlip { share },
            Attack::Scale { factor } => Table::Scale { share, factor },
            Attack::Gaussian { sigma } => Table::Gaussian { share, sigma },
            Attack::Constant { value } => Table::Constant { share, value },
            Attack::LabelFlip => Table::LabelFlip { share },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::model::{ModelState, NamedTensor};
    use fedshard_protocol::task::LayerShard;

    /// A task that sent w = [1, −2] and one shard with U' = [0.5, 0], V' = [1], ω = [4].
    fn task() -> TrainTask {
        TrainTask {
            round: 3,
            client: 5,
            seed: 11,
            dense: ModelState {
                tensors: vec![NamedTensor::new("w", vec![2], vec![1.0, -2.0]).unwrap()],
            },
            shards: vec![shard(vec![0.5, 0.0], vec![1.0])],
            width: None,
            recipe: Default::default(),
            uplink: Default::default(),
            variates: None,
        }
    }

    fn shard(left: Vec<f32>, right: Vec<f32>) -> LayerShard {
        LayerShard {
            name: "conv".into(),
            shape: vec![2, 1],
            indices: vec![0],
            left,
            right,
            multipliers: vec![4.0],
        }
    }

    /// What the client trained: w = [1.5, −1], U' = [0.25, 1], V' = [3].
    fn trained() -> TrainOutput {
        TrainOutput {
            dense: ModelState {
                tensors: vec![NamedTensor::new("w", vec![2], vec![1.5, -1.0]).unwrap()],
            },
            shards: vec![shard(vec![0.25, 1.0], vec![3.0])],
            loss: 0.7,
            control: None,
        }
    }

    fn attacked(attack: Attack) -> TrainOutput {
        let mut output = trained();
        attack
            .apply(&task(), &mut output)
            .expect("the output matches its task");
        output
    }

    /// (w, U', V') of an output.
    fn sent(o: &TrainOutput) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let s = &o.shards[0];
        (
            o.dense.tensors[0].data.clone(),
            s.left.clone(),
            s.right.clone(),
        )
    }

    #[test]
    fn sign_flip_sends_the_opposite_change_of_every_sent_value() {
        // x₀ − (x_c − x₀): 1 − 0.5, −2 − 1; 0.5 + 0.25, 0 − 1; 1 − 2.
        let o = attacked(Attack::SignFlip);
        assert_eq!(sent(&o), (vec![0.5, -3.0], vec![0.75, -1.0], vec![-1.0]));
        // ω is not sent and stays frozen; the reported loss is the trained one.
        assert_eq!((o.shards[0].multipliers.clone(), o.loss), (vec![4.0], 0.7));
    }

    #[test]
    fn scale_multiplies_every_change_by_its_factor() {
        // x₀ + 3 (x_c − x₀): 1 + 1.5, −2 + 3; 0.5 − 0.75, 0 + 3; 1 + 6.
        let o = attacked(Attack::Scale { factor: 3.0 });
        assert_eq!(sent(&o), (vec![2.5, 1.0], vec![-0.25, 3.0], vec![7.0]));
        // k = 1 sends the honest update, k = 0 the task's own values.
        assert_eq!(attacked(Attack::Scale { factor: 1.0 }), trained());
        let o = attacked(Attack::Scale { factor: 0.0 });
        assert_eq!(sent(&o), (vec![1.0, -2.0], vec![0.5, 0.0], vec![1.0]));
    }

    #[test]
    fn constant_sends_one_value_everywhere_and_label_flip_leaves_the_output() {
        let o = attacked(Attack::Constant { value: -0.25 });
        assert_eq!(sent(&o), (vec![-0.25; 2], vec![-0.25; 2], vec![-0.25]));
        assert_eq!(o.shards[0].multipliers, vec![4.0]);
        assert_eq!(attacked(Attack::LabelFlip), trained());
    }

    #[test]
    fn gaussian_noise_has_its_sigma_and_is_fixed_by_seed_round_and_client() {
        assert_eq!(attacked(Attack::Gaussian { sigma: 0.0 }), trained());
        let n = 20_000;
        let big = |client| {
            let mut task = task();
            task.client = client;
            task.dense.tensors[0] = NamedTensor::new("w", vec![n], vec![1.0; n]).unwrap();
            let mut output = trained();
            output.dense.tensors[0] = NamedTensor::new("w", vec![n], vec![3.0; n]).unwrap();
            Attack::Gaussian { sigma: 2.0 }
                .apply(&task, &mut output)
                .unwrap();
            output.dense.tensors[0].data.clone()
        };
        let noisy = big(5);
        // x_c + N(0, 4): mean 3 and standard deviation 2, each within 4 standard errors
        // (2/√n = 0.014 for the mean, about 2/√(2n) = 0.01 for the deviation).
        let mean = noisy.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
        let sd = (noisy
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / (n - 1) as f64)
            .sqrt();
        assert!((mean - 3.0).abs() < 0.06, "{mean}");
        assert!((sd - 2.0).abs() < 0.04, "{sd}");
        assert_eq!(
            noisy,
            big(5),
            "the same (seed, round, client), the same noise"
        );
        assert_ne!(noisy, big(6), "another client, other noise");
    }

    #[test]
    fn an_output_that_is_not_its_tasks_is_refused_not_misread() {
        let mut output = trained();
        output.dense.tensors[0].name = "v".into();
        assert_eq!(
            Attack::SignFlip.apply(&task(), &mut output),
            Err(AttackError::NotInTask("v".into()))
        );
        let mut output = trained();
        output.shards.clear();
        assert_eq!(
            Attack::Scale { factor: 2.0 }.apply(&task(), &mut output),
            Err(AttackError::Shards {
                sent: 1,
                trained: 0
            })
        );
    }

    #[test]
    fn the_attackers_are_an_exact_share_fixed_by_the_seed() {
        let b = Byzantine::new(0.3, Attack::SignFlip).unwrap();
        let chosen = b.clients(1, 20);
        assert_eq!(chosen.len(), 6, "round(0.3 · 20)");
        assert!(chosen.iter().all(|&c| c < 20));
        assert_eq!(chosen, b.clients(1, 20));
        assert_ne!(chosen, b.clients(2, 20));
        // round(0.25 · 10) = 3 (halves round away from zero); the ends of [0, 1].
        assert_eq!(
            Byzantine::new(0.25, Attack::SignFlip)
                .unwrap()
                .clients(1, 10)
                .len(),
            3
        );
        assert!(
            Byzantine::new(0.0, Attack::SignFlip)
                .unwrap()
                .clients(1, 20)
                .is_empty()
        );
        let all = Byzantine::new(1.0, Attack::SignFlip)
            .unwrap()
            .clients(1, 20);
        assert_eq!(all, (0..20).collect());
        // The attack does not change who attacks: the draws depend on the seed alone.
        let scale = Byzantine::new(0.3, Attack::Scale { factor: -4.0 }).unwrap();
        assert_eq!(scale.clients(1, 20), chosen);
    }

    #[test]
    fn bad_parameters_are_refused_naming_their_field() {
        let refused = |share, attack| Byzantine::new(share, attack).unwrap_err().to_string();
        for (share, attack, field) in [
            (1.5, Attack::SignFlip, "faults.byzantine.share"),
            (f64::NAN, Attack::LabelFlip, "faults.byzantine.share"),
            (
                0.3,
                Attack::Scale {
                    factor: f64::INFINITY,
                },
                "faults.byzantine.factor",
            ),
            (
                0.3,
                Attack::Scale { factor: f64::NAN },
                "faults.byzantine.factor",
            ),
            (
                0.3,
                Attack::Gaussian { sigma: -1.0 },
                "faults.byzantine.sigma",
            ),
            (
                0.3,
                Attack::Gaussian {
                    sigma: f64::INFINITY,
                },
                "faults.byzantine.sigma",
            ),
            (
                0.3,
                Attack::Constant { value: 1e300 },
                "faults.byzantine.value",
            ),
        ] {
            let e = refused(share, attack);
            assert!(e.contains(field), "{attack:?} with share {share}: {e}");
        }
        // Serde goes through the same checks, and a parameter of another kind is unknown.
        let parsed = |json| serde_json::from_str::<Byzantine>(json).map_err(|e| e.to_string());
        let e = parsed(r#"{"kind": "gaussian", "share": 0.3, "sigma": -2}"#).unwrap_err();
        assert!(e.contains("faults.byzantine.sigma"), "{e}");
        let e = parsed(r#"{"kind": "scale", "share": 0.3, "sigma": 2}"#).unwrap_err();
        assert!(e.contains("sigma"), "{e}");
        let e = parsed(r#"{"kind": "sign-flip", "share": 0.3, "factor": 2}"#).unwrap_err();
        assert!(e.contains("factor"), "{e}");
        let b = parsed(r#"{"kind": "constant", "share": 0.5, "value": 0.25}"#).unwrap();
        assert_eq!(
            (b.share(), b.attack()),
            (0.5, Attack::Constant { value: 0.25 })
        );
        let back = serde_json::to_string(&b).unwrap();
        assert_eq!(serde_json::from_str::<Byzantine>(&back).unwrap(), b);
    }
}
