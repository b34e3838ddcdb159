//! The tokio runtime every command runs its actors on.

/// Blocking threads the runtime may start. A client whose trainer may block (the fault
/// injector's sleeps, a cohort's wait for its members, a program's own trainer) waits for its
/// work on one of them ([`LocalTrainer::start`](fedshard_protocol::task::LocalTrainer::start));
/// local computation runs on one thread per core anyway (the core pool), so more threads only
/// add stacks and allocator heaps: at tokio's default of 512, 100 000 echo clients
/// (`fedshard bench orchestration`, before its clients went to the core pool) peaked 190 MB
/// higher and ran 1.7 s per round instead of 1.3. 64 still lets 64 clients of one round sleep
/// out a fault injector's simulated straggler delay, or wait in a cohort, at the same time;
/// beyond that, they queue.
pub const BLOCKING_THREADS: usize = 64;

/// A multi-threaded runtime with I/O, timers and [`BLOCKING_THREADS`].
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
}
