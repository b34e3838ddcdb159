//! `fedshard report`: one HTML page comparing runs (the work is in [`crate::report`]), written
//! as a file or served live while the runs are written.

use crate::report::live::ReportPage;
use anyhow::Context;
use clap::Args;
use fedshard_actors::live::{PageServer, RunState};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run folders written by `fedshard run` (each with `metrics.jsonl` or `summary.json`, and
    /// `config.toml` for its labels).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,
    /// Folder for `report.html` (created if missing).
    #[arg(
        long,
        value_name = "DIR",
        default_value = ".",
        conflicts_with = "serve"
    )]
    pub out: PathBuf,
    /// Serve the page on IP:PORT instead of writing it, drawn again from the folders as they
    /// are written (runs still going, a `compare` grid) until interrupted (Ctrl-C). The folders
    /// need not exist yet.
    #[arg(long, value_name = "IP:PORT")]
    pub serve: Option<String>,
}

/// Writes the page and prints its path on stdout, or serves it.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    if let Some(addr) = &args.serve {
        let addr: SocketAddr = addr.parse().map_err(|_| {
            anyhow::anyhow!("--serve {addr}: expected IP:PORT, e.g. 127.0.0.1:9465")
        })?;
        return serve(addr, args.runs.clone());
    }
    let path = crate::report::write_report(&args.runs, &args.out)?;
    println!("{}", path.display());
    Ok(())
}

/// How often the folders are checked for a summary (a run writes it last).
const CHECK_EVERY: Duration = Duration::from_secs(1);

fn serve(addr: SocketAddr, runs: Vec<PathBuf>) -> anyhow::Result<()> {
    let runtime = crate::runtime::build()?;
    runtime.block_on(async {
        let page = Arc::new(ReportPage::new(runs));
        let server = PageServer::start(addr, Arc::clone(&page) as _)
            .await
            .with_context(|| format!("--serve {addr}"))?;
        println!("http://{}/", server.addr());
        eprintln!(
            "serving the report on http://{}/ until interrupted (Ctrl-C)",
            server.addr()
        );
        // Once every run has its summary the page stops refreshing; it is still served.
        let mut finished = false;
        loop {
            let now = page.finished();
            if now != finished {
                finished = now;
                server.set_state(if now {
                    RunState::Finished
                } else {
                    RunState::Running
                });
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
    })
}
