//! The tokio runtime every command runs its actors on.

/// Blocking threads the runtime may start. Every client of a round waits in `spawn_blocking`,
/// and local computation runs on one thread per core anyway (the core pool), so more
/// threads only add stacks and allocator heaps: at tokio's default of 512, 100 000 echo clients
/// (`fedshard bench orchestration`) peaked 190 MB higher and ran 1.7 s per round instead of 1.3.
/// 64 still lets 64 clients of one round sleep out a fault injector's simulated straggler delay
/// at the same time; beyond that, their sleeps queue.
pub const BLOCKING_THREADS: usize = 64;

/// A multi-threaded runtime with I/O, timers and [`BLOCKING_THREADS`].
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
}
