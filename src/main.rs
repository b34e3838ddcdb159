use clap::Parser;
use std::process::ExitCode;

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
