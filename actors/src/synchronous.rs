//! The synchronous schedule's collection: plain rounds, over-committed rounds and two-phase
//! rounds (a selector that picks who uploads from the update norms). The secure round's is
//! [`crate::secure`]'s, the buffered schedule's [`crate::asynchronous`]'s; all of them hand out
//! and take answers through [`crate::collect`].

use crate::client::{AfterTraining, ClientReply};
use crate::collect::{Ask, Counts};
use crate::coordinator::{averaged, over_committed};
use crate::engine::RoundUpdates;
use crate::error::Error;
use crate::record::{PhaseSeconds, SimulatedTime};
use crate::round::{Expect, Outcome, Tally, check};
use crate::server::{ServerState, selection_probabilities};
use fedshard_protocol::task::ClientId;
use std::collections::BTreeMap;
use std::time::Instant;

impl ServerState {
    /// The synchronous schedule's collection (plain and over-committed rounds): asks the
    /// coordinator for participants, hands every one its task, and takes the answers until all
    /// came, the deadline passed, or (over-committed) the target of accepted updates is reached;
    /// a two-phase selector's second phase then picks who uploads. Returns the accepted updates
    /// with what the fold needs, counted into `tally`.
    pub(crate) async fn collect_round(
        &mut self,
        round: u64,
        over_commit: Option<f64>,
        tally: &mut Tally,
        phases: &mut PhaseSeconds,
    ) -> Result<RoundUpdates, Error> {
        let started = Instant::now();
        let config = self.fed.config.clone();
        let two_phase = self.fed.registry.two_phase();
        // Over-commitment: a one-phase round asks more clients; a two-phase round asks everyone
        // in phase one anyway and closes that phase early instead.
        let over = over_commit.map(|c| over_committed(self.fed.registry.budget, c));
        let budget = over.filter(|_| !two_phase).map(|(asked, _)| asked);
        let first = self.select(round, None, budget).await?;
        let participants = first.shard_participants();
        let cohort = averaged(participants.len(), over.filter(|_| !two_phase));
        let (plan, tasks) = self.prepare(&participants, round, round, cohort).await?;

        let mut probabilities = selection_probabilities(&first);
        let then = if two_phase {
            AfterTraining::Keep
        } else {
            AfterTraining::Upload
        };
        let messages = tasks
            .tasks
            .iter()
            .map(|(id, t)| (*id, Ask::Train(Box::new(t.clone()), then)))
            .collect();
        // What closes an over-committed phase: an update that passes every check, or in phase
        // one of a two-phase round a reported norm.
        let counts = |id: ClientId, outcome: &Outcome| match outcome {
            Outcome::Reply(ClientReply::Update(e)) if !two_phase => {
                check(id, e, tasks.tasks.get(&id), config.max_update_norm).is_ok()
            }
            Outcome::Reply(ClientReply::Trained { .. }) => two_phase,
            _ => false,
        };
        let close = over.map(|(asked, target)| {
            let n = if two_phase { asked as usize } else { target };
            (n, &counts as &Counts<'_>)
        });
        phases.plan = started.elapsed().as_secs_f64();
        let start = self.simulated_now();
        let first_phase = self
            .dispatch(messages, &tasks.bits, (round, start), close)
            .await;
        let (outcomes, late) = (first_phase.outcomes, first_phase.late);
        let mut time = SimulatedTime {
            start,
            end: first_phase.end,
            clients: first_phase.times,
        };
        if !late.is_empty() {
            tracing::info!(
                round,
                late = late.len(),
                "round closed at its over-committed target; late clients' answers are dropped"
            );
        }
        let answered: Vec<ClientId> = tasks
            .tasks
            .keys()
            .copied()
            .filter(|id| !late.contains(id))
            .collect();
        let expect = if two_phase {
            Expect::Norms
        } else {
            Expect::Updates
        };
        tally.participants = tasks.tasks.len();
        tally.hand_out(&tasks);
        let mut taken =
            self.take_answers(round, &answered, outcomes, (expect, &tasks.tasks), tally);
        if two_phase {
            let norms = std::mem::take(&mut taken.answers.norms);
            let second = self.select(round, Some(norms), None).await?;
            probabilities = selection_probabilities(&second);
            let uploaders: Vec<ClientId> = second.participants.iter().map(|p| p.0).collect();
            let uploads = uploaders.iter().map(|&id| (id, Ask::Upload)).collect();
            let second_phase = self
                .dispatch(uploads, &BTreeMap::new(), (round, time.end), None)
                .await;
            for (id, t) in second_phase.times {
                let phase_one = time.clients.entry(id).or_default();
                phase_one.upload += t.total();
            }
            time.end = second_phase.end;
            let uploaded = self.take_answers(
                round,
                &uploaders,
                second_phase.outcomes,
                (Expect::Updates, &tasks.tasks),
                tally,
            );
            taken.accepted.extend(uploaded.accepted);
            taken.answers.failures.extend(uploaded.answers.failures);
        }
        phases.train = started.elapsed().as_secs_f64() - phases.plan;
        tally.time = self.clock.is_some().then_some(time);
        Ok(RoundUpdates {
            plan,
            tasks,
            probabilities,
            failures: taken.answers.failures,
            accepted: taken.accepted,
            late: late.len(),
            secure: None,
        })
    }
}
