use std::process::ExitCode;

/// Training allocates and frees tensor buffers of a few hundred KB at every operation; with
/// glibc's allocator the kernel kept faulting in and zeroing their pages (4–5% of a char
/// transformer step), mimalloc reuses them: 75 → 91 samples/s (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = fedshard::cli::first_run::parse();
    match fedshard::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
