//! The `fedshard` command line.

pub mod bench;
pub mod bench_cluster;
pub mod bench_job;
pub mod bench_kernels;
pub mod bench_round;
pub mod bench_train;
pub mod cert;
pub mod compare;
pub mod data;
pub mod eval;
pub mod export;
mod fetch_on_use;
pub mod first_run;
mod input;
pub mod join;
pub mod oneshot;
pub mod probs;
mod profile;
pub mod report;
pub mod run;
pub mod sample;
pub mod serve;
pub mod widths;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "fedshard",
    version,
    about = "Federated learning for heterogeneous clients"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Inclusion probabilities and multipliers of a sharding strategy for a spectrum (JSON).
    Probs(probs::ProbsArgs),
    /// Empirical inclusion frequencies of a joint sampler (JSON).
    Sample(sample::SampleArgs),
    /// The units a width strategy (heterofl, fedrolex, fjord) keeps of each hidden width (JSON).
    Widths(widths::WidthsArgs),
    /// Run a whole federation in this process, with a run folder and checkpoints.
    Run(run::RunArgs),
    /// The server node of a federation across machines (client nodes: `join`).
    Serve(serve::ServeArgs),
    /// A client node: host some clients of a `serve`d federation.
    Join(join::JoinArgs),
    /// A private CA and node certificate for TLS between nodes.
    Cert(cert::CertArgs),
    /// Measure the runtime: orchestration overhead, local-training throughput, the cluster transport.
    Bench(bench::BenchArgs),
    /// Every sharding strategy × keep-ratio setup × seed on one config: the paper's Table 1.
    Compare(compare::CompareArgs),
    /// Test accuracy and loss of a finished run's model, and of its spectral truncations.
    Eval(eval::EvalArgs),
    /// A finished run's model (or a config's initial one) as an ONNX file.
    Export(export::ExportArgs),
    /// One self-contained HTML page overlaying finished runs: a figure per metric and a table.
    Report(report::ReportArgs),
    /// One-shot federated learning experiments.
    Oneshot {
        #[command(subcommand)]
        command: oneshot::OneshotCommand,
    },
    /// Fetch datasets into the cache (`data shakespeare`, `data mnist`).
    Data {
        #[command(subcommand)]
        command: data::DataCommand,
    },
}

/// Logs to stderr at `info` (`RUST_LOG` overrides), without ractor_cluster's per-session
/// chatter: the nodes log what matters (refusals, losses, registrations) themselves.
pub(crate) fn init_logging() {
    init_logging_at("info");
}

/// Logs warnings only (`RUST_LOG` overrides): for the in-process commands, whose progress has
/// its own lines, so that what went wrong in a round (failed clients, an unchanged model) is
/// still said.
pub(crate) fn init_warnings() {
    init_logging_at("warn");
}

fn init_logging_at(level: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},ractor=error,ractor_cluster=error"))
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// `--clock wall|virtual`: real time, or simulated time (`[devices]`, `[network]`), over
/// `run.clock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Clock {
    /// Real time: deadlines on the wall clock, stragglers sleep.
    Wall,
    /// Simulated time from the cost model: reproducible, nothing sleeps.
    Virtual,
}

impl From<Clock> for fedshard_actors::clock::ClockKind {
    fn from(clock: Clock) -> Self {
        match clock {
            Clock::Wall => Self::Wall,
            Clock::Virtual => Self::Virtual,
        }
    }
}

/// `--cohorts on|off`: whether neural clients train in cohorts, over `training.cohorts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    pub fn is_on(self) -> bool {
        self == OnOff::On
    }
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    first_run::check(&cli.command)?;
    fetch_on_use::fetch_missing(&cli.command)?;
    match cli.command {
        Command::Probs(args) => print_json(&probs::probs(&args)?),
        Command::Serve(args) => {
            serve::run(&args)?;
            Ok(())
        }
        Command::Join(args) => join::run(&args),
        Command::Eval(args) => {
            let rows = eval::eval(&args)?;
            if args.json {
                print_json(&serde_json::json!({ "rows": rows }))
            } else {
                print!("{}", eval::markdown(&rows));
                Ok(())
            }
        }
        Command::Export(args) => {
            println!("{}", export::export(&args)?);
            Ok(())
        }
        Command::Cert(args) => cert::run(&args),
        Command::Sample(args) => print_json(&sample::sample(&args)?),
        Command::Widths(args) => print_json(&widths::widths(&args)?),
        Command::Run(args) => {
            init_warnings();
            run::run(&args)?;
            Ok(())
        }
        Command::Bench(bench::BenchArgs {
            what: bench::BenchWhat::Orchestration(args),
        }) => {
            let report = bench::orchestration(&args)?;
            if args.json {
                print_json(&report)
            } else {
                println!("{report}");
                Ok(())
            }
        }
        Command::Bench(bench::BenchArgs {
            what: bench::BenchWhat::Job(args),
        }) => {
            init_warnings();
            let report = bench_job::job(&args)?;
            if args.json {
                print_json(&report)
            } else {
                print!("{}", bench_job::describe(&report));
                Ok(())
            }
        }
        Command::Bench(bench::BenchArgs {
            what: bench::BenchWhat::Round(args),
        }) => {
            init_warnings();
            let report = bench_round::round(&args)?;
            if args.json {
                print_json(&report)
            } else {
                println!("{}", bench_round::describe(&report));
                Ok(())
            }
        }
        Command::Bench(bench::BenchArgs {
            what: bench::BenchWhat::Kernels(args),
        }) => bench_kernels::kernels(&args),
        Command::Bench(bench::BenchArgs {
            what: bench::BenchWhat::Train(args),
        }) => {
            let report = bench_train::train_throughput(&args)?;
            if args.json {
                print_json(&report)
            } else {
                println!("{}", bench_train::describe(&report));
                Ok(())
            }
        }
        Command::Bench(bench::BenchArgs {
            what: bench::BenchWhat::Cluster(args),
        }) => {
            let report = bench_cluster::cluster(&args)?;
            if args.json {
                print_json(&report)
            } else {
                println!("{}", bench_cluster::describe(&report));
                Ok(())
            }
        }
        Command::Bench(bench::BenchArgs {
            what: bench::BenchWhat::ClusterNode(args),
        }) => bench_cluster::cluster_node(&args),
        Command::Oneshot { command } => oneshot::run(command),
        Command::Data { command } => data::run(command),
        Command::Compare(args) => {
            init_warnings();
            compare::run(&args)
        }
        Command::Report(args) => report::run(&args),
    }
}
