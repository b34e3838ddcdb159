//! What `cargo xtask wan` is asked, parsed by clap: the network (hosts and their rates) and the
//! work it runs, a config's federation or `fedshard bench cluster`. Each flag's rule (its range,
//! which flags go together) is stated once, here, on the flag.

use clap::{ArgGroup, Parser};
use std::path::PathBuf;

const LONG_ABOUT: &str = "\
Makes a bridge and N+1 network namespaces (a server host 10.77.0.1 and client hosts 10.77.0.2…,
each uplink limited to R Mbit/s with tbf; the server's to --server-mbit, default R), runs
`fedshard serve CONFIG` on the server host and `fedshard join CONFIG` on each client host (the
config's clients split evenly), prints one line per round (seconds, accuracy, bytes up and down
as the run counted them) and last the links' byte counts and the final model's digest beside
`fedshard bench job CONFIG`'s in-process digest; exits 1 if they differ. Removes every
namespace at the end, also on failure. Needs root and iproute2 (`ip`, `tc`).

With --bench-cluster C instead of a config: `fedshard bench cluster` (echo clients, a model of
--params f32 values; --rounds default 3) with C clients on each client host: its report (µs per
client per round against the same federation in one process) and each host's peak memory.";

/// What `cargo xtask wan` was asked.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask wan",
    about = "A federation over network namespaces with rate-limited links",
    long_about = LONG_ABOUT,
    after_help = "example: cargo xtask wan --nodes 3 --uplink-mbit 10 --config config/digits-linear.toml --json",
    group(ArgGroup::new("work").required(true).args(["config", "bench_cluster"])),
)]
pub struct Options {
    /// Client hosts, 1 to 253 (the server host is one more).
    #[arg(long, value_name = "N", value_parser = client_hosts)]
    pub nodes: usize,
    /// Each client host's uplink, in Mbit/s.
    #[arg(long, value_name = "R", value_parser = rate)]
    pub uplink_mbit: f64,
    /// The server host's uplink, in Mbit/s [default: --uplink-mbit].
    #[arg(long, value_name = "R", value_parser = rate)]
    server_mbit: Option<f64>,
    /// The federation's config: `fedshard serve` and `fedshard join` run it.
    #[arg(long, value_name = "CONFIG")]
    config: Option<PathBuf>,
    /// Instead of a config, `fedshard bench cluster` with this many echo clients per host.
    #[arg(long, value_name = "C", value_parser = at_least_one, conflicts_with_all = ["out", "json"])]
    bench_cluster: Option<usize>,
    /// The bench's model size, in f32 values [default: 100]; only with --bench-cluster.
    #[arg(long, value_name = "P", value_parser = at_least_one, conflicts_with = "config")]
    params: Option<usize>,
    /// Rounds to run [default: the config's; 3 for --bench-cluster].
    #[arg(long, value_name = "N")]
    pub rounds: Option<u64>,
    /// The fedshard binary [default: `cargo build --release`, then target/release/fedshard].
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,
    /// Keep the served run folder here [default: a temporary folder, removed].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// One JSON object a line instead of prose.
    #[arg(long)]
    pub json: bool,
}

/// What the federation runs.
pub enum Work<'a> {
    /// `fedshard serve` and `fedshard join` on this config.
    Config(&'a PathBuf),
    /// `fedshard bench cluster` with this many echo clients per host and a model of `params`.
    Bench {
        clients_per_node: usize,
        params: usize,
    },
}

impl Options {
    /// Parses `cargo xtask wan`'s arguments (without the program name).
    pub fn parse_args(args: &[String]) -> Result<Self, clap::Error> {
        Self::try_parse_from(
            std::iter::once("cargo xtask wan").chain(args.iter().map(String::as_str)),
        )
    }

    /// The server host's uplink: `--server-mbit`, else the client hosts'.
    pub fn server_mbit(&self) -> f64 {
        self.server_mbit.unwrap_or(self.uplink_mbit)
    }

    /// The work asked; clap's `work` group has made sure that exactly one was.
    pub fn work(&self) -> Result<Work<'_>, String> {
        match (&self.config, self.bench_cluster) {
            (Some(config), None) => Ok(Work::Config(config)),
            (None, Some(clients_per_node)) => Ok(Work::Bench {
                clients_per_node,
                params: self.params.unwrap_or(100),
            }),
            _ => Err("give one of --config and --bench-cluster".into()),
        }
    }
}

fn client_hosts(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(n @ 1..=253) => Ok(n),
        _ => Err(format!("expected 1 to 253 client hosts, got `{text}`")),
    }
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(n @ 1..) => Ok(n),
        _ => Err(format!("expected a count of at least 1, got `{text}`")),
    }
}

fn rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 100_000.0 => Ok(r),
        _ => Err(format!(
            "expected a rate in Mbit/s, more than 0 and at most 100000, such as 10; got `{text}`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, clap::Error> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        Options::parse_args(&args)
    }

    #[test]
    fn a_config_run_takes_the_server_rate_from_the_uplink_unless_given() {
        let o = parse("--nodes 3 --uplink-mbit 10 --config c.toml --json").unwrap();
        assert_eq!((o.nodes, o.uplink_mbit, o.server_mbit()), (3, 10.0, 10.0));
        assert!(o.json);
        assert!(matches!(o.work(), Ok(Work::Config(c)) if c == &PathBuf::from("c.toml")));
        let o = parse("--nodes 3 --uplink-mbit 10 --server-mbit 100 --config c.toml").unwrap();
        assert_eq!(o.server_mbit(), 100.0);
    }

    #[test]
    fn a_bench_run_has_a_default_model_size() {
        let o = parse("--nodes 8 --uplink-mbit 100 --bench-cluster 12500").unwrap();
        assert!(matches!(
            o.work(),
            Ok(Work::Bench {
                clients_per_node: 12500,
                params: 100
            })
        ));
    }

    /// Each refusal names the flag and what it expects.
    #[test]
    fn bad_flags_are_refused_with_what_was_expected() {
        for (line, expected) in [
            (
                "--nodes 0 --uplink-mbit 10 --config c",
                "expected 1 to 253 client hosts",
            ),
            (
                "--nodes 254 --uplink-mbit 10 --config c",
                "expected 1 to 253 client hosts",
            ),
            (
                "--nodes 3 --uplink-mbit 0 --config c",
                "expected a rate in Mbit/s",
            ),
            (
                "--nodes 3 --uplink-mbit inf --config c",
                "expected a rate in Mbit/s",
            ),
            ("--nodes 3 --uplink-mbit 10", "--config"),
            (
                "--nodes 3 --uplink-mbit 10 --config c --bench-cluster 2",
                "cannot be used with",
            ),
            ("--nodes 3 --uplink-mbit 10 --bench-cluster 0", "at least 1"),
            (
                "--nodes 3 --uplink-mbit 10 --config c --params 5",
                "cannot be used with",
            ),
            (
                "--nodes 3 --uplink-mbit 10 --bench-cluster 2 --json",
                "cannot be used with",
            ),
            ("--uplink-mbit 10 --config c", "--nodes"),
            ("--nodes 3 --uplink-mbit 10 --config c --bogus", "--bogus"),
        ] {
            let error = parse(line).expect_err(line).to_string();
            assert!(error.contains(expected), "{line}: {error}");
        }
    }
}
