//! How the round engine schedules client work ([`Schedule`]): synchronous rounds, over-committed
//! ones (`[federation] over_commit`), buffered asynchronous aggregation (`mode = "async"`,
//! FedBuff) and its staleness weights, and the order in which answers are taken ([`Arrivals`]).

use crate::error::Error;
use crate::round::Outcome;
use crate::server::RuntimeConfig;
use fedshard_protocol::task::ClientId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tokio::task::JoinSet;

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
/// Without a clock, in the order they come. With one (each client's simulated task duration,
/// from the fault injector's stragglers), in the order of their virtual finish times
/// (dispatch time + duration, ties by client id): the server waits for the earliest one even
/// when another answered first in real time, so which updates a round or a buffer holds, and
/// the order in which they are folded, depend on the seed alone.
pub struct Arrivals {
    set: JoinSet<(ClientId, Outcome)>,
    clock: Option<BTreeMap<ClientId, u64>>,
    /// Virtual finish time of each pending client (with a clock).
    pending: BTreeSet<(u64, ClientId)>,
    /// Answers that came before their turn.
    early: BTreeMap<ClientId, Outcome>,
    /// The virtual time of the last answer taken.
    now: u64,
}

impl Arrivals {
    /// `clock`: each client's simulated duration in microseconds, or `None` for real order.
    pub fn new(clock: Option<BTreeMap<ClientId, u64>>) -> Self {
        Self {
            set: JoinSet::new(),
            clock,
            pending: BTreeSet::new(),
            early: BTreeMap::new(),
            now: 0,
        }
    }

    /// Starts waiting for `client`'s answer, which `work` produces.
    pub fn push(
        &mut self,
        client: ClientId,
        work: impl std::future::Future<Output = Outcome> + Send + 'static,
    ) {
        if let Some(clock) = &self.clock {
            let finish = self.now + clock.get(&client).copied().unwrap_or(0);
            self.pending.insert((finish, client));
        }
        self.set.spawn(async move { (client, work.await) });
    }

    /// The next answer, `None` when nothing is pending.
    pub async fn next(&mut self) -> Option<(ClientId, Outcome)> {
        if self.clock.is_none() {
            return loop {
                match self.set.join_next().await? {
                    Ok(answer) => break Some(answer),
                    // A waiting task only ends by being aborted: skip it.
                    Err(_) => continue,
                }
            };
        }
        let &(finish, client) = self.pending.first()?;
        while !self.early.contains_key(&client) {
            match self.set.join_next().await {
                Some(Ok((id, outcome))) => {
                    self.early.insert(id, outcome);
                }
                Some(Err(_)) => continue,
                None => break,
            }
        }
        self.pending.remove(&(finish, client));
        self.now = self.now.max(finish);
        let outcome = self
            .early
            .remove(&client)
            .unwrap_or_else(|| Outcome::Unreachable("the answer was lost".into()));
        Some((client, outcome))
    }

    /// Stops waiting for every pending answer: the clients may still be training, and what
    /// they send is dropped.
    pub fn abandon(&mut self) {
        self.set.abort_all();
        self.pending.clear();
        self.early.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientReply;
    use std::time::Duration;

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

    /// Client 1 answers first in real time, but its simulated duration is the longest: with the
    /// clock it is taken last, then ties go by client id.
    #[tokio::test]
    async fn with_a_clock_answers_come_in_virtual_time_order() {
        let clock = BTreeMap::from([(1, 900), (2, 100), (3, 100)]);
        let mut arrivals = Arrivals::new(Some(clock));
        for (id, wait) in [(1, 0), (2, 30), (3, 10)] {
            arrivals.push(id, async move {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                reply(id)
            });
        }
        let mut order = vec![];
        while let Some((id, _)) = arrivals.next().await {
            order.push(id);
        }
        assert_eq!(order, vec![2, 3, 1]);

        let mut real = Arrivals::new(None);
        for (id, wait) in [(1, 0), (2, 60)] {
            real.push(id, async move {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                reply(id)
            });
        }
        assert_eq!(real.next().await.map(|a| a.0), Some(1));
    }
}
