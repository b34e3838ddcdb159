//! `cargo xtask wan --bench-cluster C`: `fedshard bench cluster --external-nodes` on the server
//! host and a `bench cluster-node` of C echo clients on each client host, so the orchestration
//! cost is measured over real links; prints the bench's report and each host's peak memory.

use super::files::{json_line, peak_rss_bytes};
use super::options::Options;
use super::process::{Proc, Progress, Scratch, progress, random_secret};
use serde::Serialize;
use std::fs;
use std::time::{Duration, Instant};

/// Runs the bench; `Ok(true)` once every process ended well.
pub fn run(
    bin: &str,
    options: &Options,
    clients_per_node: usize,
    params: usize,
) -> Result<bool, String> {
    let scratch = Scratch::new()?;
    let secret = random_secret()?;
    let network = super::network(options)?;
    let listen = super::listen_address();
    let rounds = options.rounds.unwrap_or(3).to_string();
    let (nodes, params) = (options.nodes.to_string(), params.to_string());
    let mut server = network.command(0, bin);
    server.args(["bench", "cluster", "--external-nodes", "--json"]);
    server.args(["--listen", &listen, "--nodes", &nodes]);
    server.args(["--clients-per-node", &clients_per_node.to_string()]);
    server.args(["--params", &params, "--rounds", &rounds]);
    server.env("FEDSHARD_SECRET", &secret);
    let report = scratch.path().join("report.json");
    let out = fs::File::create(&report).map_err(|e| format!("{}: {e}", report.display()))?;
    let mut processes = vec![Proc::spawn_to(
        "bench-cluster",
        server,
        scratch.path(),
        out,
    )?];
    // The nodes start once the server has run the federation in one process and listens.
    let started = Instant::now();
    while !processes[0].log().contains("waiting for") {
        if let Progress::Failed { name, tail } = progress(&mut processes)? {
            return Err(Progress::failure(&name, &tail));
        }
        if started.elapsed() > Duration::from_secs(3600) {
            return Err("bench cluster did not start listening within an hour".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for node in 1..=options.nodes {
        let first = (node - 1) * clients_per_node;
        let list = format!("{first}-{}", first + clients_per_node - 1);
        let mut join = network.command(node, bin);
        join.args(["bench", "cluster-node", "--server", &listen]);
        join.args(["--clients", &list, "--params", &params]);
        join.env("FEDSHARD_SECRET", &secret);
        let path = scratch.path().join(format!("node-{node}.json"));
        let out = fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = format!("node-{node}");
        processes.push(Proc::spawn_to(&name, join, scratch.path(), out)?);
    }
    loop {
        match progress(&mut processes)? {
            Progress::Running => std::thread::sleep(Duration::from_millis(100)),
            Progress::Done => break,
            Progress::Failed { name, tail } => return Err(Progress::failure(&name, &tail)),
        }
    }
    drop(network);
    let text = fs::read_to_string(&report).map_err(|e| format!("{}: {e}", report.display()))?;
    println!("{}", text.trim());
    /// A client host's line.
    #[derive(Serialize)]
    struct Host {
        host: usize,
        clients: usize,
        peak_rss_bytes: u64,
    }
    for host in 1..=options.nodes {
        let path = scratch.path().join(format!("node-{host}.json"));
        let line = json_line(&Host {
            host,
            clients: clients_per_node,
            peak_rss_bytes: peak_rss_bytes(&path)?,
        })?;
        println!("{line}");
    }
    Ok(true)
}
