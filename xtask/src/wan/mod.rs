//! `cargo xtask wan`: one federation over a network in a box ([`crate::netns`]). A server host
//! runs `fedshard serve`, N client hosts run `fedshard join` (the config's clients split evenly
//! over them), every host's uplink limited to a rate; one line per round with its seconds and
//! the bytes each way as the run counted them; last, the bytes the links carried and the final
//! model's digest beside `fedshard bench job`'s in-process one, which it must equal.
//!
//! Why a task and not a test: it is the figure a user asks before deploying — what a round
//! costs on links like theirs — and the proof that the transport changes nothing.
//!
//! [`options`] parses what was asked, [`process`] keeps the processes and their scratch folder,
//! [`files`] reads what fedshard writes, [`mod@bench`] is the `--bench-cluster` variant.

mod bench;
mod files;
mod options;
mod process;

use crate::netns::{self, Network};
use files::{RoundRecord, json_line, rounded};
use options::{Options, Work};
use process::{Proc, Progress, Scratch, progress};
use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// `cargo xtask wan ARGS`: exits 0 when the run ended with the in-process model, 1 when the
/// models differ, 2 on any error (clap's own exit for bad arguments, 0 for `--help`).
pub fn main(repo: &Path, args: &[String]) -> ExitCode {
    let options = match Options::parse_args(args) {
        Ok(options) => options,
        Err(e) => e.exit(),
    };
    match run(repo, &options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => crate::fail(&format!("wan: {e}")),
    }
}

fn run(repo: &Path, options: &Options) -> Result<bool, String> {
    match options.work()? {
        Work::Config(config) => federation(repo, options, config),
        Work::Bench {
            clients_per_node,
            params,
        } => {
            let bin = binary(repo, options)?;
            bench::run(&path(&bin), options, clients_per_node, params)
        }
    }
}

/// `fedshard serve CONFIG` on the server host and `fedshard join CONFIG` on each client host;
/// `Ok(true)` when the served model equals `fedshard bench job`'s in-process one.
fn federation(repo: &Path, options: &Options, config: &Path) -> Result<bool, String> {
    let config =
        fs::canonicalize(config).map_err(|e| format!("--config {}: {e}", config.display()))?;
    let clients = files::data_clients(&config)?;
    if clients < options.nodes {
        return Err(format!(
            "{}: [data] clients = {clients}, fewer than --nodes {}",
            config.display(),
            options.nodes
        ));
    }
    let bin = binary(repo, options)?;
    let scratch = Scratch::new()?;
    let secret = scratch.secret_file()?;
    let run_dir = match &options.out {
        Some(out) => out.clone(),
        None => scratch.path().join("run"),
    };
    let network = network(options)?;
    let listen = listen_address();

    let mut serve = network.command(0, &path(&bin));
    serve.args(["serve", &path(&config), "--listen", &listen]);
    serve.args(["--out", &path(&run_dir), "--secret-file", &path(&secret)]);
    serve.args(["--metrics-addr", "off"]);
    if let Some(rounds) = options.rounds {
        serve.args(["--rounds", &rounds.to_string()]);
    }
    let mut processes = vec![Proc::spawn("serve", serve, scratch.path())?];
    for node in 0..options.nodes {
        let first = clients * node / options.nodes;
        let last = clients * (node + 1) / options.nodes - 1;
        let mut join = network.command(node + 1, &path(&bin));
        join.args(["join", &path(&config), "--server", &listen]);
        join.args(["--clients", &format!("{first}-{last}")]);
        join.args(["--name", &format!("host{}", node + 1)]);
        join.args(["--secret-file", &path(&secret)]);
        let name = format!("join-{}", node + 1);
        processes.push(Proc::spawn(&name, join, scratch.path())?);
    }
    if !options.json {
        println!(
            "wan: server 10.77.0.1 ({} Mbit/s up), {} client hosts ({} Mbit/s up each), {clients} clients of {}",
            options.server_mbit(),
            options.nodes,
            options.uplink_mbit,
            config.display()
        );
    }

    let started = Instant::now();
    let mut rounds = RoundLines::new(run_dir.join("metrics.jsonl"), options.json);
    loop {
        rounds.print_new()?;
        match progress(&mut processes)? {
            Progress::Running => std::thread::sleep(Duration::from_millis(50)),
            Progress::Done => break,
            Progress::Failed { name, tail } => return Err(Progress::failure(&name, &tail)),
        }
    }
    // The rounds recorded between the last reading and the exit.
    rounds.print_new()?;
    let seconds = started.elapsed().as_secs_f64();
    let model = run_dir.join("model.bin");
    let bytes = fs::read(&model).map_err(|e| format!("{}: {e}", model.display()))?;
    let digest = files::model_digest(&bytes);
    let in_process = files::bench_job_digest(&bin, &config, options.rounds)?;
    let equal = digest == in_process;
    let (up, down) = wire_totals(&network)?;
    drop(network);
    if options.json {
        /// The last line.
        #[derive(Serialize)]
        struct Outcome<'a> {
            model_digest: &'a str,
            in_process_digest: &'a str,
            equal: bool,
            seconds: f64,
            wire_up_bytes: u64,
            wire_down_bytes: u64,
        }
        let line = json_line(&Outcome {
            model_digest: &digest,
            in_process_digest: &in_process,
            equal,
            seconds: rounded(seconds, 3),
            wire_up_bytes: up,
            wire_down_bytes: down,
        })?;
        println!("{line}");
    } else {
        println!(
            "wan: {seconds:.1} s, {up} bytes up and {down} down on the links; model digest {digest}, in process {in_process}: {}",
            if equal { "equal" } else { "DIFFERENT" }
        );
    }
    Ok(equal)
}

/// The rounds of a running federation, printed as their records complete in `metrics.jsonl`.
struct RoundLines {
    records: PathBuf,
    json: bool,
    printed: usize,
}

impl RoundLines {
    fn new(records: PathBuf, json: bool) -> Self {
        Self {
            records,
            json,
            printed: 0,
        }
    }

    /// Prints the rounds completed since the last call; a record still being written (no
    /// newline yet) waits for the next.
    fn print_new(&mut self) -> Result<(), String> {
        let text = match fs::read_to_string(&self.records) {
            Ok(text) => text,
            // Not there before the first round ends.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("{}: {e}", self.records.display())),
        };
        let complete: Vec<&str> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .collect();
        for (index, line) in complete.iter().enumerate().skip(self.printed) {
            let record = RoundRecord::parse(line, &self.records, index + 1)?;
            println!("{}", record.report(self.json)?);
        }
        self.printed = self.printed.max(complete.len());
        Ok(())
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Where the server host listens.
fn listen_address() -> String {
    format!("{}:7000", netns::address(0))
}

/// The fedshard binary: `--bin`, or a fresh release build.
fn binary(repo: &Path, options: &Options) -> Result<PathBuf, String> {
    match &options.bin {
        Some(bin) => Ok(bin.clone()),
        None => build(repo),
    }
}

/// The server host and the client hosts, each uplink limited.
fn network(options: &Options) -> Result<Network, String> {
    let rates: Vec<Option<f64>> = std::iter::once(Some(options.server_mbit()))
        .chain(std::iter::repeat_n(
            Some(options.uplink_mbit),
            options.nodes,
        ))
        .collect();
    Network::create("wan", &rates)
}

/// Bytes all client hosts sent (up) and the server host sent (down), so far.
fn wire_totals(network: &Network) -> Result<(u64, u64), String> {
    let mut up = 0;
    for host in 1..network.len() {
        up += network.wire_bytes(host)?.0;
    }
    Ok((up, network.wire_bytes(0)?.0))
}

/// `cargo build --release --bin fedshard`, quietly; the binary's path.
fn build(repo: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(repo)
        .args(["build", "--quiet", "--release", "--bin", "fedshard"])
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`cargo build --release --bin fedshard` failed ({status})"
        ));
    }
    Ok(crate::target_dir(repo).join("release/fedshard"))
}
