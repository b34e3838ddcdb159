//! How the round engine schedules client work ([`Schedule`]): synchronous rounds, over-committed
//! ones (`[federation] over_commit`), buffered asynchronous aggregation (`mode = "async"`,
//! FedBuff) and its staleness weights, and the order in which answers are taken ([`Arrivals`]).

use crate::client::ClientReply;
use crate::clock::{TaskTime, VirtualClock};
use crate::error::Error;
use crate::round::Outcome;
use crate::server::RuntimeConfig;
use fedshard_protocol::task::ClientId;
use fedshard_protocol::task::TrainTask;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::{AbortHandle, JoinSet};

/// What the round engine ([`crate::engine`]) hands out, when an aggregate closes and how an
/// update is weighted; resolved once from the run's configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// Synchronous rounds: the coordinator's selection trains on the round's model, and the
    /// aggregate closes when every participant answered or missed its deadline. With
    /// `over_commit` c, a round asks ⌈c · m⌉ clients and closes at the first ⌊m⌋ accepted
    /// updates ([`crate::coordinator::over_committed`]). Each update weighs what the aggregator
    /// gives it.
    Rounds { over_commit: Option<f64> },
    /// Buffered asynchronous aggregation: idle clients are handed work one at a time, and the
    /// aggregate closes at `buffer` accepted updates, each also weighted by its staleness s(τ).
    Buffered(AsyncConfig),
}

impl Schedule {
    /// The schedule `config` asks for.
    pub fn of(config: &RuntimeConfig) -> Self {
        match config.asynchronous {
            Some(settings) => Schedule::Buffered(settings),
            None => Schedule::Rounds {
                over_commit: config.over_commit,
            },
        }
    }
}

/// The weight s(τ) of an update τ model versions old (FedBuff, Nguyen et al. 2022, Sec. 3):
/// the server applies Σ_i w_i s(τ_i) Δ_i with the aggregator's weights w_i (FedAvg's
/// D_i / Σ D), so stale updates move the model less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Staleness {
    /// s(τ) = 1.
    #[default]
    Constant,
    /// s(τ) = (1 + τ)^(−a).
    Polynomial { a: f64 },
    /// s(τ) = 1 for τ ≤ b, else 1 / (a (τ − b) + 1).
    Hinge { a: f64, b: f64 },
}

impl Staleness {
    /// s(τ).
    pub fn weight(&self, tau: u64) -> f64 {
        let t = tau as f64;
        match *self {
            Staleness::Constant => 1.0,
            Staleness::Polynomial { a } => (1.0 + t).powf(-a),
            Staleness::Hinge { a, b } => {
                if t <= b {
                    1.0
                } else {
                    1.0 / (a * (t - b) + 1.0)
                }
            }
        }
    }

    /// The checks the config runs; the error names the field.
    pub fn validate(&self) -> Result<(), Error> {
        let check = |field, expected, value: f64| {
            if value >= 0.0 && value.is_finite() {
                Ok(())
            } else {
                Err(Error::Invalid {
                    field,
                    expected,
                    found: value.to_string(),
                })
            }
        };
        let number = "a non-negative number";
        match *self {
            Staleness::Constant => Ok(()),
            Staleness::Polynomial { a } => {
                check("federation.staleness.a", "a non-negative exponent", a)
            }
            Staleness::Hinge { a, b } => {
                check("federation.staleness.a", number, a)?;
                check("federation.staleness.b", number, b)
            }
        }
    }
}

/// `[federation] mode = "async"`: `concurrency` clients train at any time and the server
/// applies an aggregate every `buffer` accepted updates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AsyncConfig {
    pub concurrency: usize,
    pub buffer: usize,
    pub staleness: Staleness,
}

/// Answers of dispatched clients in the order the server takes them.
///
/// Without a clock, in the order they come. With one ([`VirtualClock`]), in the order of their
/// simulated arrival (send time + download + compute + upload of the bits the answer really
/// has, ties by client id): the server waits for the earliest one even when another answered
/// first in real time, so which updates a round or a buffer holds, and the order in which they
/// are folded, depend on the seed alone. A simulated clock ([`VirtualClock::is_virtual`]) also
/// applies the deadline in simulated time: an answer that arrives after it is a `timeout`,
/// taken at the deadline, and a client that cannot make it is given up on without waiting for
/// its real answer.
pub struct Arrivals {
    /// Each task's answer with the number it was pushed under.
    set: JoinSet<(ClientId, u64, Outcome)>,
    clock: Option<Arc<VirtualClock>>,
    pending: BTreeMap<ClientId, Sent>,
    /// Answers that came before their turn.
    early: BTreeMap<ClientId, Outcome>,
    /// The simulated time of the last answer taken (or of the start).
    now: f64,
    /// Tasks pushed so far: a client given up on and handed a new task (async mode) must not
    /// have its old task's answer taken for the new one's.
    pushed: u64,
}

/// A task in flight under a clock.
#[derive(Debug)]
struct Sent {
    start: f64,
    /// Its time without the upload of the answer.
    before: TaskTime,
    /// When the server stops waiting for it, in simulated time (infinite on the wall clock).
    deadline: f64,
    /// Its number among the tasks pushed.
    number: u64,
    work: AbortHandle,
}

/// An answer as the server takes it.
#[derive(Debug)]
pub struct Arrival {
    pub client: ClientId,
    pub outcome: Outcome,
    /// Where the task spent its simulated time (with a clock).
    pub time: Option<TaskTime>,
}

impl Arrivals {
    /// `clock`: the cost model, or `None` for real order; `now`: the simulated time the tasks
    /// pushed next are sent at.
    pub fn new(clock: Option<Arc<VirtualClock>>, now: f64) -> Self {
        Self {
            set: JoinSet::new(),
            clock,
            pending: BTreeMap::new(),
            early: BTreeMap::new(),
            now,
            pushed: 0,
        }
    }

    /// The simulated time of the last answer taken.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// The simulated time `client` needs for `task` of `bits` on the downlink (`None`: an
    /// upload request) before its answer's upload, with a clock.
    pub fn cost(&self, client: ClientId, task: Option<(&TrainTask, u64)>) -> Option<TaskTime> {
        self.clock
            .as_ref()
            .map(|clock| clock.before_upload(client, task))
    }

    /// The simulated time `client` needs for `message`, which asks for no training (a step of
    /// a secure round), before its answer's upload, with a clock (the message is measured only
    /// then).
    pub fn message_cost(
        &self,
        client: ClientId,
        message: &impl serde::Serialize,
    ) -> Option<TaskTime> {
        self.clock.as_ref().map(|clock| {
            let bits = 8 * fedshard_secagg::wire::encode(message).len() as u64;
            clock.before_message_answer(client, bits)
        })
    }

    /// Starts waiting for `client`'s answer, which `work` produces, the task having cost
    /// [`Arrivals::cost`]; under a simulated clock the server gives up after `deadline`.
    pub fn push(
        &mut self,
        client: ClientId,
        cost: Option<TaskTime>,
        deadline: Duration,
        work: impl std::future::Future<Output = Outcome> + Send + 'static,
    ) {
        self.pushed += 1;
        let number = self.pushed;
        let work = self.set.spawn(async move { (client, number, work.await) });
        if let (Some(clock), Some(before)) = (&self.clock, cost) {
            let sent = Sent {
                number,
                start: self.now,
                before,
                deadline: if clock.is_virtual() {
                    self.now + deadline.as_secs_f64()
                } else {
                    f64::INFINITY
                },
                work,
            };
            self.pending.insert(client, sent);
        }
    }

    /// The next answer, `None` when nothing is pending.
    pub async fn next(&mut self) -> Option<Arrival> {
        let Some(clock) = self.clock.clone() else {
            return loop {
                match self.set.join_next().await? {
                    Ok((client, _, outcome)) => {
                        break Some(Arrival {
                            client,
                            outcome,
                            time: None,
                        });
                    }
                    // A waiting task only ends by being aborted: skip it.
                    Err(_) => continue,
                }
            };
        };
        loop {
            // Each pending task's arrival: exact once its answer is in, else a lower bound
            // (its upload takes at least the latency); capped by its deadline.
            let (client, at, resolved) = self
                .pending
                .iter()
                .map(|(client, sent)| {
                    let ready = sent.start + sent.before.total();
                    match self.early.get(client) {
                        Some(outcome) => {
                            let up = clock.upload(*client, answer_bits(outcome));
                            (*client, (ready + up).min(sent.deadline), true)
                        }
                        None => {
                            let lower = ready + clock.latency;
                            (*client, lower.min(sent.deadline), lower >= sent.deadline)
                        }
                    }
                })
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))?;
            if !resolved {
                match self.set.join_next().await {
                    Some(Ok((id, number, outcome))) => {
                        // Only the answer to the task pending for that client.
                        if self.pending.get(&id).is_some_and(|p| p.number == number) {
                            self.early.insert(id, outcome);
                        }
                    }
                    Some(Err(_)) => {}
                    None => {
                        // Every real answer is in: what is missing was lost.
                        self.early
                            .insert(client, Outcome::Unreachable("the answer was lost".into()));
                    }
                }
                continue;
            }
            let sent = self.pending.remove(&client)?;
            self.now = self.now.max(at);
            let answered = self.early.remove(&client);
            if answered.is_none() {
                // Given up on in simulated time: its real answer must not be taken for the
                // answer to a later task of the same client.
                sent.work.abort();
            }
            // In time when the answer arrives by the deadline; given up on (no answer yet, its
            // arrival's lower bound past the deadline) is a timeout.
            let upload = answered
                .as_ref()
                .map(|outcome| clock.upload(client, answer_bits(outcome)));
            let (outcome, upload) = match (answered, upload) {
                (Some(outcome), Some(up))
                    if sent.start + sent.before.total() + up <= sent.deadline =>
                {
                    (outcome, up)
                }
                _ => (Outcome::Timeout, 0.0),
            };
            let time = TaskTime {
                upload,
                ..sent.before
            };
            return Some(Arrival {
                client,
                outcome,
                time: Some(time),
            });
        }
    }

    /// Stops waiting for every pending answer: the clients may still be training, and what
    /// they send is dropped.
    pub fn abandon(&mut self) {
        self.set.abort_all();
        self.pending.clear();
        self.early.clear();
    }
}

/// The bits of an answer on the uplink: an update's payload; any other answer is a few bytes.
fn answer_bits(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::Reply(ClientReply::Update(envelope)) => envelope.payload.bits,
        Outcome::Reply(ClientReply::Secure { message, .. }) => {
            8 * fedshard_secagg::wire::encode(message).len() as u64
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ClientCost, ClockKind};

    #[test]
    fn staleness_weights_match_hand_computed_values() {
        assert_eq!(Staleness::Constant.weight(7), 1.0);
        let p = Staleness::Polynomial { a: 0.5 };
        assert_eq!(p.weight(0), 1.0);
        // (1 + 3)^(−½) = ½.
        assert_eq!(p.weight(3), 0.5);
        // (1 + 8)^(−½) = ⅓.
        assert!((p.weight(8) - 1.0 / 3.0).abs() < 1e-15);
        let h = Staleness::Hinge { a: 10.0, b: 4.0 };
        assert_eq!(h.weight(0), 1.0);
        assert_eq!(h.weight(4), 1.0);
        // 1 / (10 · (5 − 4) + 1) = 1/11.
        assert_eq!(h.weight(5), 1.0 / 11.0);
        // 1 / (10 · (7 − 4) + 1) = 1/31.
        assert_eq!(h.weight(7), 1.0 / 31.0);
        assert!(Staleness::Polynomial { a: -1.0 }.validate().is_err());
        assert!(
            Staleness::Hinge {
                a: 1.0,
                b: f64::NAN
            }
            .validate()
            .unwrap_err()
            .to_string()
            .contains("federation.staleness.b")
        );
    }

    fn reply(client: ClientId) -> Outcome {
        Outcome::Reply(ClientReply::Failed {
            client,
            reason: String::new(),
            panicked: false,
        })
    }

    /// A clock whose clients take `fixed` seconds each, on links that take no time.
    fn clock(kind: ClockKind, fixed: &[(ClientId, f64)]) -> Arc<VirtualClock> {
        let clients = fixed
            .iter()
            .map(|&(id, seconds)| {
                let cost = ClientCost {
                    samples: 1,
                    fixed_seconds: seconds,
                    seconds_per_sample: 0.0,
                    seconds_per_step: 0.0,
                    uplink_bps: f64::INFINITY,
                    downlink_bps: f64::INFINITY,
                };
                (id, cost)
            })
            .collect();
        Arc::new(VirtualClock {
            kind,
            clients,
            latency: 0.0,
            work: Default::default(),
            faults: None,
        })
    }

    fn push(arrivals: &mut Arrivals, id: ClientId, wait_ms: u64, deadline: Duration) {
        let cost = arrivals.cost(id, Some((&task(id), 0)));
        arrivals.push(id, cost, deadline, async move {
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            reply(id)
        });
    }

    fn task(client: ClientId) -> TrainTask {
        TrainTask {
            round: 1,
            client,
            seed: 1,
            dense: Default::default(),
            width: None,
            shards: vec![],
            recipe: Default::default(),
            uplink: Default::default(),
            variates: None,
        }
    }

    /// Client 1 answers first in real time, but its simulated duration is the longest: with the
    /// clock it is taken last, then ties go by client id.
    #[tokio::test]
    async fn with_a_clock_answers_come_in_virtual_time_order() {
        let clock = clock(ClockKind::Wall, &[(1, 0.9), (2, 0.1), (3, 0.1)]);
        let mut arrivals = Arrivals::new(Some(clock), 0.0);
        for (id, wait) in [(1, 0), (2, 30), (3, 10)] {
            push(&mut arrivals, id, wait, Duration::from_millis(1));
        }
        let mut order = vec![];
        while let Some(arrival) = arrivals.next().await {
            order.push(arrival.client);
            assert!(
                matches!(arrival.outcome, Outcome::Reply(_)),
                "no deadline on the wall clock's order"
            );
        }
        assert_eq!(order, vec![2, 3, 1]);
        assert_eq!(arrivals.now(), 0.9);

        let mut real = Arrivals::new(None, 0.0);
        for (id, wait) in [(1, 0), (2, 60)] {
            push(&mut real, id, wait, Duration::from_secs(1));
        }
        assert_eq!(real.next().await.map(|a| a.client), Some(1));
    }

    /// Under simulated time the deadline is simulated: client 1 (5 s) misses a 2 s deadline and
    /// is a timeout taken at 2 s, without waiting for its real answer, which never comes.
    #[tokio::test]
    async fn a_simulated_deadline_gives_up_without_waiting_for_the_real_answer() {
        let clock = clock(ClockKind::Virtual, &[(1, 5.0), (2, 1.0)]);
        let mut arrivals = Arrivals::new(Some(clock), 10.0);
        let cost = arrivals.cost(1, Some((&task(1), 0)));
        arrivals.push(1, cost, Duration::from_secs(2), std::future::pending());
        push(&mut arrivals, 2, 50, Duration::from_secs(2));
        let first = arrivals.next().await.unwrap();
        assert_eq!((first.client, arrivals.now()), (2, 11.0));
        let second = arrivals.next().await.unwrap();
        assert_eq!(second.client, 1);
        assert!(matches!(second.outcome, Outcome::Timeout));
        assert_eq!(arrivals.now(), 12.0);
        assert_eq!(second.time.unwrap().compute, 5.0);
        assert!(arrivals.next().await.is_none());
    }
}
