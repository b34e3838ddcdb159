//! Asking clients and taking their answers: the one home of answer collection for every
//! schedule. A phase hands out its asks ([`ServerState::dispatch`]: under the deadline, on the
//! run's clock, closing early when an over-committed phase has enough) and takes what came back
//! ([`ServerState::take_answers`]: sorted, counted, opened and checked against the tasks, and
//! each failure reported), whether it is a synchronous round's training or upload
//! ([`crate::synchronous`]), an asynchronous answer ([`crate::asynchronous`]) or a secure
//! round's training and exchanges ([`crate::secure`]).

use crate::client::{AfterTraining, ClientMsg};
use crate::clock::TaskTime;
use crate::coordinator::CoordinatorMsg;
use crate::host::{ClientHandle, HostMsg};
use crate::round::{
    Accepted, Classified, ClientFailure, Expect, Outcome, Tally, classify, validate,
};
use crate::schedule::Arrivals;
use crate::secure::SecureStep;
use crate::server::ServerState;
use fedshard_protocol::task::{ClientId, TrainTask};
use std::collections::BTreeMap;
use std::time::Duration;

/// A phase's answers, taken: sorted, with the updates that passed every check.
#[derive(Debug)]
pub(crate) struct Taken {
    /// The sorted answers; the updates' envelopes are in `accepted` once opened.
    pub(crate) answers: Classified,
    /// The updates that may touch the model, ascending by client.
    pub(crate) accepted: Vec<Accepted>,
}

impl ServerState {
    /// Sends every task at simulated time `start` and waits for the replies until the
    /// deadline. With `close = (n, counts)`, stops at the n-th answer that `counts` and returns
    /// the clients still training as late (their answers are dropped).
    pub(crate) async fn dispatch(
        &self,
        messages: Vec<(ClientId, Ask)>,
        bits: &BTreeMap<ClientId, u64>,
        (round, start): (u64, f64),
        close: Option<(usize, &Counts<'_>)>,
    ) -> Dispatched {
        let deadline = self.fed.config.deadline;
        let mut arrivals = Arrivals::new(self.clock.clone(), start);
        let mut asked = Vec::new();
        for (id, ask) in messages {
            let Some(client) = self.clients.get(&id).cloned() else {
                continue;
            };
            asked.push(id);
            let cost = match &ask {
                Ask::Secure(step) => arrivals.message_cost(id, step),
                _ => {
                    let sent = ask.task().map(|t| (t, bits.get(&id).copied().unwrap_or(0)));
                    arrivals.cost(id, sent)
                }
            };
            let work = call_client(client, ask, round, self.wall_deadline());
            arrivals.push(id, cost, deadline, work);
        }
        let mut outcomes = BTreeMap::new();
        let mut times = BTreeMap::new();
        let mut counted = 0;
        while let Some(arrival) = arrivals.next().await {
            let id = arrival.client;
            if let Some(time) = arrival.time {
                times.insert(id, time);
            }
            if let Some((n, counts)) = close {
                counted += usize::from(counts(id, &arrival.outcome));
                outcomes.insert(id, arrival.outcome);
                if counted >= n {
                    break;
                }
            } else {
                outcomes.insert(id, arrival.outcome);
            }
        }
        let end = arrivals.now();
        arrivals.abandon();
        let late = asked
            .into_iter()
            .filter(|id| !outcomes.contains_key(id))
            .collect();
        Dispatched {
            outcomes,
            late,
            times,
            end,
        }
    }

    /// Takes the answers of the clients in `asked` to a phase that `expect`s one kind of answer:
    /// sorts the outcomes ([`classify`]), counts them into `tally` (each update's and each
    /// secure message's bits, each failure's kind), opens and checks each update against its
    /// task in `tasks` ([`validate`]: nothing touches the model before), counts the rejections,
    /// and tells the coordinator of each failed client, with one warning that says why.
    pub(crate) fn take_answers(
        &self,
        version: u64,
        asked: &[ClientId],
        outcomes: BTreeMap<ClientId, Outcome>,
        (expect, tasks): (Expect, &BTreeMap<ClientId, TrainTask>),
        tally: &mut Tally,
    ) -> Taken {
        let mut answers = classify(asked.iter().copied(), outcomes, expect);
        tally.answers(&answers);
        for (id, message) in &answers.secure {
            let bits = 8 * fedshard_secagg::wire::encode(message).len() as u64;
            *tally.client_uplink_bits.entry(*id).or_default() += bits;
        }
        let envelopes = std::mem::take(&mut answers.envelopes);
        let validated = validate(&envelopes, tasks, self.fed.config.max_update_norm);
        tally.rejected(&validated);
        self.count_failures(version, asked.len(), &answers.failures);
        Taken {
            answers,
            accepted: validated.accepted,
        }
    }

    /// Tells the coordinator of every failed client, with one warning that says why.
    fn count_failures(
        &self,
        version: u64,
        asked: usize,
        failures: &BTreeMap<ClientId, ClientFailure>,
    ) {
        if failures.is_empty() {
            return;
        }
        log_failures(version, asked, failures);
        for id in failures.keys() {
            let _ = self
                .coordinator
                .cast(CoordinatorMsg::CountFailure { client: *id });
        }
    }
}

/// One warning per version that lost clients, with the reasons of the first three: the metrics
/// count failures by kind, and this says why (a client's error would otherwise stay silent).
fn log_failures(version: u64, asked: usize, failures: &BTreeMap<ClientId, ClientFailure>) {
    const SHOWN: usize = 3;
    let reasons: Vec<String> = failures
        .iter()
        .take(SHOWN)
        .map(|(id, f)| format!("client {id} {}: {}", f.kind.label(), f.reason))
        .collect();
    let more = if failures.len() > SHOWN { "; …" } else { "" };
    tracing::warn!(
        version,
        "{} of {asked} clients failed: {}{more}",
        failures.len(),
        reasons.join("; ")
    );
}

/// What a dispatch came back with.
pub(crate) struct Dispatched {
    pub(crate) outcomes: BTreeMap<ClientId, Outcome>,
    /// Asked and not waited for (an over-committed phase closed first).
    pub(crate) late: Vec<ClientId>,
    /// Where each answer's simulated time went (with a clock).
    pub(crate) times: BTreeMap<ClientId, TaskTime>,
    /// The simulated time of the last answer taken.
    pub(crate) end: f64,
}

/// Which answers count towards closing an over-committed phase.
pub(crate) type Counts<'a> = dyn Fn(ClientId, &Outcome) -> bool + Sync + 'a;

/// What the server asks of a client in round `round`: a [`ClientMsg`] without its reply port.
pub(crate) enum Ask {
    /// Train the task, then do `then` with the update.
    Train(Box<TrainTask>, AfterTraining),
    /// Upload the update kept from phase one.
    Upload,
    /// Take a step of the round's secure aggregation.
    Secure(Box<SecureStep>),
}

impl Ask {
    /// The task handed out, if it is one.
    fn task(&self) -> Option<&TrainTask> {
        match self {
            Ask::Train(task, _) => Some(task),
            Ask::Upload | Ask::Secure(_) => None,
        }
    }
}

/// Asks `client`'s host to have it do `ask` of `round` and waits at most `deadline` for the
/// client's answer.
pub(crate) async fn call_client(
    ClientHandle { host, client }: ClientHandle,
    ask: Ask,
    round: u64,
    deadline: Duration,
) -> Outcome {
    let work = |reply| match ask {
        Ask::Train(task, then) => ClientMsg::Train { task, then, reply },
        Ask::Upload => ClientMsg::Upload { round, reply },
        Ask::Secure(step) => ClientMsg::Secure { round, step, reply },
    };
    let result = host
        .call(
            |reply| HostMsg::Work {
                client,
                work: work(reply),
            },
            Some(deadline),
        )
        .await;
    match result {
        Ok(ractor::rpc::CallResult::Success(reply)) => Outcome::Reply(reply),
        Ok(ractor::rpc::CallResult::Timeout) => Outcome::Timeout,
        Ok(ractor::rpc::CallResult::SenderError) => {
            Outcome::Unreachable("client dropped the reply".into())
        }
        Err(e) => Outcome::Unreachable(e.to_string()),
    }
}
