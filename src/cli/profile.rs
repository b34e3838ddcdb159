//! `bench round --profile FILE`: a sampling profile of the timed rounds, every thread at
//! 997 Hz, written as folded stacks (`thread;root;…;leaf count` a line), the input of
//! flamegraph tools (inferno-flamegraph, speedscope). It runs inside the process because the
//! machines a round is measured on need not have `perf` (the lent GPU hosts have none), and a
//! GPU round's cost is the host's work around each kernel launch. Only in a build with the
//! `profile` feature (`cargo build --release --features profile`).

use std::path::Path;

/// Runs `work`, every thread of the process sampled while it runs and the folded stacks
/// written to `path` after it, when a path is given.
pub fn profiled<T>(
    path: Option<&Path>,
    work: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let Some(path) = path else {
        return work();
    };
    let guard = imp::start()?;
    let result = work()?;
    let samples = imp::write(guard, path)?;
    eprintln!("profile: {samples} samples in {}", path.display());
    Ok(result)
}

#[cfg(feature = "profile")]
mod imp {
    use anyhow::Context;
    use std::fmt::Write as _;
    use std::path::Path;

    pub type Guard = pprof::ProfilerGuard<'static>;

    pub fn start() -> anyhow::Result<Guard> {
        pprof::ProfilerGuardBuilder::default()
            .frequency(997)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .context("could not start the sampling profiler")
    }

    pub fn write(guard: Guard, path: &Path) -> anyhow::Result<u64> {
        let report = guard
            .report()
            .build()
            .context("could not read the profile's samples")?;
        let (mut folded, mut samples) = (String::new(), 0u64);
        for (stack, count) in &report.data {
            let mut line = stack.thread_name_or_id();
            // Frames hold the leaf first; a folded line runs from the root.
            for symbol in stack.frames.iter().rev().flat_map(|f| f.iter().rev()) {
                write!(line, ";{symbol}").expect("a String takes any write");
            }
            writeln!(folded, "{line} {count}").expect("a String takes any write");
            samples += u64::try_from(*count).unwrap_or(0);
        }
        fedshard_actors::checkpoint::write_atomically(path, folded.as_bytes())
            .with_context(|| format!("could not write the profile to {}", path.display()))?;
        Ok(samples)
    }
}

#[cfg(not(feature = "profile"))]
mod imp {
    use std::path::Path;

    pub enum Guard {}

    pub fn start() -> anyhow::Result<Guard> {
        anyhow::bail!(
            "--profile: this fedshard was built without the profiler (rebuild with `cargo build --release --features profile`)"
        )
    }

    pub fn write(guard: Guard, _: &Path) -> anyhow::Result<u64> {
        match guard {}
    }
}
