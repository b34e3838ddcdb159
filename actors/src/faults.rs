//! Deterministic fault injection, so failure handling is exercised by real runs and tests: a
//! [`FaultyTrainer`] wraps a client's trainer and, in a fraction of (round, client) pairs drawn
//! from the stream (seed, round, client, Experiment), fails in one of the configured ways.
//!
//! It also makes clients slow ([`Stragglers`]): each client gets a fixed slow-down factor
//! f_c ≥ 1 from the seed, and every task it trains takes f_c times as long as it really did
//! (plus f_c times a simulated `base_delay_ms`), so rounds that do not wait for the slowest
//! client can be measured against rounds that do.
//!
//! And it makes a fixed share of the clients malicious ([`byzantine`]): each of them alters
//! every update it trains before sending it, so robust aggregation can be tested.

pub mod byzantine;

use crate::error::Error;
use byzantine::{Attack, Byzantine};
use fedshard_protocol::task::{
    BoxError, ClientId, LocalTrainer, TrainError, TrainOutput, TrainTask,
};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
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
    /// The client trains, then leaves before its update is sent: in a plain round it fails, in
    /// a secure round it leaves the session after sharing its keys, so the server must remove
    /// its masks with the others' shares.
    Dropout,
}

/// Which faults to inject and how often.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPlan {
    /// Probability that a client fails in a given round (default 0: a plan may only slow
    /// clients down).
    #[serde(default)]
    pub rate: f64,
    /// The kinds, chosen uniformly among these when a fault happens.
    #[serde(default)]
    pub kinds: Vec<FaultKind>,
    /// How long a `timeout` fault sleeps (longer than the round deadline).
    #[serde(with = "millis", rename = "delay_ms", default)]
    pub delay: Duration,
    /// Slow clients (`[faults.stragglers]`); none by default.
    #[serde(default)]
    pub stragglers: Option<Stragglers>,
    /// Malicious clients (`[faults.byzantine]`); none by default.
    #[serde(default)]
    pub byzantine: Option<Byzantine>,
}

/// Which clients are slow and by how much. Each client's factor is fixed for the whole run and
/// drawn from the seed alone, so a node hosting a client (`fedshard join`) slows it exactly as
/// the in-process run does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Stragglers {
    /// round(share · N) clients, chosen by the seed, are `factor` times slower; the others run
    /// at their own speed.
    Share {
        share: f64,
        factor: f64,
        /// A simulated training time added to every task before scaling (default 0).
        #[serde(default)]
        base_delay_ms: u64,
    },
    /// Every client is exp(σ·|z|) times slower, z ~ N(0, 1) per client (a lognormal factor
    /// folded at 1, so nobody runs faster than it can; median exp(0.674 σ)).
    Lognormal {
        sigma: f64,
        #[serde(default)]
        base_delay_ms: u64,
    },
}

/// The stream slot of the straggler draws: `round` = this, client = the client's index.
/// Rounds start at 1 and fault draws use (seed, round, client), so no fault draw shares it.
const STRAGGLER_ROUND: u64 = u64::MAX;

impl Stragglers {
    /// The simulated training time added to every task, before scaling.
    pub fn base_delay(&self) -> Duration {
        match self {
            Stragglers::Share { base_delay_ms, .. }
            | Stragglers::Lognormal { base_delay_ms, .. } => Duration::from_millis(*base_delay_ms),
        }
    }

    /// The slow-down factor f_c ≥ 1 of every client `0..clients`, deterministic under `seed`.
    pub fn factors(&self, seed: u64, clients: usize) -> Vec<f64> {
        let mut draws: Vec<f64> = (0..clients as u64)
            .map(|c| uniform(&mut stream(seed, STRAGGLER_ROUND, c, Purpose::Experiment)))
            .collect();
        match *self {
            Stragglers::Share { share, factor, .. } => {
                // The exact share: the round(share · N) clients with the smallest draws.
                let slow = ((share * clients as f64).round() as usize).min(clients);
                let mut order: Vec<usize> = (0..clients).collect();
                order.sort_by(|&a, &b| draws[a].total_cmp(&draws[b]).then(a.cmp(&b)));
                let mut f = vec![1.0; clients];
                for &c in &order[..slow] {
                    f[c] = factor;
                }
                f
            }
            Stragglers::Lognormal { sigma, .. } => {
                for (c, d) in draws.iter_mut().enumerate() {
                    // Box–Muller with the client's own second draw.
                    let mut rng = stream(seed, STRAGGLER_ROUND, c as u64, Purpose::Experiment);
                    let (u1, u2) = (uniform(&mut rng), uniform(&mut rng));
                    let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                    *d = (sigma * z.abs()).exp();
                }
                draws
            }
        }
    }

    /// The checks the config runs on this table: the error names the field.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |field, expected, found: f64| {
            Err(Error::Invalid {
                field,
                expected,
                found: found.to_string(),
            })
        };
        match *self {
            Stragglers::Share { share, factor, .. } => {
                if !(0.0..=1.0).contains(&share) {
                    return bad("faults.stragglers.share", "a share in [0, 1]", share);
                }
                if !(factor >= 1.0 && factor.is_finite()) {
                    return bad(
                        "faults.stragglers.factor",
                        "a slow-down factor of at least 1",
                        factor,
                    );
                }
            }
            Stragglers::Lognormal { sigma, .. } => {
                if !(sigma >= 0.0 && sigma.is_finite()) {
                    return bad("faults.stragglers.sigma", "a non-negative number", sigma);
                }
            }
        }
        Ok(())
    }
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

    /// The byzantine clients among `0..clients` ([`Byzantine::clients`]); none without
    /// `[faults.byzantine]`. The server records how many of them each aggregate took in.
    pub fn byzantine_clients(&self, seed: u64, clients: usize) -> BTreeSet<ClientId> {
        self.byzantine
            .map(|b| b.clients(seed, clients))
            .unwrap_or_default()
    }
}

/// A trainer that fails as its [`FaultPlan`] says and otherwise defers to the wrapped one,
/// taking `slowdown` times as long (see [`Stragglers`]) and, for a byzantine client, sending
/// what its `attack` makes of the trained update.
pub struct FaultyTrainer {
    pub inner: Arc<dyn LocalTrainer>,
    pub plan: FaultPlan,
    /// This client's factor f_c ≥ 1 ([`Stragglers::factors`]); 1 without stragglers.
    pub slowdown: f64,
    /// This client's attack when it is one of the plan's byzantine clients
    /// ([`Byzantine::clients`]); `None` for an honest client.
    pub attack: Option<Attack>,
    /// The time the calling thread computed since the last call (the training crate's
    /// `slots::take_held`), zero for a trainer that does not run on the core pool: the slow-down
    /// stretches computation, not the time a client waited for one of this machine's cores,
    /// which a slow device of its own would not have waited.
    pub computed: fn() -> Duration,
    /// Whether slow-downs and `timeout` faults really sleep; under simulated time
    /// ([`crate::clock`]) they cost simulated time instead.
    pub sleeps: bool,
}

impl FaultyTrainer {
    /// Wraps every trainer of `trainers` (client ids are their indices among `clients`) with
    /// `plan`, each with its own slow-down factor and, for the plan's byzantine clients, its
    /// attack: both depend on the seed and `clients` alone, so a node hosting some of the
    /// clients wraps them as a process hosting all of them does.
    pub fn wrap_all(
        trainers: &mut std::collections::BTreeMap<ClientId, Arc<dyn LocalTrainer>>,
        plan: &FaultPlan,
        seed: u64,
        clients: usize,
        computed: fn() -> Duration,
        sleeps: bool,
    ) {
        let factors = plan
            .stragglers
            .as_ref()
            .map(|s| s.factors(seed, clients))
            .unwrap_or_default();
        let attackers = plan.byzantine_clients(seed, clients);
        for (id, trainer) in trainers.iter_mut() {
            *trainer = Arc::new(FaultyTrainer {
                inner: trainer.clone(),
                plan: plan.clone(),
                slowdown: factors.get(*id as usize).copied().unwrap_or(1.0),
                attack: plan
                    .byzantine
                    .filter(|_| attackers.contains(id))
                    .map(|b| b.attack()),
                computed,
                sleeps,
            });
        }
    }

    /// Sleeps so that a task that trained for `trained` took f_c · (trained + base delay).
    fn straggle(&self, trained: Duration) {
        let base = self
            .plan
            .stragglers
            .as_ref()
            .map_or(Duration::ZERO, Stragglers::base_delay);
        let total = (trained + base).mul_f64(self.slowdown.max(1.0));
        if let Some(extra) = total.checked_sub(trained)
            && !extra.is_zero()
        {
            std::thread::sleep(extra);
        }
    }
}

impl LocalTrainer for FaultyTrainer {
    fn samples(&self) -> u64 {
        self.inner.samples()
    }

    fn drops_out(&self, task: &TrainTask) -> bool {
        self.plan.fault(task.seed, task.round, task.client) == Some(FaultKind::Dropout)
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
        self.train_then(task, &mut |_| Ok(()))
    }

    /// Fails, attacks, corrupts or slows the task as the plan says. An attack, then a
    /// corruption, is applied before `finish`, so the client sends the altered update whichever
    /// way the wrapped trainer trained it (alone, or in a cohort with other clients' tasks:
    /// every trainer runs `finish` on its own output); the slow-down stretches the training and
    /// `finish` both, as a slow device would.
    fn train_then(
        &self,
        task: &TrainTask,
        finish: &mut (dyn FnMut(&mut TrainOutput) -> Result<(), BoxError> + Send),
    ) -> Result<TrainOutput, TrainError> {
        let fault = self.plan.fault(task.seed, task.round, task.client);
        match fault {
            Some(FaultKind::Error) => return Err(TrainError::Injected),
            Some(FaultKind::Panic) => panic!("injected panic in client {}", task.client),
            Some(FaultKind::Timeout) if self.sleeps => std::thread::sleep(self.plan.delay),
            _ => {}
        }
        let _ = (self.computed)();
        let started = std::time::Instant::now();
        let done = self.inner.train_then(task, &mut |output| {
            if let Some(attack) = &self.attack {
                attack.apply(task, output)?;
            }
            corrupt(output, fault)?;
            finish(output)
        });
        // A trainer that queued for a core reports the time it held one; any other computed
        // from start to end.
        let computed = Some((self.computed)())
            .filter(|held| !held.is_zero())
            .unwrap_or_else(|| started.elapsed());
        if self.sleeps {
            self.straggle(computed);
        }
        done
    }
}

/// Applies `fault` to a trained output, if it is one that corrupts outputs.
fn corrupt(output: &mut TrainOutput, fault: Option<FaultKind>) -> Result<(), String> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::model::{ModelState, NamedTensor};

    /// Trains instantly: one dense value, 0.
    struct Instant1;

    impl LocalTrainer for Instant1 {
        fn samples(&self) -> u64 {
            1
        }
        fn train(&self, _: &TrainTask) -> Result<TrainOutput, TrainError> {
            Ok(TrainOutput {
                dense: ModelState {
                    tensors: vec![NamedTensor::zeros("w", vec![1])],
                },
                shards: vec![],
                loss: 0.0,
                control: None,
            })
        }
    }

    #[test]
    fn the_finish_sees_the_corrupted_output_and_is_slowed_down_with_the_training() {
        let faulty = FaultyTrainer {
            inner: Arc::new(Instant1),
            plan: FaultPlan {
                rate: 1.0,
                kinds: vec![FaultKind::NonFinite],
                delay: Duration::ZERO,
                stragglers: None,
                byzantine: None,
            },
            slowdown: 3.0,
            attack: None,
            computed: || Duration::ZERO,
            sleeps: true,
        };
        let task = TrainTask {
            round: 1,
            client: 0,
            seed: 7,
            dense: ModelState::default(),
            width: None,
            shards: vec![],
            recipe: Default::default(),
            uplink: Default::default(),
            variates: None,
        };
        let mut seen = None;
        let started = std::time::Instant::now();
        let output = faulty
            .train_then(&task, &mut |output| {
                seen = Some(output.dense.tensors[0].data[0]);
                std::thread::sleep(Duration::from_millis(40));
                Ok(())
            })
            .expect("a non-finite fault still returns the output");
        // The encoder must see what the client sends: the corrupted value.
        assert!(seen.is_some_and(f32::is_nan), "finish saw {seen:?}");
        assert!(output.dense.tensors[0].data[0].is_nan());
        // f_c = 3 stretches the 40 ms of finishing (encoding) to at least 120 ms.
        assert!(
            started.elapsed() >= Duration::from_millis(120),
            "{:?}",
            started.elapsed()
        );
    }

    /// Trains the way a cohort does: the output comes from elsewhere than `train` (which a
    /// cohort never calls), and `finish` runs on it afterwards.
    struct InACohort;

    impl LocalTrainer for InACohort {
        fn samples(&self) -> u64 {
            1
        }
        fn train(&self, _: &TrainTask) -> Result<TrainOutput, TrainError> {
            Err(TrainError::Injected)
        }
        fn train_then(
            &self,
            task: &TrainTask,
            finish: &mut (dyn FnMut(&mut TrainOutput) -> Result<(), BoxError> + Send),
        ) -> Result<TrainOutput, TrainError> {
            let mut output = Instant1.train(task)?;
            output.dense.tensors[0].data[0] = 2.0;
            finish(&mut output).map_err(TrainError::Finish)?;
            Ok(output)
        }
    }

    fn task(client: ClientId) -> TrainTask {
        TrainTask {
            round: 1,
            client,
            seed: 7,
            dense: ModelState {
                tensors: vec![NamedTensor::zeros("w", vec![1])],
            },
            width: None,
            shards: vec![],
            recipe: Default::default(),
            uplink: Default::default(),
            variates: None,
        }
    }

    fn byzantine_plan(attack: byzantine::Attack) -> FaultPlan {
        FaultPlan {
            rate: 0.0,
            kinds: vec![],
            delay: Duration::ZERO,
            stragglers: None,
            byzantine: Some(Byzantine::new(0.3, attack).unwrap()),
        }
    }

    /// The value client `id` sends (w trained to `trained`, sent as 0), wrapped by `plan`
    /// among `clients` with `hosted` in this process.
    fn sent_by(
        plan: &FaultPlan,
        inner: Arc<dyn LocalTrainer>,
        hosted: &[ClientId],
    ) -> std::collections::BTreeMap<ClientId, f32> {
        let mut trainers = hosted.iter().map(|&id| (id, inner.clone())).collect();
        FaultyTrainer::wrap_all(&mut trainers, plan, 7, 20, || Duration::ZERO, false);
        trainers
            .iter()
            .map(|(&id, t)| {
                let mut seen = None;
                let output = t
                    .train_then(&task(id), &mut |o| {
                        seen = Some(o.dense.tensors[0].data[0]);
                        Ok(())
                    })
                    .expect("trains");
                assert_eq!(
                    seen,
                    Some(output.dense.tensors[0].data[0]),
                    "finish sees it"
                );
                (id, output.dense.tensors[0].data[0])
            })
            .collect()
    }

    #[test]
    fn the_byzantine_clients_attack_wherever_they_are_hosted_and_however_they_train() {
        let plan = byzantine_plan(byzantine::Attack::Scale { factor: -3.0 });
        let attackers = plan.byzantine_clients(7, 20);
        assert_eq!(attackers.len(), 6);
        let all: Vec<ClientId> = (0..20).collect();
        // In a cohort the trained w is 2: an attacker sends 0 − 3 · (2 − 0) = −6.
        let in_process = sent_by(&plan, Arc::new(InACohort), &all);
        for (id, &x) in &in_process {
            let expected = if attackers.contains(id) { -6.0 } else { 2.0 };
            assert_eq!(x, expected, "client {id}");
        }
        // A node hosting a few of the clients (an attacker among them) attacks with the same.
        let node: Vec<ClientId> = vec![attackers.first().copied().unwrap(), 4, 13];
        let on_node = sent_by(&plan, Arc::new(InACohort), &node);
        for (id, x) in &on_node {
            assert_eq!(*x, in_process[id], "client {id} on a node");
        }
        // Trained alone (w stays 0), a constant attacker sends its constant.
        let plan = byzantine_plan(byzantine::Attack::Constant { value: 1.5 });
        for (id, x) in sent_by(&plan, Arc::new(Instant1), &all) {
            assert_eq!(x, if attackers.contains(&id) { 1.5 } else { 0.0 });
        }
    }

    #[test]
    fn a_share_of_stragglers_is_exact_fixed_by_the_seed_and_changes_with_it() {
        let s = Stragglers::Share {
            share: 0.3,
            factor: 5.0,
            base_delay_ms: 0,
        };
        let f = s.factors(1, 20);
        assert_eq!(f.iter().filter(|&&x| x == 5.0).count(), 6);
        assert_eq!(f.iter().filter(|&&x| x == 1.0).count(), 14);
        assert_eq!(f, s.factors(1, 20));
        assert_ne!(f, s.factors(2, 20));
    }

    #[test]
    fn lognormal_factors_are_at_least_one_and_spread_with_sigma() {
        let s = Stragglers::Lognormal {
            sigma: 1.0,
            base_delay_ms: 0,
        };
        let f = s.factors(3, 1000);
        assert!(f.iter().all(|&x| x >= 1.0));
        // The median of exp(|z|) is exp(0.674…) ≈ 1.96.
        let mut sorted = f.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[500];
        assert!((median - 1.963).abs() < 0.15, "{median}");
        let none = Stragglers::Lognormal {
            sigma: 0.0,
            base_delay_ms: 0,
        };
        assert!(none.factors(3, 10).iter().all(|&x| x == 1.0));
    }

    #[test]
    fn bad_straggler_tables_name_their_field() {
        let e = Stragglers::Share {
            share: 1.5,
            factor: 5.0,
            base_delay_ms: 0,
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("faults.stragglers.share"), "{e}");
        let e = Stragglers::Share {
            share: 0.5,
            factor: 0.5,
            base_delay_ms: 0,
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("faults.stragglers.factor"), "{e}");
        let plan: FaultPlan = serde_json::from_str(
            r#"{"stragglers": {"kind": "share", "share": 0.3, "factor": 5.0, "base_delay_ms": 20}}"#,
        )
        .unwrap();
        assert_eq!((plan.rate, plan.kinds.len()), (0.0, 0));
        assert_eq!(
            plan.stragglers.unwrap().base_delay(),
            Duration::from_millis(20)
        );
    }
}
