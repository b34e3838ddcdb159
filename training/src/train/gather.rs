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
//! for all of them. Before taking, the first thread waits a short gathering window so that the
//! tasks sent in the same round are queued. A client's result does not depend on its cohort on
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
    /// How long the first queued task waits for the others of its round before it trains.
    pub window: Duration,
    /// Whether a cohort takes the whole queue (a GPU) or its share over the cores (the CPU).
    pub whole_queue: bool,
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
        let id = {
            let mut queue = self.lock();
            let id = queue.next;
            queue.next += 1;
            queue.pending.push(Job {
                id,
                key,
                client: Arc::clone(client),
                task: task.clone(),
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
        let waited = first.elapsed();
        if waited < self.gathering.window {
            std::thread::sleep(self.gathering.window - waited);
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
    cohort::train::<B>(
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
