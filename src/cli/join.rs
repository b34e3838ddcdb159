//! `fedshard join`: a client node. It builds the trainers of the clients it is given from the
//! same config as the server (so each trains exactly the data it trains in a one-process run),
//! connects to the server node, and trains whatever the server asks until the run is over,
//! reconnecting if the server goes away and comes back (`fedshard serve --resume`).

use crate::config::Config;
use crate::federation;
use anyhow::Context;
use clap::Args;
use fedshard_actors::variates::ClientVariates;
use fedshard_cluster::join::{JoinOptions, join, parse_ids};
use fedshard_cluster::metrics::ClusterMetrics;
use fedshard_cluster::model_spec::ModelSpec;
use fedshard_cluster::node::TlsClient;
use fedshard_cluster::secret::Secret;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The TOML config the server node was started from (the same file).
    pub config: PathBuf,
    /// The server node, HOST:PORT (its `--listen` port).
    #[arg(long, value_name = "HOST:PORT")]
    pub server: String,
    /// The clients this node hosts: ids and ranges, e.g. `0-9,12`.
    #[arg(long, value_name = "LIST")]
    pub clients: String,
    /// This node's name, stable across restarts: a node restarted under the same name takes
    /// its clients back. Default: `HOSTNAME:LIST`.
    #[arg(long)]
    pub name: Option<String>,
    /// File holding the shared secret of the federation (else `$FEDSHARD_SECRET`); required.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// TLS: the CA that signed the server's certificate (PEM); turns TLS on.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// TLS: the name the server's certificate must carry (default: the host of --server).
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// Mutual TLS: this node's certificate (PEM), for a server started with --tls-client-ca.
    #[arg(long, value_name = "PEM", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// Mutual TLS: the private key of --tls-cert (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Seconds to keep trying to reach the server at start.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub connect_timeout: u64,
    /// Seconds to keep trying to reach the server again after losing it.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub reconnect_timeout: u64,
    /// Where this node's own cluster listener binds (nothing needs to reach it).
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The folder where this node keeps its clients' SCAFFOLD control variates (one file a
    /// client), so that they survive a restart of the node; required when the config sets
    /// `federation.scaffold`.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "node".into())
}

pub fn run(args: &JoinArgs) -> anyhow::Result<()> {
    super::init_logging();
    let config = Config::load(&args.config)?;
    let ids = parse_ids(&args.clients).map_err(|e| anyhow::anyhow!("option --clients: {e}"))?;
    let secret = Secret::load(args.secret_file.as_deref()).map_err(anyhow::Error::msg)?;
    let tls = match &args.tls_ca {
        Some(ca) => {
            let identity = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
            let connector =
                fedshard_cluster::tls::connector(ca, identity).map_err(anyhow::Error::msg)?;
            let name = match &args.tls_server_name {
                Some(name) => name.clone(),
                None => server_host(&args.server)?,
            };
            Some(TlsClient {
                connector,
                server_name: fedshard_cluster::tls::server_name(&name)
                    .map_err(anyhow::Error::msg)?,
            })
        }
        None => None,
    };
    let trainers = federation::clients(&config, &ids)?;
    let variates = match (&args.state, config.federation.scaffold) {
        (Some(dir), _) => ClientVariates::open(dir, trainers.keys().copied())
            .with_context(|| format!("option --state: {}", dir.display()))?,
        (None, true) => anyhow::bail!(
            "option --state: expected the folder where this node keeps its clients' SCAFFOLD \
             control variates (the config sets `federation.scaffold`), found none"
        ),
        (None, false) => ClientVariates::in_memory(),
    };
    let initial = config.model()?.initial_state(config.run.seed)?;
    let model_bytes = initial.to_bytes().len();
    let model = ModelSpec::of(config.model.kind(), &initial);
    let name = args.name.clone().unwrap_or_else(|| {
        format!(
            "{}:{}",
            hostname(),
            fedshard_cluster::join::format_ids(&ids)
        )
    });
    let options = JoinOptions {
        server: args.server.clone(),
        node: name,
        secret,
        tls,
        listen: args.listen,
        model_bytes,
        connect_timeout: Duration::from_secs(args.connect_timeout),
        reconnect_timeout: Duration::from_secs(args.reconnect_timeout),
        metrics: ClusterMetrics::new(),
        key: None,
        tap: None,
        recipe: federation::recipe(&config),
        model,
        variates,
    };
    let runtime = crate::runtime::build().context("starting the tokio runtime")?;
    runtime
        .block_on(join(options, trainers))
        .map_err(anyhow::Error::msg)?;
    tracing::info!("the server finished the run");
    Ok(())
}

/// The host part of `HOST:PORT` (an IPv6 address in brackets loses them).
fn server_host(server: &str) -> anyhow::Result<String> {
    let (host, _) = server
        .rsplit_once(':')
        .with_context(|| format!("option --server: `{server}` is not HOST:PORT"))?;
    Ok(host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string())
}
