use clap::Parser;
use std::process::ExitCode;

/// Training allocates and frees tensor buffers of a few hundred KB at every operation; glibc
/// serves those with fresh `mmap`s whose pages fault in and are zeroed each time, mimalloc
/// reuses them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = fedshard::cli::Cli::parse();
    match fedshard::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
