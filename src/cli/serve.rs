//! `fedshard serve`: the server node of a federation across machines. It holds the model, the
//! coordinator, the checkpoints and the metrics, like `fedshard run`, and no client: client
//! nodes (`fedshard join`) connect and register theirs, and the first round starts once every
//! client of the config is there.

use crate::config::{Config, Overrides};
use crate::federation;
use anyhow::anyhow;
use clap::Args;
use fedshard_actors::checkpoint::write_atomically;
use fedshard_actors::metrics::Exporter;
use fedshard_actors::record::{RoundRecord, Summary};
use fedshard_actors::run_folder::MODEL_FILE;
use fedshard_cluster::acceptor::Limits;
use fedshard_cluster::metrics::ClusterMetrics;
use fedshard_cluster::model_spec::ModelSpec;
use fedshard_cluster::secret::Secret;
use fedshard_cluster::serve::{ServeOptions, serve};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The TOML config; start every client node from the same file. Not needed with --resume.
    #[arg(required_unless_present = "resume")]
    pub config: Option<PathBuf>,
    /// Where client nodes connect, IP:PORT (`0.0.0.0:PORT` for every interface; open PORT in
    /// the firewall).
    #[arg(long, value_name = "IP:PORT")]
    pub listen: SocketAddr,
    /// Run folder (default: runs/NAME-seedS). Refused if it already holds a checkpoint.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in this folder from its last checkpoint; client nodes reconnect by
    /// themselves.
    #[arg(long, conflicts_with_all = ["config", "out"])]
    pub resume: Option<PathBuf>,
    /// Override `run.rounds`.
    #[arg(long)]
    pub rounds: Option<u64>,
    /// File holding the shared secret of the federation (else `$FEDSHARD_SECRET`); required.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// TLS: this node's certificate chain (PEM); client nodes then need `--tls-ca`.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: the private key of `--tls-cert` (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: accept only client nodes whose certificate this CA signed (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve Prometheus metrics on IP:PORT, or `off` (default: the config's, else
    /// 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR|off")]
    pub metrics_addr: Option<String>,
    /// Keep serving /metrics this many seconds after the last round (at most a day).
    #[arg(long, value_name = "SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=MAX_LINGER_SECONDS))]
    pub linger: u64,
    /// After the last round, wait up to this many seconds for client nodes to hear that the
    /// run is over, and for nodes lost during the run (frozen, cut off, displaced) to come back
    /// and hear it: they then exit 0 instead of reconnecting in vain until their timeout.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub finish_grace: u64,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// Seconds a connecting node has, from its TCP connection, to finish TLS and the secret's
    /// challenge; then it is cut (and counted, `reason="handshake_timeout"`).
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds,
          default_value_t = Limits::default().handshake_timeout.as_secs_f64())]
    pub handshake_timeout: f64,
    /// Connections that may wait to authenticate at once; more are refused at accept. Default:
    /// 512, or fewer if the open-file limit (raised to its hard limit at start) leaves less
    /// once descriptors are kept for the run's own files and sessions; a larger value is refused.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_unauthenticated: Option<u32>,
    /// Connections from one source that may wait to authenticate at once: an IPv4 address, or an
    /// IPv6 /64 (a host can pick any address in its /64).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..),
          default_value_t = Limits::default().max_unauthenticated_per_ip as u32)]
    pub max_unauthenticated_per_ip: u32,
    /// The largest frame a node may send before it authenticates, in bytes, from 4096 to 16 MiB
    /// (the handshake's frames are under 1 KiB; the model-sized cap applies after).
    #[arg(long, value_name = "BYTES",
          value_parser = clap::value_parser!(u64).range(4096..=MAX_PREAUTH_FRAME_CAP),
          default_value_t = Limits::default().preauth_frame_cap)]
    pub preauth_frame_cap: u64,
}

/// ractor_cluster's own frame cap (16 MiB): a pre-authentication cap above it would never
/// apply.
const MAX_PREAUTH_FRAME_CAP: u64 = 16 << 20;

/// A duration in seconds for `--handshake-timeout`: from 0.05 (a TLS handshake and the
/// secret's challenge take a few round trips; less cuts every node) to an hour.
/// The longest `--linger` (of `serve` and `run`): a day outlasts any scrape interval, and a larger number is a typo
/// that would keep the server and its port for ever (and overflow the sleep's deadline).
pub(crate) const MAX_LINGER_SECONDS: u64 = 86_400;

fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.05..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "expected seconds, from 0.05 to 3600, such as 5 or 0.5; got `{text}`"
        )),
    }
}

impl ServeArgs {
    /// The limits on unauthenticated peers, `--max-unauthenticated` sized from the open-file
    /// limit (raised here to its hard limit) for a federation of `clients` clients.
    fn limits(&self, clients: usize) -> anyhow::Result<Limits> {
        let files = fedshard_cluster::descriptors::raise();
        let max_unauthenticated = fedshard_cluster::descriptors::max_unauthenticated(
            self.max_unauthenticated.map(|n| n as usize),
            files,
            clients,
        )
        .map_err(anyhow::Error::msg)?;
        Ok(Limits {
            handshake_timeout: std::time::Duration::from_secs_f64(self.handshake_timeout),
            max_unauthenticated,
            max_unauthenticated_per_ip: self.max_unauthenticated_per_ip as usize,
            preauth_frame_cap: self.preauth_frame_cap,
        })
    }
}

use super::run::{live_page, metrics_addr, run_state, save_config};

/// The config and run folder of a new or resumed run.
fn run_folder(args: &ServeArgs) -> anyhow::Result<(Config, PathBuf)> {
    let overrides = Overrides {
        rounds: args.rounds,
        ..Overrides::default()
    };
    super::run::run_folder(
        "serve",
        args.resume.as_deref(),
        args.config.as_deref(),
        args.out.as_deref(),
        &overrides,
    )
}

pub fn run(args: &ServeArgs) -> anyhow::Result<Summary> {
    super::init_logging();
    let (config, dir) = run_folder(args)?;
    // Everything that can be wrong on the command line fails before the run folder is touched.
    let secret = Secret::load(args.secret_file.as_deref()).map_err(anyhow::Error::msg)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            fedshard_cluster::tls::acceptor(cert, key, args.tls_client_ca.as_deref())
                .map_err(anyhow::Error::msg)?,
        ),
        _ => None,
    };
    let metrics_addr = metrics_addr(args.metrics_addr.as_deref(), &config)?;
    let limits = args.limits(config.data.clients())?;
    config.log_warnings();
    let mut fed = federation::server(&config)?;
    fed.run_dir = Some(dir.clone());
    // As `run`: a missing or damaged checkpoint leaves the folder as it was.
    if args.resume.is_some() {
        fed.resume_from_checkpoint().map_err(anyhow::Error::msg)?;
    }
    save_config(&dir, &config)?;
    let (events, mut receiver) = tokio::sync::mpsc::unbounded_channel::<RoundRecord>();
    fed.events = Some(events);
    let rounds = config.run.rounds;
    let done = fed.history.len() as u64;
    let step = config.federation.schedule.step();
    if !args.quiet && !fed.history.is_empty() {
        eprintln!("resuming after {step} {} of {rounds}", fed.history.len());
    }
    let cluster = ClusterMetrics::new();
    let options = ServeOptions {
        listen: args.listen,
        secret,
        tls,
        limits,
        model_bytes: fed.model.to_bytes().len(),
        model: ModelSpec::of(config.model.kind(), &fed.model),
        finish_grace: std::time::Duration::from_secs(args.finish_grace),
        metrics: cluster.clone(),
    };
    let runtime = crate::runtime::build()?;
    let (result, exporter) = runtime.block_on(async {
        let mut exporter = match metrics_addr {
            Some(addr) => Some(Exporter::start(addr, &config.run.name).await.map_err(|e| {
                anyhow!("{e} (set by --metrics-addr or `metrics.addr`; `off` disables)")
            })?),
            None => None,
        };
        let to_exporter = exporter.as_ref().map(Exporter::sender);
        if let Some(exporter) = &exporter {
            for collector in cluster.collectors() {
                exporter.register(collector)?;
            }
            let page = live_page(&config, &dir, done).with_nodes(cluster.clone());
            exporter.serve_page(std::sync::Arc::new(page));
            if !args.quiet {
                eprintln!(
                    "live page on http://{0}/ · metrics on http://{0}/metrics",
                    exporter.addr()
                );
            }
        }
        if let Some(sender) = &to_exporter {
            for record in &fed.history {
                let _ = sender.send(record.clone());
            }
        }
        let quiet = args.quiet;
        let watcher = tokio::spawn(async move {
            while let Some(record) = receiver.recv().await {
                if !quiet {
                    eprintln!("{step} {}", progress_line(&record, rounds));
                }
                if let Some(sender) = &to_exporter {
                    let _ = sender.send(record);
                }
            }
        });
        let result = serve(options, fed).await;
        let _ = watcher.await;
        if let Some(exporter) = &mut exporter {
            exporter.flush().await;
        }
        anyhow::Ok((result, exporter))
    })?;
    let finished = result
        .map_err(anyhow::Error::msg)
        .and_then(|(model, summary)| {
            write_atomically(&dir.join(MODEL_FILE), &model.to_file_bytes())?;
            summary.save(&dir)?;
            crate::report::write_run_plots(&dir, &summary.per_round)?;
            if !args.quiet {
                eprintln!(
                    "{} {step}s, final accuracy {:.4}, loss {:.4}",
                    summary.rounds_completed, summary.final_accuracy, summary.final_loss
                );
            }
            Ok(summary)
        });
    if let Some(exporter) = exporter {
        exporter.set_state(run_state(&finished));
        runtime.block_on(async {
            if finished.is_ok() && args.linger > 0 {
                tokio::time::sleep(std::time::Duration::from_secs(args.linger)).await;
            }
            exporter.shutdown().await;
        });
    }
    finished
}

fn progress_line(r: &RoundRecord, rounds: u64) -> String {
    format!(
        "{}/{rounds}: acc {:.4} loss {:.4} | {} ok, {} failed, {} rejected | {:.2} Mbit up | {:.2} s",
        r.round,
        r.accuracy,
        r.loss,
        r.successes,
        r.failures_total(),
        r.rejected_total(),
        r.uplink_bits as f64 / 1e6,
        r.seconds
    )
}

#[cfg(test)]
mod tests {
    use super::positive_seconds;

    #[test]
    fn a_preauth_frame_cap_above_ractor_clusters_frame_cap_is_refused_naming_the_option() {
        use clap::Parser;
        let parse = |cap: &str| {
            crate::cli::Cli::try_parse_from([
                "fedshard",
                "serve",
                "c.toml",
                "--listen",
                "127.0.0.1:1",
                "--preauth-frame-cap",
                cap,
            ])
        };
        let error = parse("99999999999999").err().unwrap().to_string();
        assert!(error.contains("--preauth-frame-cap"), "{error}");
        assert!(parse("16777216").is_ok() && parse("4096").is_ok());
        assert!(parse("16777217").is_err() && parse("4095").is_err());
    }

    #[test]
    fn a_linger_above_a_day_is_refused_naming_the_option() {
        use clap::Parser;
        let serve = |seconds: &str| {
            crate::cli::Cli::try_parse_from([
                "fedshard",
                "serve",
                "c.toml",
                "--listen",
                "127.0.0.1:1",
                "--linger",
                seconds,
            ])
        };
        let run = |seconds: &str| {
            crate::cli::Cli::try_parse_from(["fedshard", "run", "c.toml", "--linger", seconds])
        };
        for parse in [&serve as &dyn Fn(&str) -> _, &run] {
            let error = parse("18446744073709551615").err().unwrap().to_string();
            assert!(
                error.contains("--linger") && error.contains("86400"),
                "{error}"
            );
            assert!(parse("86401").is_err());
            assert!(parse("0").is_ok() && parse("86400").is_ok());
        }
    }

    #[test]
    fn a_handshake_timeout_is_positive_finite_and_at_most_an_hour() {
        assert_eq!(positive_seconds("5"), Ok(5.0));
        assert_eq!(positive_seconds("0.5"), Ok(0.5));
        assert_eq!(positive_seconds("0.05"), Ok(0.05));
        for bad in ["0", "0.001", "-1", "inf", "NaN", "3601", "five"] {
            let error = positive_seconds(bad).unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }
}
