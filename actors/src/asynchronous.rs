//! The buffered asynchronous schedule (FedBuff; `[federation] mode = "async"`): `concurrency`
//! clients train at any time, each against the model version current when it was given its
//! task, and the round engine applies one aggregate every `buffer` accepted updates, weighting
//! each by its staleness s(τ) ([`crate::round::fold_buffered`]), handing out new work as soon as
//! a client answers.
//!
//! What an outstanding client needs of its version, the task it was sent (its dense values, its
//! factor columns and its uplink settings, which a KLMS decoder needs as side information), is
//! kept with it until it answers: at most `concurrency` versions' worth, never the whole history.

use crate::client::AfterTraining;
use crate::clock::VirtualClock;
use crate::collect::{Ask, call_client};
use crate::error::{Error, Result};
use crate::record::SimulatedTime;
use crate::record::{PhaseSeconds, RoundRecord};
use crate::round::{Buffered, Expect, Tally};
use crate::schedule::{Arrival, Arrivals, AsyncConfig};
use crate::server::ServerState;
use fedshard_protocol::shard_plan::Participant;
use fedshard_protocol::task::{ClientId, TrainTask};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

/// A task given out and not answered yet.
#[derive(Debug)]
struct Outstanding {
    /// The model version it was trained from.
    version: u64,
    task: TrainTask,
}

/// The state of an async run between model versions.
pub struct AsyncRun {
    arrivals: Arrivals,
    outstanding: BTreeMap<ClientId, Outstanding>,
    /// Tasks handed out so far; the n-th has `round = n`, which keys its client's training
    /// stream and its fault draws, and which its envelope must carry back.
    dispatched: u64,
}

impl AsyncRun {
    /// A run continuing after `history` (empty for a fresh one): the work outstanding at a
    /// checkpoint is not in it and is handed out afresh, numbered after every task answered.
    fn new(clock: Option<Arc<VirtualClock>>, now: f64, history: &[RoundRecord]) -> Self {
        Self {
            arrivals: Arrivals::new(clock, now),
            outstanding: BTreeMap::new(),
            dispatched: history.iter().map(|r| r.participants as u64).sum(),
        }
    }
}

impl ServerState {
    /// The buffered schedule's collection: hands out work and takes answers until `buffer`
    /// updates from any versions are accepted for model version `version`, counted into `tally`.
    pub(crate) async fn collect_buffer(
        &mut self,
        version: u64,
        settings: AsyncConfig,
        tally: &mut Tally,
        phases: &mut PhaseSeconds,
    ) -> Result<Vec<Buffered>> {
        let mut run = match self.asynchronous.take() {
            Some(run) => run,
            None => AsyncRun::new(self.clock.clone(), self.simulated_now(), &self.fed.history),
        };
        let result = self
            .fill_buffer(&mut run, version, settings, tally, phases)
            .await;
        self.asynchronous = Some(run);
        result
    }

    async fn fill_buffer(
        &mut self,
        run: &mut AsyncRun,
        version: u64,
        settings: AsyncConfig,
        tally: &mut Tally,
        phases: &mut PhaseSeconds,
    ) -> Result<Vec<Buffered>> {
        let mut buffer: Vec<Buffered> = Vec::new();
        let mut time = SimulatedTime {
            start: run.arrivals.now(),
            ..SimulatedTime::default()
        };
        // With privacy a client's update is at most once in a buffer (the accountant bounds
        // one contribution per client and release): it gets no new work until the buffer is
        // applied.
        let once = self.engine.privacy.is_some();
        while buffer.len() < settings.buffer {
            let handing = Instant::now();
            let in_buffer: Vec<ClientId> = if once {
                buffer.iter().map(|b| b.accepted.client).collect()
            } else {
                Vec::new()
            };
            self.hand_out(run, (version, &in_buffer), settings.concurrency, tally)
                .await?;
            let waiting = Instant::now();
            phases.plan += (waiting - handing).as_secs_f64();
            let next = run.arrivals.next().await;
            phases.train += waiting.elapsed().as_secs_f64();
            let Some(Arrival {
                client: id,
                outcome,
                time: spent,
            }) = next
            else {
                return Err(Error::NoClient);
            };
            if let Some(spent) = spent {
                time.clients.insert(id, spent);
            }
            let Some(out) = run.outstanding.remove(&id) else {
                continue;
            };
            tally.participants += 1;
            let tasks = BTreeMap::from([(id, out.task)]);
            let outcomes = BTreeMap::from([(id, outcome)]);
            let taken =
                self.take_answers(version, &[id], outcomes, (Expect::Updates, &tasks), tally);
            let mut tasks = tasks;
            for accepted in taken.accepted {
                if let Some(task) = tasks.remove(&accepted.client) {
                    buffer.push(Buffered {
                        accepted,
                        task,
                        version: out.version,
                    });
                }
            }
        }
        time.end = run.arrivals.now();
        tally.time = self.clock.is_some().then_some(time);
        Ok(buffer)
    }

    /// Gives work to idle clients, each drawn uniformly with the stream (seed, n, 0, Selection)
    /// of the n-th task, until `concurrency` are training or none is idle; a client in
    /// `in_buffer` is not idle.
    async fn hand_out(
        &mut self,
        run: &mut AsyncRun,
        (version, in_buffer): (u64, &[ClientId]),
        concurrency: usize,
        tally: &mut Tally,
    ) -> Result<()> {
        let seed = self.fed.config.seed;
        let clusters = self.fed.registry.clusters();
        let in_buffer: BTreeSet<ClientId> = in_buffer.iter().copied().collect();
        // The idle clients in id order, listed once: the registry and the connected clients
        // change only between the server's messages, so the list loses just the clients handed
        // work below (a scan of the registry per task would cost registry × tasks).
        let mut idle: Vec<ClientId> = self
            .fed
            .registry
            .clients
            .keys()
            .copied()
            .filter(|c| {
                !run.outstanding.contains_key(c)
                    && self.clients.contains_key(c)
                    && !in_buffer.contains(c)
            })
            .collect();
        while run.outstanding.len() < concurrency && !idle.is_empty() {
            run.dispatched += 1;
            let n = run.dispatched;
            let mut rng = stream(seed, n, 0, Purpose::Selection);
            let at = ((uniform(&mut rng) * idle.len() as f64) as usize).min(idle.len() - 1);
            let pick = idle.remove(at);
            let participant = Participant {
                client: pick,
                keep_ratio: clusters.of(self.fed.registry.clients[&pick].keep_ratio),
            };
            let (_, mut tasks) = self
                .prepare(&[participant], n, version, concurrency)
                .await?;
            tally.hand_out(&tasks);
            let Some(task) = tasks.tasks.remove(&pick) else {
                return Err(Error::NoTask(pick));
            };
            let Some(actor) = self.clients.get(&pick).cloned() else {
                continue;
            };
            let bits = tasks.bits.get(&pick).copied().unwrap_or(0);
            let cost = run.arrivals.cost(pick, Some((&task, bits)));
            let ask = Ask::Train(Box::new(task.clone()), AfterTraining::Upload);
            let work = call_client(actor, ask, n, self.wall_deadline());
            run.arrivals
                .push(pick, cost, self.fed.config.deadline, work);
            run.outstanding.insert(
                pick,
                Outstanding {
                    version: version - 1,
                    task,
                },
            );
        }
        if run.outstanding.is_empty() {
            return Err(Error::NoClient);
        }
        Ok(())
    }
}
