//! The server's side of a secure round: who trains, the session's four exchanges as requests
//! to the clients, and what the session came to.

use super::{BlockLayout, InputSpec, SecureSettings, SecureStep, SecureSum, session_id};
use crate::client::AfterTraining;
use crate::collect::Ask;
use crate::engine::RoundUpdates;
use crate::error::{Error, Result};
use crate::record::{PhaseSeconds, SimulatedTime};
use crate::round::{ClientFailure, Expect, Tally, Tasks};
use crate::server::{ServerState, selection_probabilities};
use fedshard_protocol::payload::RejectionKind;
use fedshard_protocol::shard_plan::ShardPlan;
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_secagg::ServerMessage;
use fedshard_strategies::aggregation::SumWeight;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// What a secure round's session came to.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionOutcome {
    Finished {
        sum: SecureSum,
        record: SessionRecord,
    },
    /// Too few clients were left to finish it (or to start it); the text says why.
    NotFinished(String),
}

impl SessionOutcome {
    /// The record of a finished session.
    pub fn record(&self) -> Option<SessionRecord> {
        match self {
            SessionOutcome::Finished { record, .. } => Some(*record),
            SessionOutcome::NotFinished(_) => None,
        }
    }
}

/// A secure round's session, as its record tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Clients whose inputs are in the sum.
    pub survivors: usize,
    /// Clients that shared their keys but whose masked input never came: the server removed
    /// their masks with the shares of the others.
    pub dropped: usize,
    /// `t`: shares that rebuild a secret, and the fewest clients that may finish.
    pub threshold: usize,
    /// The bits of every value of the session's modulus.
    pub bits: u32,
}

/// Why a client's session message is refused, by the kind the round counts.
fn rejection(error: &fedshard_secagg::Error) -> RejectionKind {
    use fedshard_secagg::Error as E;
    match error {
        E::WrongSession { .. } | E::WrongRound { .. } => RejectionKind::Stale,
        E::UnknownClient(_) | E::NotExpected { .. } | E::Duplicate { .. } => RejectionKind::Forged,
        _ => RejectionKind::Malformed,
    }
}

/// The server's side of one round's session, between its exchanges.
struct Session<'a> {
    round: u64,
    server: fedshard_secagg::Server,
    tally: &'a mut Tally,
    failures: &'a mut BTreeMap<ClientId, ClientFailure>,
    time: &'a mut SimulatedTime,
}

impl ServerState {
    /// A secure round's collection: every participant trains and keeps its update, then the
    /// clients that did run the four exchanges of the session over their inputs. Returns the
    /// round with no update in the clear and, when the session finished, its decoded sum.
    pub(crate) async fn collect_secure_round(
        &mut self,
        round: u64,
        (settings, weighting): (SecureSettings, SumWeight),
        tally: &mut Tally,
        phases: &mut PhaseSeconds,
    ) -> Result<RoundUpdates> {
        let started = Instant::now();
        let first = self.select(round, None, None).await?;
        let participants = first.shard_participants();
        let (plan, tasks) = self
            .prepare(&participants, round, round, participants.len())
            .await?;
        let messages = tasks
            .tasks
            .iter()
            .map(|(id, t)| (*id, Ask::Train(Box::new(t.clone()), AfterTraining::Secure)))
            .collect();
        phases.plan = started.elapsed().as_secs_f64();
        let start = self.simulated_now();
        let trained = self
            .dispatch(messages, &tasks.bits, (round, start), None)
            .await;
        let mut time = SimulatedTime {
            start,
            end: trained.end,
            clients: trained.times,
        };
        tally.participants = tasks.tasks.len();
        tally.hand_out(&tasks);
        let asked: Vec<ClientId> = tasks.tasks.keys().copied().collect();
        let taken = self.take_answers(
            round,
            &asked,
            trained.outcomes,
            (Expect::Ready, &tasks.tasks),
            tally,
        );
        let (ready, mut failures) = (taken.answers.ready, taken.answers.failures);
        let needed = self.fed.config.min_successful.max(1);
        let session = if ready.len() >= needed {
            self.secure_session(
                round,
                (&settings, weighting),
                (plan.as_deref(), &tasks),
                &ready,
                (tally, &mut failures, &mut time),
            )
            .await?
        } else {
            SessionOutcome::NotFinished(format!(
                "{} clients trained, the minimum is {needed}",
                ready.len()
            ))
        };
        phases.train = started.elapsed().as_secs_f64() - phases.plan;
        tally.time = self.clock.is_some().then_some(time);
        Ok(RoundUpdates {
            plan,
            tasks,
            probabilities: selection_probabilities(&first),
            failures,
            accepted: vec![],
            late: 0,
            secure: Some(Box::new(session)),
        })
    }

    /// Runs the session of the clients in `ready` (ascending); when too few clients were left
    /// to finish it, the round's model stays.
    async fn secure_session(
        &self,
        round: u64,
        (settings, weighting): (&SecureSettings, SumWeight),
        (plan, tasks): (Option<&ShardPlan>, &Tasks),
        ready: &[ClientId],
        (tally, failures, time): (
            &mut Tally,
            &mut BTreeMap<ClientId, ClientFailure>,
            &mut SimulatedTime,
        ),
    ) -> Result<SessionOutcome> {
        let layout = {
            let held: Vec<&TrainTask> = ready.iter().filter_map(|id| tasks.tasks.get(id)).collect();
            BlockLayout::of(&self.fed.model, plan, &held)
        };
        // With [privacy] the clip is DP-FedAvg's of this round, and the sum also counts the
        // unclipped changes.
        let private = self.engine.privacy.as_ref();
        let clip_norm = match (private, settings.clip_norm) {
            (Some((p, _)), _) => p.clip_norm(&self.fed.history),
            (None, Some(clip)) => clip,
            (None, None) => {
                return Err(Error::SecureAggregation(fedshard_secagg::Error::Params(
                    "no clip norm: `[secure_aggregation] clip_norm` or `[privacy]` sets it".into(),
                )));
            }
        };
        let count_unclipped = private.is_some();
        let fixed = settings.fixed_point(clip_norm)?;
        let vector_len = layout.len() + usize::from(count_unclipped);
        let seed = self.fed.config.seed;
        let params = settings.params((seed, round), ready, vector_len, &fixed)?;
        let weights = self.secure_weights(weighting, ready)?;
        let mut session = Session {
            round,
            server: fedshard_secagg::Server::new(params.clone())
                .map_err(Error::SecureAggregation)?,
            tally,
            failures,
            time,
        };
        let begin = ready.iter().map(|&id| {
            let input = InputSpec {
                layout: layout.clone(),
                clip_norm,
                weight: weights.get(&id).copied().unwrap_or(0.0),
                fixed,
                count_unclipped,
            };
            let step = SecureStep::Begin {
                params: params.clone(),
                input: Box::new(input),
            };
            (id, step)
        });
        let outcome = async {
            self.exchange(&mut session, begin.collect()).await;
            let directories = session.server.close_advertise_keys()?;
            self.exchange(&mut session, continued(directories)).await;
            let inboxes = session.server.close_share_keys()?;
            self.exchange(&mut session, continued(inboxes)).await;
            let request = session.server.close_masked_input()?;
            let survivors = session.server.survivors();
            let unmask = survivors.iter().map(|&c| (c, request.clone())).collect();
            self.exchange(&mut session, continued(unmask)).await;
            session.server.finish()
        }
        .await;
        let aggregate = match outcome {
            Ok(aggregate) => aggregate,
            Err(e) => {
                return Ok(SessionOutcome::NotFinished(format!(
                    "the secure aggregation did not finish: {e}"
                )));
            }
        };
        let record = SessionRecord {
            survivors: aggregate.survivors.len(),
            dropped: aggregate.dropped.len(),
            threshold: params.threshold,
            bits: params.bits,
        };
        session.tally.envelopes += aggregate.survivors.len();
        let mut decoded = fixed.decode_sum(&aggregate.sum, aggregate.survivors.len());
        let unclipped = count_unclipped
            .then(|| decoded.pop())
            .flatten()
            .map(|v| (v / clip_norm).round().max(0.0) as usize);
        let sum = SecureSum {
            sum: decoded,
            unclipped,
            survivors: aggregate
                .survivors
                .iter()
                .map(|&c| {
                    let id = ClientId::from(c);
                    (id, weights.get(&id).copied().unwrap_or(0.0))
                })
                .collect(),
            layout,
        };
        Ok(SessionOutcome::Finished { sum, record })
    }

    /// Each client's weight over the largest of `clients`: the registry's sample count (never
    /// the client's own claim) for FedAvg, 1 for uniform weights.
    fn secure_weights(
        &self,
        weighting: SumWeight,
        clients: &[ClientId],
    ) -> Result<BTreeMap<ClientId, f64>> {
        let raw = clients
            .iter()
            .map(|&id| {
                let samples = self
                    .fed
                    .registry
                    .clients
                    .get(&id)
                    .map(|c| c.samples as f64)
                    .ok_or(Error::UnknownClient(id))?;
                Ok((id, weighting.of(samples)))
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        let largest = raw.values().copied().fold(0.0, f64::max);
        Ok(raw
            .into_iter()
            .map(|(id, w)| (id, if largest > 0.0 { w / largest } else { 0.0 }))
            .collect())
    }

    /// One exchange: sends each client its step, waits for the answers until the deadline, and
    /// hands the server every message that its sender signed as itself. A client that failed
    /// or did not answer in time has dropped out, and stays out (the server refuses its late
    /// messages).
    async fn exchange(&self, session: &mut Session<'_>, steps: Vec<(ClientId, SecureStep)>) {
        let asked: Vec<ClientId> = steps.iter().map(|(id, _)| *id).collect();
        let asks = steps
            .into_iter()
            .map(|(id, step)| (id, Ask::Secure(Box::new(step))))
            .collect();
        let start = session.time.end;
        let answered = self
            .dispatch(asks, &BTreeMap::new(), (session.round, start), None)
            .await;
        for (id, t) in answered.times {
            let spent = session.time.clients.entry(id).or_default();
            spent.download += t.download;
            spent.compute += t.compute;
            spent.upload += t.upload;
        }
        session.time.end = answered.end;
        let no_tasks = BTreeMap::new();
        let taken = self.take_answers(
            session.round,
            &asked,
            answered.outcomes,
            (Expect::Secure, &no_tasks),
            session.tally,
        );
        session.failures.extend(taken.answers.failures);
        for (id, message) in taken.answers.secure {
            let signed = session_id(id).is_ok_and(|s| s == message.header.sender);
            let received = if signed {
                session.server.receive(message)
            } else {
                Err(fedshard_secagg::Error::UnknownClient(message.header.sender))
            };
            if let Err(e) = received {
                tracing::warn!(
                    round = session.round,
                    client = id,
                    "secure aggregation message refused: {e}"
                );
                session.tally.reject(rejection(&e));
            }
        }
    }
}

/// The server's messages as the steps that carry them.
fn continued(
    outbox: Vec<(fedshard_secagg::ClientId, ServerMessage)>,
) -> Vec<(ClientId, SecureStep)> {
    outbox
        .into_iter()
        .map(|(to, message)| (ClientId::from(to), SecureStep::Continue(message)))
        .collect()
}
