//! At most one training client per CPU core in a process, on a pool of one thread per core.
//!
//! Why: every client of a round waits for its update on its own blocking thread, so ten
//! clients on two cores were ten threads time-slicing two cores: each model's working set
//! evicted the others' from the caches, and each thread allocated its own buffers at once.
//! Queued here instead, a client trains at full speed when its turn comes, and the round ends
//! no later. And it trains on one of the pool's threads, not on its own: the allocator keeps a
//! heap per thread, so ten threads taking turns on a slot each faulted in buffers of their own
//! (the main job: 347 MB peak, the kernel zeroing fresh pages for 6% of the run), where the
//! pool's threads reuse theirs. A client's result does not depend on when or where it trains
//! (its seed fixes it), so runs stay bit-identical.
//!
//! Only local computation runs on the pool, training and the encoding of the update together
//! ([`LocalTrainer::train_then`]): a fault injector's simulated slowness sleeps on the
//! client's own thread, as a slow remote device would not hold this machine's cores, and is
//! proportional to the time the client's work ran ([`take_held`]), not to the time it queued.

use fedshard_protocol::task::{BoxError, LocalTrainer, TrainError, TrainOutput, TrainTask, Work};
use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A trainer whose work runs on the core pool: every trainer of a process is wrapped in one
/// where the federation builds its clients, so no kind of client (neural, FedPM, ridge) can
/// forget it. Without it a round's ten FedPM masked CNNs trained at once (3.4 GB for
/// `conv = [64, 128]` against 0.98 GB), and a straggler's slow-down, proportional to the time
/// computed, was zero.
pub struct OnACore(pub Arc<dyn LocalTrainer>);

impl LocalTrainer for OnACore {
    fn samples(&self) -> u64 {
        self.0.samples()
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
        self.train_then(task, &mut |_| Ok(()))
    }

    /// Starts the client's work on the pool: it only computes, so it needs no thread of its
    /// own to queue for a core on.
    fn start(&self, work: Work) -> Option<Work> {
        pool().spawn(work);
        None
    }

    /// Runs the training and `finish` (the uplink encoding) together on one core.
    fn train_then(
        &self,
        task: &TrainTask,
        finish: &mut (dyn FnMut(&mut TrainOutput) -> Result<(), BoxError> + Send),
    ) -> Result<TrainOutput, TrainError> {
        on_a_core(|| self.0.train_then(task, finish))
    }
}

thread_local! {
    /// Time this thread's work ran on the pool since the last [`take_held`].
    static HELD: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// The time the calling thread's work ran on the pool since the last call (zero if it ran
/// none), and starts counting afresh: the computation time of a client's task, without its
/// queueing.
pub fn take_held() -> Duration {
    HELD.with(|held| held.replace(Duration::ZERO))
}

/// Adds `held` to the calling thread's [`take_held`]: a cohort member's share of the time its
/// cohort held a core ([`gather`](crate::train::gather)).
pub fn add_held(held: Duration) {
    HELD.with(|h| h.set(h.get() + held));
}

/// Runs `work` on one of the pool's threads (one per core) once one is free, blocking the
/// calling thread until it is done, and adds the time it ran to the caller's [`take_held`].
/// A panic in `work` resumes on the calling thread. Called on the pool (work that
/// [`OnACore::start`] started there), it runs `work` at once: it holds its core already.
///
/// `work` should not use rayon itself (no trainer does): a pool thread waiting for its own
/// parallel pieces may pick up another client's queued work meanwhile, and then holds both.
pub fn on_a_core<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    if pool().current_thread_index().is_some() {
        return work();
    }
    let (result, ran) = pool().install(|| {
        let started = Instant::now();
        let result = work();
        (result, started.elapsed())
    });
    HELD.with(|held| held.set(held.get() + ran));
    result
}

/// The pool, started on first use: one thread per core the process may use.
fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
            .thread_name(|i| format!("fedshard-core-{i}"))
            .build()
            .unwrap_or_else(|e| panic!("cannot start the training threads: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn no_more_work_at_once_than_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|scope| {
            for _ in 0..4 * cores {
                scope.spawn(|| {
                    on_a_core(|| {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                });
            }
        });
        let most = most.into_inner();
        assert!(
            most >= 1 && most <= cores,
            "{most} at once on {cores} cores"
        );
    }

    #[test]
    fn a_panic_on_the_pool_resumes_in_the_caller_and_the_pool_goes_on() {
        let caught = std::panic::catch_unwind(|| on_a_core(|| panic!("in local training")));
        assert!(caught.is_err());
        assert_eq!(on_a_core(|| 7), 7);
    }

    #[test]
    fn a_wrapped_trainer_trains_and_finishes_on_the_pool() {
        use fedshard_protocol::model::ModelState;
        /// Trains for 2 ms (on whichever thread calls it).
        struct Probe;
        impl LocalTrainer for Probe {
            fn samples(&self) -> u64 {
                7
            }
            fn train(&self, _: &TrainTask) -> Result<TrainOutput, TrainError> {
                std::thread::sleep(Duration::from_millis(2));
                Ok(TrainOutput {
                    dense: ModelState::default(),
                    shards: vec![],
                    loss: 0.0,
                    control: None,
                })
            }
        }
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
        std::thread::spawn(move || {
            Probe.train(&task).expect("the bare probe");
            assert_eq!(
                take_held(),
                Duration::ZERO,
                "the bare trainer runs on the caller's thread"
            );
            let wrapped = OnACore(Arc::new(Probe));
            assert_eq!(wrapped.samples(), 7);
            wrapped.train(&task).expect("the wrapped probe");
            assert!(
                take_held() >= Duration::from_millis(2),
                "held while training"
            );
            let finish = &mut |_: &mut TrainOutput| {
                let thread = std::thread::current();
                assert!(
                    thread
                        .name()
                        .is_some_and(|n| n.starts_with("fedshard-core-")),
                    "finish runs on {:?}, not on the core pool",
                    thread.name()
                );
                std::thread::sleep(Duration::from_millis(20));
                Ok(())
            };
            wrapped
                .train_then(&task, finish)
                .expect("the probe and its finish");
            assert!(
                take_held() >= Duration::from_millis(22),
                "held while training and finishing (encoding)"
            );
        })
        .join()
        .expect("the probing thread");
    }

    #[test]
    fn a_wrapped_trainer_starts_its_work_on_the_pool_where_it_runs_at_once() {
        let (sent, got) = std::sync::mpsc::channel();
        let work: Work = Box::new(move || {
            let on_pool = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("fedshard-core-"));
            // Already holding its core: the trainer's own `on_a_core` runs it here, unqueued.
            let here = std::thread::current().id();
            let inner = on_a_core(|| std::thread::current().id());
            let _ = sent.send((on_pool, inner == here, take_held()));
        });
        /// Never asked to train: only its wrapper's `start` is called.
        struct Untrained;
        impl LocalTrainer for Untrained {
            fn samples(&self) -> u64 {
                1
            }
            fn train(&self, _: &TrainTask) -> Result<TrainOutput, TrainError> {
                unreachable!("the test starts work, it trains nothing")
            }
        }
        let wrapped = OnACore(Arc::new(Untrained));
        assert!(wrapped.start(work).is_none(), "the work was handed back");
        let (on_pool, same_thread, held) = got.recv().expect("the work ran");
        assert!(on_pool, "the work ran off the core pool");
        assert!(
            same_thread,
            "on_a_core queued work that already held a core"
        );
        assert_eq!(held, Duration::ZERO, "nothing waits to take the held time");
    }

    #[test]
    fn held_time_counts_the_running_not_the_queueing() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let hold = Duration::from_millis(30);
        // Every core busy until `hold` after the measuring thread starts its clock, however late
        // a loaded machine schedules it: the blockers wait on the pool for it, then hold on.
        let go = Arc::new(std::sync::Barrier::new(cores + 1));
        let blockers: Vec<_> = (0..cores)
            .map(|_| {
                let go = Arc::clone(&go);
                std::thread::spawn(move || {
                    on_a_core(|| {
                        go.wait();
                        std::thread::sleep(hold);
                    })
                })
            })
            .collect();
        std::thread::spawn(move || {
            let _ = take_held();
            let started = Instant::now();
            go.wait();
            on_a_core(|| std::thread::sleep(hold));
            let (held, total) = (take_held(), started.elapsed());
            assert!(held >= hold, "held {held:?} < {hold:?}");
            assert!(total >= held + hold, "queued {:?}", total - held);
            assert_eq!(take_held(), Duration::ZERO, "take_held resets");
        })
        .join()
        .expect("the measuring thread");
        for blocker in blockers {
            blocker.join().expect("a blocker");
        }
    }
}
