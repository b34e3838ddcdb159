//! `fedshard report`: one HTML page comparing finished runs (the work is in [`crate::report`]).

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run folders written by `fedshard run` (each with `metrics.jsonl` or `summary.json`, and
    /// `config.toml` for its labels).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,
    /// Folder for `report.html` (created if missing).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: PathBuf,
}

/// Writes the page and prints its path on stdout.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let path = crate::report::write_report(&args.runs, &args.out)?;
    println!("{}", path.display());
    Ok(())
}
