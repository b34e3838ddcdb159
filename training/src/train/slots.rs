//! At most one training client per CPU core in a process.
//!
//! Why: every client of a round trains on its own blocking thread, so ten clients on two cores
//! were ten threads time-slicing two cores: each model's working set evicted the others' from
//! the caches, and each thread allocated its own buffers at once. Queued here instead, a client
//! trains at full speed when its turn comes, and the round ends no later. A client's result
//! does not depend on when it trains (its seed fixes it), so runs stay bit-identical.
//!
//! Only local computation takes a slot, training and the encoding of the update together
//! ([`LocalTrainer::train_then`]): a fault injector's simulated slowness sleeps outside
//! it, as a slow remote device would not hold this machine's cores, and is proportional to the
//! time the client held a slot ([`take_held`]), not to the time it queued for one.

use fedshard_protocol::task::{LocalTrainer, TrainOutput, TrainTask};
use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// A trainer that trains only while holding a core's slot: every trainer of a process is
/// wrapped in one where the federation builds its clients, so no kind of client (neural,
/// FedPM, ridge) can forget it. Without it a round's ten FedPM masked CNNs trained at once
/// (3.4 GB for `conv = [64, 128]` against 0.98 GB), and a straggler's slow-down, proportional
/// to the time held, was zero.
pub struct OnACore(pub Arc<dyn LocalTrainer>);

impl LocalTrainer for OnACore {
    fn samples(&self) -> u64 {
        self.0.samples()
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, String> {
        self.train_then(task, &mut |_| Ok(()))
    }

    /// Holds the slot through the training and `finish` (the uplink encoding).
    fn train_then(
        &self,
        task: &TrainTask,
        finish: &mut dyn FnMut(&mut TrainOutput) -> Result<(), String>,
    ) -> Result<TrainOutput, String> {
        let _core = acquire();
        self.0.train_then(task, finish)
    }
}

/// A counting semaphore over the process's cores.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

/// A held slot and when it was taken; dropping it frees the slot and adds the time it was held
/// to this thread's [`take_held`].
pub struct Slot(&'static Slots, Instant);

impl Drop for Slot {
    fn drop(&mut self) {
        HELD.with(|held| held.set(held.get() + self.1.elapsed()));
        *lock(&self.0.free) += 1;
        self.0.freed.notify_one();
    }
}

thread_local! {
    /// Time this thread held slots since the last [`take_held`].
    static HELD: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// The time the calling thread held slots since the last call (zero if it took none), and
/// starts counting afresh: the computation time of a client's task, without its queueing.
pub fn take_held() -> Duration {
    HELD.with(|held| held.replace(Duration::ZERO))
}

fn lock(free: &Mutex<usize>) -> MutexGuard<'_, usize> {
    // The count stays consistent even if a holder panicked: it is only ever changed by ±1.
    free.lock().unwrap_or_else(PoisonError::into_inner)
}

fn slots() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(|| Slots {
        free: Mutex::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
        freed: Condvar::new(),
    })
}

/// Blocks the calling (blocking-pool) thread until a core is free.
pub fn acquire() -> Slot {
    let slots = slots();
    let mut free = lock(&slots.free);
    while *free == 0 {
        free = slots
            .freed
            .wait(free)
            .unwrap_or_else(PoisonError::into_inner);
    }
    *free -= 1;
    Slot(slots, Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn no_more_holders_than_cores_at_any_time() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (holding, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|scope| {
            for _ in 0..4 * cores {
                scope.spawn(|| {
                    let _slot = acquire();
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    holding.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        let most = most.into_inner();
        assert!(
            most >= 1 && most <= cores,
            "{most} holders on {cores} cores"
        );
    }

    #[test]
    fn a_wrapped_trainer_trains_and_finishes_holding_a_slot() {
        use fedshard_protocol::model::ModelState;
        /// Reports whether the calling thread held a slot while it trained.
        struct Probe;
        impl LocalTrainer for Probe {
            fn samples(&self) -> u64 {
                7
            }
            fn train(&self, _: &TrainTask) -> Result<TrainOutput, String> {
                std::thread::sleep(Duration::from_millis(2));
                Ok(TrainOutput {
                    dense: ModelState::default(),
                    shards: vec![],
                    loss: 0.0,
                })
            }
        }
        let task = TrainTask {
            round: 1,
            client: 0,
            seed: 7,
            dense: ModelState::default(),
            shards: vec![],
            recipe: Default::default(),
            uplink: Default::default(),
        };
        std::thread::spawn(move || {
            Probe.train(&task).expect("the bare probe");
            assert_eq!(take_held(), Duration::ZERO, "the bare trainer holds none");
            let wrapped = OnACore(Arc::new(Probe));
            assert_eq!(wrapped.samples(), 7);
            wrapped.train(&task).expect("the wrapped probe");
            assert!(
                take_held() >= Duration::from_millis(2),
                "held while training"
            );
            let finish = &mut |_: &mut TrainOutput| {
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
    fn held_time_counts_the_holding_not_the_queueing() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let hold = Duration::from_millis(30);
        // Every core busy for 3 × hold, so the measuring thread queues before it holds.
        let blockers: Vec<_> = (0..cores)
            .map(|_| {
                let slot = acquire();
                std::thread::spawn(move || {
                    std::thread::sleep(3 * hold);
                    drop(slot);
                })
            })
            .collect();
        std::thread::spawn(move || {
            let _ = take_held();
            let started = Instant::now();
            {
                let _slot = acquire();
                std::thread::sleep(hold);
            }
            let (held, total) = (take_held(), started.elapsed());
            assert!(held >= hold, "held {held:?} < {hold:?}");
            assert!(total >= held + 2 * hold, "queued {:?}", total - held);
            assert_eq!(take_held(), Duration::ZERO, "take_held resets");
        })
        .join()
        .expect("the measuring thread");
        for blocker in blockers {
            blocker.join().expect("a blocker");
        }
    }
}
