//! `fedshard bench cluster`: what the cluster transport costs. The same federation runs twice,
//! once in this process (`server::run`) and once as a server node in this process with
//! `--nodes` client nodes as child processes (`fedshard bench cluster-node`) on loopback; every
//! client returns its task unchanged, so the difference is the transport. The client nodes
//! connect through a relay in this process that counts every TCP byte both ways: the bytes on
//! the wire per round, set against the physical floor of one model down and one update up per
//! participant.

use super::bench::peak_rss_bytes;
use crate::config::Config;
use crate::federation;
use anyhow::{Context, anyhow};
use clap::Args;
use fedshard_actors::coordinator::{ClientRecord, Registry};
use fedshard_actors::record::RoundRecord;
use fedshard_actors::server::Federation;
use fedshard_cluster::acceptor::Limits;
use fedshard_cluster::join::{JoinOptions, format_ids, join, parse_ids};
use fedshard_cluster::metrics::ClusterMetrics;
use fedshard_cluster::model_spec::ModelSpec;
use fedshard_cluster::secret::{ENV_VAR, Secret};
use fedshard_cluster::serve::{ServeOptions, serve};
use fedshard_protocol::model::{ModelState, NamedTensor};
use fedshard_protocol::task::{ClientId, LocalTrainer, Recipe};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Args)]
pub struct ClusterBenchArgs {
    /// Client nodes (child processes).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    #[arg(long, default_value_t = 100)]
    pub clients_per_node: usize,
    /// Rounds per run; every client takes part in every round.
    #[arg(long, default_value_t = 5)]
    pub rounds: u64,
    /// f32 parameters of the model each participant receives and returns.
    #[arg(long, default_value_t = 10_000)]
    pub params: usize,
    /// Where the client nodes connect (the byte-counting relay in front of the server node).
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Start no client node: wait for `--nodes` nodes started elsewhere, each
    /// `fedshard bench cluster-node --server LISTEN --clients LIST --params P` with the same
    /// `$FEDSHARD_SECRET` (node k hosting clients k·C to k·C + C − 1); `cargo xtask wan
    /// --bench-cluster C` starts them on hosts of their own.
    #[arg(long)]
    pub external_nodes: bool,
    #[arg(long)]
    pub json: bool,
}

/// One client node of the benchmark (started by `bench cluster`; the secret comes in
/// `$FEDSHARD_SECRET`). It prints `{"peak_rss_bytes": N}` when the run ends.
#[derive(Debug, Args)]
pub struct ClusterNodeArgs {
    #[arg(long)]
    pub server: String,
    #[arg(long)]
    pub clients: String,
    #[arg(long)]
    pub params: usize,
}

#[derive(Debug, Serialize)]
pub struct ClusterReport {
    pub nodes: usize,
    pub clients: usize,
    pub rounds: u64,
    pub params: usize,
    /// `ModelState::to_bytes` of the model.
    pub model_bytes: usize,
    pub in_process_seconds_per_round: f64,
    pub cluster_seconds_per_round: f64,
    /// Cluster minus in-process, per round and per participant.
    pub overhead_seconds_per_round: f64,
    pub overhead_per_client_us: f64,
    /// TCP payload bytes through the relay per round, both directions (rounds 2..R).
    pub wire_bytes_per_round: f64,
    /// fedshard frames sent and received by the gateway per round (without ractor_cluster's
    /// envelope).
    pub frame_bytes_per_round: f64,
    /// One model down and one update up per participant.
    pub floor_bytes_per_round: f64,
    pub wire_over_floor: f64,
    pub peak_rss_bytes: u64,
}

use super::bench::{EchoTrainer, NoEvaluation};

fn model(params: usize) -> anyhow::Result<ModelState> {
    ModelState::new(vec![NamedTensor::zeros("weight", vec![params])]).map_err(anyhow::Error::msg)
}

/// The benchmark's federation: the runtime settings of a small built-in config (so this code
/// does not spell out every runtime field), with `clients` one-sample clients, all of them in
/// every round, an unsharded model of `params` zeros, and no evaluation.
fn federation(clients: usize, rounds: u64, params: usize) -> anyhow::Result<Federation> {
    let text = format!(
        "[run]\nname = \"bench-cluster\"\nseed = 1\nrounds = {rounds}\n\n\
         [data]\ndataset = \"digits\"\nclients = 2\n\n[model]\nkind = \"softmax\"\n\n\
         [federation]\nclients_per_round = 2\ndeadline_ms = 600000\n"
    );
    let config: Config = toml::from_str(&text).context("the benchmark's built-in config")?;
    let mut fed = federation::server(&config)?;
    fed.config.sharding = None;
    fed.config.cosine_schedule = false;
    fed.model = model(params)?;
    fed.evaluator = Arc::new(NoEvaluation);
    fed.registry = Registry {
        clients: (0..clients as ClientId)
            .map(|id| {
                let record = ClientRecord {
                    id,
                    keep_ratio: 1.0,
                    samples: 1,
                    failures: 0,
                };
                (id, record)
            })
            .collect(),
        budget: clients as f64,
        ..fed.registry
    };
    Ok(fed)
}

fn trainers(ids: &[ClientId]) -> BTreeMap<ClientId, Arc<dyn LocalTrainer>> {
    let echo = EchoTrainer::on_a_core();
    ids.iter().map(|&id| (id, Arc::clone(&echo))).collect()
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// Accepts connections on `listener` and forwards each to `target`, adding every byte it
/// carries, both ways, to `bytes`.
async fn relay(listener: TcpListener, target: SocketAddr, bytes: Arc<AtomicU64>) {
    while let Ok((inbound, _)) = listener.accept().await {
        let bytes = Arc::clone(&bytes);
        tokio::spawn(async move {
            // The client nodes may dial before the server node listens: wait for it.
            let mut outbound = None;
            for _ in 0..300 {
                if let Ok(stream) = TcpStream::connect(target).await {
                    outbound = Some(stream);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let Some(outbound) = outbound else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            let up = tokio::spawn(pump(ri, wo, Arc::clone(&bytes)));
            let down = tokio::spawn(pump(ro, wi, bytes));
            let _ = tokio::join!(up, down);
        });
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    bytes: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

/// Kills the benchmark's client nodes if the benchmark ends early.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn cluster(args: &ClusterBenchArgs) -> anyhow::Result<ClusterReport> {
    anyhow::ensure!(
        args.nodes >= 1 && args.clients_per_node >= 1 && args.rounds >= 2 && args.params >= 1,
        "--nodes, --clients-per-node and --params must be at least 1, --rounds at least 2"
    );
    if std::env::var_os("RUST_LOG").is_some() {
        super::init_logging();
    }
    let clients = args.nodes * args.clients_per_node;
    let ids: Vec<ClientId> = (0..clients as ClientId).collect();
    let runtime = crate::runtime::build()?;
    let model_bytes = model(args.params)?.to_bytes().len();

    // In process.
    let fed = federation(clients, args.rounds, args.params)?;
    let (_, summary) = runtime
        .block_on(fedshard_actors::server::run(fed, trainers(&ids)))
        .map_err(anyhow::Error::msg)?;
    let in_process = mean(summary.per_round.iter().map(|r| r.seconds));

    // Across processes.
    // 64 hex digits, as `openssl rand -hex 32` makes (a secret needs 128 bits of entropy).
    let secret = if args.external_nodes {
        std::env::var(ENV_VAR)
            .with_context(|| format!("--external-nodes: the nodes' secret must be in ${ENV_VAR}"))?
    } else {
        format!(
            "{:032x}{:032x}",
            rand::random::<u128>(),
            rand::random::<u128>()
        )
    };
    let listen: SocketAddr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?
    };
    let wire = Arc::new(AtomicU64::new(0));
    let relay_listener = runtime
        .block_on(TcpListener::bind(args.listen))
        .with_context(|| format!("--listen {}", args.listen))?;
    let relay_addr = relay_listener.local_addr()?;
    runtime.spawn(relay(relay_listener, listen, Arc::clone(&wire)));
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut children = Children(Vec::new());
    if args.external_nodes {
        eprintln!(
            "bench cluster: waiting for {} client nodes at {relay_addr}",
            args.nodes
        );
    }
    for node in (0..args.nodes).filter(|_| !args.external_nodes) {
        let first = node * args.clients_per_node;
        let list = format_ids(&ids[first..first + args.clients_per_node]);
        let child = Command::new(&exe)
            .args(["bench", "cluster-node", "--server"])
            .arg(relay_addr.to_string())
            .args(["--clients", &list, "--params", &args.params.to_string()])
            .env(ENV_VAR, &secret)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting client node {node}"))?;
        children.0.push(child);
    }
    let mut fed = federation(clients, args.rounds, args.params)?;
    let (events, mut receiver) = tokio::sync::mpsc::unbounded_channel::<RoundRecord>();
    fed.events = Some(events);
    let metrics = ClusterMetrics::new();
    let options = ServeOptions {
        listen,
        secret: Secret::new(&secret).map_err(anyhow::Error::msg)?,
        tls: None,
        limits: Limits::default(),
        model_bytes,
        model: ModelSpec::of("bench", &model(args.params)?),
        finish_grace: Duration::from_secs(5),
        metrics: metrics.clone(),
    };
    let watched = Arc::clone(&wire);
    let frames = metrics.clone();
    let watcher = runtime.spawn(async move {
        let mut marks = Vec::new();
        while let Some(record) = receiver.recv().await {
            let (i, o) = frames.frame_bytes();
            marks.push((record, watched.load(Ordering::Relaxed), i + o));
        }
        marks
    });
    let (_, summary) = runtime
        .block_on(serve(options, fed))
        .map_err(|e| anyhow!("the cluster run: {e}"))?;
    let marks = runtime.block_on(watcher)?;
    for child in &mut children.0 {
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "a client node exited with {status}");
    }
    let cluster = mean(summary.per_round.iter().map(|r| r.seconds));
    let per_round = |f: fn(&(RoundRecord, u64, u64)) -> u64| {
        mean(marks.windows(2).map(|w| (f(&w[1]) - f(&w[0])) as f64))
    };
    let wire_bytes = per_round(|m| m.1);
    let frame_bytes = per_round(|m| m.2);
    let floor = (2 * clients * model_bytes) as f64;
    Ok(ClusterReport {
        nodes: args.nodes,
        clients,
        rounds: args.rounds,
        params: args.params,
        model_bytes,
        in_process_seconds_per_round: in_process,
        cluster_seconds_per_round: cluster,
        overhead_seconds_per_round: cluster - in_process,
        overhead_per_client_us: (cluster - in_process) / clients as f64 * 1e6,
        wire_bytes_per_round: wire_bytes,
        frame_bytes_per_round: frame_bytes,
        floor_bytes_per_round: floor,
        wire_over_floor: wire_bytes / floor,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// A client node of echo clients.
pub fn cluster_node(args: &ClusterNodeArgs) -> anyhow::Result<()> {
    super::init_logging();
    let ids = parse_ids(&args.clients).map_err(|e| anyhow!("option --clients: {e}"))?;
    let options = JoinOptions {
        server: args.server.clone(),
        node: format!("bench:{}", args.clients),
        secret: Secret::load(None).map_err(anyhow::Error::msg)?,
        tls: None,
        listen: "127.0.0.1:0".parse()?,
        model_bytes: model(args.params)?.to_bytes().len(),
        connect_timeout: Duration::from_secs(60),
        reconnect_timeout: Duration::from_secs(10),
        metrics: ClusterMetrics::new(),
        key: None,
        tap: None,
        recipe: Recipe::default(),
        model: ModelSpec::of("bench", &model(args.params)?),
        variates: fedshard_actors::variates::ClientVariates::in_memory(),
    };
    let runtime = crate::runtime::build()?;
    runtime
        .block_on(join(options, trainers(&ids)))
        .map_err(anyhow::Error::msg)?;
    println!("{{\"peak_rss_bytes\":{}}}", peak_rss_bytes());
    Ok(())
}

pub fn describe(r: &ClusterReport) -> String {
    format!(
        "cluster: {} nodes × {} clients, {} rounds, model {} B ({} params)\n\
         seconds per round: in-process {:.4}, cluster {:.4} (+{:.4}, {:.1} µs per client)\n\
         bytes per round: wire {:.0} (frames {:.0}), floor {:.0} (one model down and one \
         update up per participant): {:.3}× the floor",
        r.nodes,
        r.clients / r.nodes.max(1),
        r.rounds,
        r.model_bytes,
        r.params,
        r.in_process_seconds_per_round,
        r.cluster_seconds_per_round,
        r.overhead_seconds_per_round,
        r.overhead_per_client_us,
        r.wire_bytes_per_round,
        r.frame_bytes_per_round,
        r.floor_bytes_per_round,
        r.wire_over_floor
    )
}
