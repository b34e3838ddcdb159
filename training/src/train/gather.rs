//! Gathering a round's clients into cohorts (docs/design.md, "Cohorts"): in a process that
//! hosts many clients, the tasks that arrive together and share a sub-model shape and recipe
//! train as one computation ([`cohort::train`]) instead of one after another.
//!
//! Every client's request still blocks its own thread, as the runtime expects of a
//! [`LocalTrainer`]. The thread queues its task, then asks the core pool ([`on_a_core`]) for a
//! core; whichever thread gets one first takes its own task and the queued tasks of the same
//! key and trains them together, while the others wait off the pool for their results. On the
//! CPU a thread takes its share of the queue (the queued tasks over the cores), so every core
//! trains a cohort; on a GPU it takes the whole queue, the point being one launch per operation
//! for all of them. Before taking, the first thread waits until no task of its key has been
//! queued for a short window (bounded), so that the tasks sent in the same round are queued. A client's result does not depend on its cohort on
//! the CPU (the cohort kernels are bit-exact), so runs stay reproducible.

use crate::models::kernels::TrainingBackend;
use crate::train::cohort::{self, Member};
use crate::train::neural::{CohortKey, NeuralClient};
use crate::train::slots::{add_held, on_a_core, take_held};
use fedshard_protocol::task::{BoxError, LocalTrainer, TrainError, TrainOutput, TrainTask};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a process gathers its clients' tasks into cohorts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gathering {
    /// The most clients one cohort trains at once; more queued tasks make more cohorts (a
    /// cohort's activations grow with it: this bounds its memory).
    pub max_clients: usize,
    /// How long the queue must have been quiet (no task of the same key queued) before the
    /// first queued task trains with the others.
    pub window: Duration,
    /// The longest the first queued task waits for the others.
    pub longest: Duration,
    /// Whether a cohort takes the whole queue (a GPU) or its share over the cores (the CPU).
    pub whole_queue: bool,
}

impl Gathering {
    /// How much longer the first of `queued` tasks of a key waits, `quiet` after the newest
    /// was queued and `waited` after itself: `None` once the queue has been quiet for a
    /// window, a full cohort is queued, or it has waited the longest.
    fn wait(&self, queued: usize, quiet: Duration, waited: Duration) -> Option<Duration> {
        (queued < self.max_clients && quiet < self.window && waited < self.longest)
            .then(|| (self.window - quiet).min(self.longest - waited))
    }
}

/// One queued task.
struct Job<B: TrainingBackend> {
    id: u64,
    key: CohortKey,
    client: Arc<NeuralClient<B>>,
    task: TrainTask,
    queued: Instant,
}

struct Queue<B: TrainingBackend> {
    next: u64,
    pending: Vec<Job<B>>,
    results: HashMap<u64, (Result<TrainOutput, TrainError>, Duration)>,
}

/// The cohort queue of one process's neural clients (of one backend and device).
pub struct Cohorts<B: TrainingBackend> {
    gathering: Gathering,
    queue: Mutex<Queue<B>>,
    finished: Condvar,
}

impl<B: TrainingBackend> Cohorts<B> {
    pub fn new(gathering: Gathering) -> Arc<Self> {
        Arc::new(Self {
            gathering,
            queue: Mutex::new(Queue {
                next: 0,
                pending: Vec::new(),
                results: HashMap::new(),
            }),
            finished: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue<B>> {
        // A panic in a cohort's training is caught before it could poison the lock.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Trains `task` for `client` in a cohort; blocks until its result is in.
    fn train(
        &self,
        client: &Arc<NeuralClient<B>>,
        task: &TrainTask,
        key: CohortKey,
    ) -> (Result<TrainOutput, TrainError>, Duration) {
        // Copied before the lock: a task holds the whole model (45 MB for ResNet-18), and a
        // round's clients queue at once.
        let task = task.clone();
        let id = {
            let mut queue = self.lock();
            let id = queue.next;
            queue.next += 1;
            queue.pending.push(Job {
                id,
                key,
                client: Arc::clone(client),
                task,
                queued: Instant::now(),
            });
            id
        };
        loop {
            on_a_core(|| self.take_and_train(id));
            let mut queue = self.lock();
            loop {
                if let Some(result) = queue.results.remove(&id) {
                    return result;
                }
                if queue.pending.iter().any(|j| j.id == id) {
                    break; // still queued: ask for a core again
                }
                queue = self.finished.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// How much longer job `id` (queued at `first`) waits for the other tasks of its key, or
    /// `None` when it stops waiting: it waits until no task of its key has been queued for a
    /// [`Gathering::window`], so a round whose clients queue one after another (each copying
    /// a large model) still gathers into one cohort, but no longer than
    /// [`Gathering::longest`] from its own queueing, nor once a full cohort is queued.
    fn gathering_wait(&self, id: u64, first: Instant) -> Option<Duration> {
        let queue = self.lock();
        let key = &queue.pending.iter().find(|j| j.id == id)?.key;
        let same = || queue.pending.iter().filter(|j| &j.key == key);
        let newest = same().map(|j| j.queued).max()?;
        self.gathering
            .wait(same().count(), newest.elapsed(), first.elapsed())
    }

    /// On a core: if job `id` is still queued, takes it and the queued jobs of its key (its
    /// share of them), trains them as one cohort and posts the results.
    fn take_and_train(&self, id: u64) {
        let Some(first) = self
            .lock()
            .pending
            .iter()
            .find(|j| j.id == id)
            .map(|j| j.queued)
        else {
            return;
        };
        while let Some(wait) = self.gathering_wait(id, first) {
            std::thread::sleep(wait);
        }
        let jobs = {
            let mut queue = self.lock();
            let Some(mine) = queue.pending.iter().position(|j| j.id == id) else {
                return;
            };
            let mine = queue.pending.remove(mine);
            let same: Vec<usize> = (0..queue.pending.len())
                .filter(|&i| queue.pending[i].key == mine.key)
                .collect();
            let take = if self.gathering.whole_queue {
                same.len()
            } else {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (same.len() + 1).div_ceil(cores).saturating_sub(1)
            }
            .min(self.gathering.max_clients.saturating_sub(1));
            let mut jobs = vec![mine];
            for &i in same[..take].iter().rev() {
                jobs.push(queue.pending.remove(i));
            }
            jobs
        };
        let queued = jobs.iter().map(|j| j.queued);
        let spread = queued.clone().max().zip(queued.min()).map(|(l, f)| l - f);
        tracing::debug!(
            clients = jobs.len(),
            queued_over_ms = spread.unwrap_or_default().as_secs_f64() * 1e3,
            "a cohort trains"
        );
        let started = Instant::now();
        let trained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| train_jobs(&jobs)));
        let share = started.elapsed() / jobs.len() as u32;
        let mut queue = self.lock();
        match trained {
            Ok(results) => {
                for (job, result) in jobs.iter().zip(results) {
                    queue.results.insert(job.id, (result, share));
                }
            }
            // The other members fail with an error; the panic goes on in this client's own
            // thread, as a panic in a client's local training does without cohorts.
            Err(panic) => {
                for job in &jobs[1..] {
                    let cause = format!(
                        "the cohort it trained in panicked (in client {}'s thread)",
                        jobs[0].task.client
                    );
                    queue
                        .results
                        .insert(job.id, (Err(TrainError::Model(cause.into())), share));
                }
                drop(queue);
                self.finished.notify_all();
                std::panic::resume_unwind(panic);
            }
        }
        drop(queue);
        self.finished.notify_all();
    }
}

/// Trains `jobs` (one key) as one cohort.
fn train_jobs<B: TrainingBackend>(jobs: &[Job<B>]) -> Vec<Result<TrainOutput, TrainError>> {
    let members: Vec<Member<'_>> = jobs.iter().map(|j| j.client.member(&j.task)).collect();
    let first = &jobs[0].client;
    cohort::train::<B, _>(
        &first.architecture,
        &jobs[0].task.recipe,
        &members,
        &first.device,
    )
    .into_iter()
    .map(|r| r.map(TrainOutput::from))
    .collect()
}

/// A neural client that trains in its process's cohorts; it schedules its work on the core
/// pool itself (so it is not wrapped in [`OnACore`](crate::train::slots::OnACore)).
pub struct InCohorts<B: TrainingBackend> {
    pub client: Arc<NeuralClient<B>>,
    pub cohorts: Arc<Cohorts<B>>,
}

impl<B: TrainingBackend> LocalTrainer for InCohorts<B> {
    fn samples(&self) -> u64 {
        self.client.samples()
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
        self.train_then(task, &mut |_| Ok(()))
    }

    /// Trains in a cohort (or alone, for a task no cohort takes), then runs `finish` (the
    /// uplink encoding) on a core; the client's held time is its share of its cohort's.
    fn train_then(
        &self,
        task: &TrainTask,
        finish: &mut (dyn FnMut(&mut TrainOutput) -> Result<(), BoxError> + Send),
    ) -> Result<TrainOutput, TrainError> {
        let Some(key) = self.client.cohort_key(task) else {
            return on_a_core(|| self.client.train_then(task, finish));
        };
        let (result, share) = self.cohorts.train(&self.client, task, key);
        // The thread that trained the cohort held a core for all of it: keep only its share.
        let _ = take_held();
        add_held(share);
        let mut output = result?;
        on_a_core(|| finish(&mut output)).map_err(TrainError::Finish)?;
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn gathering() -> Gathering {
        Gathering {
            max_clients: 4,
            window: 2 * MS,
            longest: 100 * MS,
            whole_queue: true,
        }
    }

    #[test]
    fn a_cohort_waits_until_its_queue_is_quiet() {
        let g = gathering();
        // Just queued: the whole window; a task queued 1.5 ms ago: the rest of it.
        assert_eq!(g.wait(1, Duration::ZERO, Duration::ZERO), Some(2 * MS));
        assert_eq!(g.wait(2, MS + MS / 2, 30 * MS), Some(MS / 2));
        // Tasks trickling in keep it waiting past its own window, as long as they come.
        assert_eq!(g.wait(3, MS, 50 * MS), Some(MS));
        // Quiet for a window: it trains.
        assert_eq!(g.wait(3, 2 * MS, 50 * MS), None);
    }

    #[test]
    fn a_cohort_stops_waiting_when_full_or_after_the_longest_wait() {
        let g = gathering();
        assert_eq!(
            g.wait(4, Duration::ZERO, MS),
            None,
            "a full cohort is queued"
        );
        assert_eq!(
            g.wait(3, Duration::ZERO, 100 * MS),
            None,
            "waited the longest"
        );
        assert_eq!(
            g.wait(3, Duration::ZERO, 99 * MS),
            Some(MS),
            "never past the longest wait"
        );
    }
}
