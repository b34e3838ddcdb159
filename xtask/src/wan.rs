//! `cargo xtask wan`: one federation over a network in a box ([`crate::netns`]). A server host
//! runs `fedshard serve`, N client hosts run `fedshard join` (the config's clients split evenly
//! over them), every host's uplink limited to a rate; one line per round with its seconds and
//! the bytes each way as the run counted them; last, the bytes the links carried and the final
//! model's digest beside `fedshard bench job`'s in-process one, which it must equal.
//!
//! Why a task and not a test: it is the figure a user asks before deploying — what a round
//! costs on links like theirs — and the proof that the transport changes nothing.

use crate::netns::{self, Network};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

pub const USAGE: &str = "\
usage: cargo xtask wan --nodes N --uplink-mbit R --config CONFIG [--server-mbit R] [--rounds N]
                       [--bin PATH] [--out DIR] [--json]
       cargo xtask wan --nodes N --uplink-mbit R --bench-cluster C [--params P] [--rounds N] [--bin PATH]

Makes a bridge and N+1 network namespaces (a server host 10.77.0.1 and client hosts 10.77.0.2…,
each uplink limited to R Mbit/s with tbf; the server's to --server-mbit, default R), runs
`fedshard serve CONFIG` on the server host and `fedshard join CONFIG` on each client host (the
config's clients split evenly), prints one line per round (seconds, accuracy, bytes up and down
as the run counted them) and last the links' byte counts and the final model's digest beside
`fedshard bench job CONFIG`'s in-process digest; exits 1 if they differ. Removes every
namespace at the end, also on failure. Needs root and iproute2 (`ip`, `tc`).
--bin: the fedshard binary (default: `cargo build --release`, then target/release/fedshard).
--out: keep the served run folder there (default: a temporary folder, removed).
--bench-cluster C: instead of a config, `fedshard bench cluster` (echo clients, a model of --params
f32 values, default 100; --rounds default 3) with C clients on each client host: its report (µs
per client per round against the same federation in one process) and each host's peak memory.

example: cargo xtask wan --nodes 3 --uplink-mbit 10 --config config/digits-linear.toml --json";

/// What `cargo xtask wan` was asked.
struct Options {
    nodes: usize,
    uplink_mbit: f64,
    server_mbit: f64,
    work: Work,
    rounds: Option<u64>,
    bin: Option<PathBuf>,
    out: Option<PathBuf>,
    json: bool,
}

/// What the federation runs.
enum Work {
    Config(PathBuf),
    /// `fedshard bench cluster` with this many echo clients per host and a model of `params`.
    Bench {
        clients_per_node: usize,
        params: usize,
    },
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut nodes = None;
    let mut uplink = None;
    let mut server = None;
    let mut config = None;
    let mut rounds = None;
    let mut bin = None;
    let mut out = None;
    let mut json = false;
    let mut bench = None;
    let mut params = 100;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--nodes" => nodes = Some(number::<usize>(flag, &value()?, "a count such as 3")?),
            "--uplink-mbit" => uplink = Some(rate(flag, &value()?)?),
            "--server-mbit" => server = Some(rate(flag, &value()?)?),
            "--config" => config = Some(PathBuf::from(value()?)),
            "--rounds" => rounds = Some(number::<u64>(flag, &value()?, "a count such as 5")?),
            "--bin" => bin = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--json" => json = true,
            "--bench-cluster" => {
                bench = Some(number::<usize>(
                    flag,
                    &value()?,
                    "clients per host such as 12500",
                )?)
            }
            "--params" => params = number::<usize>(flag, &value()?, "a count such as 100")?,
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    let nodes = nodes.ok_or("--nodes is required")?;
    if !(1..=253).contains(&nodes) {
        return Err(format!(
            "--nodes: expected 1 to 253 client hosts, got {nodes}"
        ));
    }
    let uplink_mbit = uplink.ok_or("--uplink-mbit is required")?;
    let work = match (config, bench) {
        (Some(config), None) => Work::Config(config),
        (None, Some(clients_per_node)) if clients_per_node >= 1 && params >= 1 => Work::Bench {
            clients_per_node,
            params,
        },
        (None, Some(_)) => return Err("--bench-cluster and --params must be at least 1".into()),
        (Some(_), Some(_)) => return Err("give --config or --bench-cluster, not both".into()),
        (None, None) => return Err("--config (or --bench-cluster) is required".into()),
    };
    Ok(Options {
        nodes,
        uplink_mbit,
        server_mbit: server.unwrap_or(uplink_mbit),
        work,
        rounds,
        bin,
        out,
        json,
    })
}

fn number<T: std::str::FromStr>(flag: &str, text: &str, expected: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag}: expected {expected}, got `{text}`"))
}

fn rate(flag: &str, text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 100_000.0 => Ok(r),
        _ => Err(format!(
            "{flag}: expected a rate in Mbit/s, more than 0 and at most 100000, such as 10; got `{text}`"
        )),
    }
}

pub fn main(repo: &Path, args: &[String]) -> ExitCode {
    let options = match parse(args) {
        Ok(options) => options,
        Err(e) => return crate::fail(&format!("wan: {e}\n\n{USAGE}")),
    };
    match run(repo, &options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => crate::fail(&format!("wan: {e}")),
    }
}

/// A child process, killed if still running when dropped; its stderr goes to `log`.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, command: Command, dir: &Path) -> Result<Self, String> {
        Self::spawn_to(name, command, dir, Stdio::null())
    }

    /// [`Proc::spawn`] with its stdout going to `stdout`.
    fn spawn_to(
        name: &str,
        mut command: Command,
        dir: &Path,
        stdout: impl Into<Stdio>,
    ) -> Result<Self, String> {
        let log = dir.join(format!("{name}.log"));
        let file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Self {
            name: name.into(),
            child,
            log,
        })
    }

    /// The last lines of its log, for an error message.
    fn tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("fedshard-wan-{}", std::process::id()));
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self(dir))
    }
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
    let rates: Vec<Option<f64>> = std::iter::once(Some(options.server_mbit))
        .chain(std::iter::repeat_n(
            Some(options.uplink_mbit),
            options.nodes,
        ))
        .collect();
    Network::create("wan", &rates)
}

/// `fedshard bench cluster --external-nodes` on the server host and a `bench cluster-node` of
/// `clients_per_node` echo clients on each client host; prints the bench's report and each
/// host's peak memory.
fn bench(
    repo: &Path,
    options: &Options,
    clients_per_node: usize,
    params: usize,
) -> Result<bool, String> {
    let bin = binary(repo, options)?;
    let scratch = Scratch::new()?;
    let secret = random_secret()?;
    let network = network(options)?;
    let listen = format!("{}:7000", netns::address(0));
    let bin = bin.to_string_lossy().into_owned();
    let rounds = options.rounds.unwrap_or(3).to_string();
    let (nodes, params) = (options.nodes.to_string(), params.to_string());
    let mut server = network.command(0, &bin);
    server.args([
        "bench",
        "cluster",
        "--external-nodes",
        "--json",
        "--listen",
        &listen,
    ]);
    server.args([
        "--nodes",
        &nodes,
        "--clients-per-node",
        &clients_per_node.to_string(),
    ]);
    server.args(["--params", &params, "--rounds", &rounds]);
    server.env("FEDSHARD_SECRET", &secret);
    let report = scratch.0.join("report.json");
    let out = fs::File::create(&report).map_err(|e| format!("{}: {e}", report.display()))?;
    let mut processes = vec![Proc::spawn_to("bench-cluster", server, &scratch.0, out)?];
    // The nodes start once the server has run the federation in one process and listens.
    let started = Instant::now();
    while !fs::read_to_string(&processes[0].log)
        .unwrap_or_default()
        .contains("waiting for")
    {
        if let Some(Some((name, tail))) = exited(&mut processes)? {
            return Err(format!("{name} failed; the end of its log:\n{tail}"));
        }
        if started.elapsed() > Duration::from_secs(3600) {
            return Err("bench cluster did not start listening within an hour".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for node in 0..options.nodes {
        let first = node * clients_per_node;
        let list = format!("{first}-{}", first + clients_per_node - 1);
        let mut join = network.command(node + 1, &bin);
        join.args([
            "bench",
            "cluster-node",
            "--server",
            &listen,
            "--clients",
            &list,
        ]);
        join.args(["--params", &params]);
        join.env("FEDSHARD_SECRET", &secret);
        let path = scratch.0.join(format!("node-{}.json", node + 1));
        let out = fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        processes.push(Proc::spawn_to(
            &format!("node-{}", node + 1),
            join,
            &scratch.0,
            out,
        )?);
    }
    let outcome = loop {
        if let Some(outcome) = exited(&mut processes)? {
            break outcome;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Some((name, tail)) = outcome {
        return Err(format!("{name} failed; the end of its log:\n{tail}"));
    }
    drop(network);
    let text = fs::read_to_string(&report).map_err(|e| format!("{}: {e}", report.display()))?;
    println!("{}", text.trim());
    for node in 0..options.nodes {
        let path = scratch.0.join(format!("node-{}.json", node + 1));
        let text = fs::read_to_string(&path).unwrap_or_default();
        let rss = json_number(&text, "peak_rss_bytes").unwrap_or(f64::NAN);
        println!(
            "{{\"host\":{},\"clients\":{clients_per_node},\"peak_rss_bytes\":{rss:.0}}}",
            node + 1
        );
    }
    Ok(true)
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn run(repo: &Path, options: &Options) -> Result<bool, String> {
    let config = match &options.work {
        Work::Config(config) => config,
        Work::Bench {
            clients_per_node,
            params,
        } => return bench(repo, options, *clients_per_node, *params),
    };
    let config =
        fs::canonicalize(config).map_err(|e| format!("--config {}: {e}", config.display()))?;
    let clients = data_clients(&config)?;
    if clients < options.nodes {
        return Err(format!(
            "{}: [data] clients = {clients}, fewer than --nodes {}",
            config.display(),
            options.nodes
        ));
    }
    let bin = match &options.bin {
        Some(bin) => bin.clone(),
        None => build(repo)?,
    };
    let scratch =
        Scratch(std::env::temp_dir().join(format!("fedshard-wan-{}", std::process::id())));
    fs::create_dir_all(&scratch.0).map_err(|e| format!("{}: {e}", scratch.0.display()))?;
    let secret = write_secret(&scratch.0)?;
    let run_dir = match &options.out {
        Some(out) => out.clone(),
        None => scratch.0.join("run"),
    };

    let rates: Vec<Option<f64>> = std::iter::once(Some(options.server_mbit))
        .chain(std::iter::repeat_n(
            Some(options.uplink_mbit),
            options.nodes,
        ))
        .collect();
    let network = Network::create("wan", &rates)?;
    let listen = format!("{}:7000", netns::address(0));
    let path = |p: &Path| p.to_string_lossy().into_owned();

    let mut serve = network.command(0, &path(&bin));
    serve.args([
        "serve",
        &path(&config),
        "--listen",
        &listen,
        "--out",
        &path(&run_dir),
    ]);
    serve.args(["--secret-file", &path(&secret), "--metrics-addr", "off"]);
    if let Some(rounds) = options.rounds {
        serve.args(["--rounds", &rounds.to_string()]);
    }
    let mut processes = vec![Proc::spawn("serve", serve, &scratch.0)?];
    for node in 0..options.nodes {
        let first = clients * node / options.nodes;
        let last = clients * (node + 1) / options.nodes - 1;
        let mut join = network.command(node + 1, &path(&bin));
        join.args(["join", &path(&config), "--server", &listen]);
        join.args([
            "--clients",
            &format!("{first}-{last}"),
            "--name",
            &format!("host{}", node + 1),
        ]);
        join.args(["--secret-file", &path(&secret)]);
        processes.push(Proc::spawn(
            &format!("join-{}", node + 1),
            join,
            &scratch.0,
        )?);
    }
    if !options.json {
        println!(
            "wan: server 10.77.0.1 ({} Mbit/s up), {} client hosts ({} Mbit/s up each), {clients} clients of {}",
            options.server_mbit,
            options.nodes,
            options.uplink_mbit,
            config.display()
        );
    }

    let started = Instant::now();
    let mut printed = 0usize;
    let records = run_dir.join("metrics.jsonl");
    let mut report_new_rounds = || {
        let lines = fs::read_to_string(&records).unwrap_or_default();
        let complete: Vec<&str> = lines
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .collect();
        for line in &complete[printed.min(complete.len())..] {
            report_round(line, options.json);
        }
        printed = printed.max(complete.len());
    };
    let outcome = loop {
        report_new_rounds();
        if let Some(failed) = exited(&mut processes)? {
            // The rounds recorded between the last reading and the exit.
            report_new_rounds();
            break failed;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Some((name, tail)) = outcome {
        return Err(format!("{name} failed; the end of its log:\n{tail}"));
    }
    let seconds = started.elapsed().as_secs_f64();
    let model = run_dir.join("model.bin");
    let bytes = fs::read(&model).map_err(|e| format!("{}: {e}", model.display()))?;
    let digest = format!("{:016x}", fnv1a(&bytes));
    let in_process = bench_job_digest(&bin, &config, options.rounds)?;
    let equal = digest == in_process;
    let wire = wire_totals(&network)?;
    drop(network);
    if options.json {
        println!(
            "{{\"model_digest\":\"{digest}\",\"in_process_digest\":\"{in_process}\",\"equal\":{equal},\"seconds\":{seconds:.3},\"wire_up_bytes\":{},\"wire_down_bytes\":{}}}",
            wire.0, wire.1
        );
    } else {
        println!(
            "wan: {seconds:.1} s, {} bytes up and {} down on the links; model digest {digest}, in process {in_process}: {}",
            wire.0,
            wire.1,
            if equal { "equal" } else { "DIFFERENT" }
        );
    }
    Ok(equal)
}

/// Waits on nothing: `Some(None)` once every process exited 0, `Some(Some((name, log)))` as soon
/// as one failed, `None` while they run.
fn exited(processes: &mut [Proc]) -> Result<Option<Option<(String, String)>>, String> {
    let mut running = 0;
    for p in processes.iter_mut() {
        match p.child.try_wait().map_err(|e| format!("{}: {e}", p.name))? {
            Some(status) if !status.success() => {
                return Ok(Some(Some((format!("{} ({status})", p.name), p.tail()))));
            }
            Some(_) => {}
            None => running += 1,
        }
    }
    Ok((running == 0).then_some(None))
}

/// Bytes all client hosts sent (up) and the server host sent (down), so far.
fn wire_totals(network: &Network) -> Result<(u64, u64), String> {
    let mut up = 0;
    for host in 1..network.len() {
        up += network.wire_bytes(host)?.0;
    }
    Ok((up, network.wire_bytes(0)?.0))
}

/// One round's line, from its record in metrics.jsonl: the bytes the run counted (the links'
/// own counts are read at the end; a round is often shorter than a reading of them).
fn report_round(record: &str, json: bool) {
    let field = |key: &str| json_number(record, key).unwrap_or(f64::NAN);
    let (round, seconds, accuracy) = (field("round"), field("seconds"), field("accuracy"));
    let up = field("uplink_bits") / 8.0;
    let down = field("downlink_bits") / 8.0;
    if json {
        println!(
            "{{\"round\":{round},\"seconds\":{seconds:.3},\"accuracy\":{accuracy:.4},\"uplink_bytes\":{up:.0},\"downlink_bytes\":{down:.0}}}"
        );
    } else {
        println!(
            "round {round}: {seconds:.2} s, accuracy {accuracy:.4}, {up:.0} bytes up, {down:.0} down"
        );
    }
}

/// A number at the top level of a one-line JSON object: the value after `"key":`.
fn json_number(line: &str, key: &str) -> Option<f64> {
    let start = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = line[start..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// `[data] clients` of a config: how many clients to split over the hosts.
fn data_clients(config: &Path) -> Result<usize, String> {
    let text = fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()))?;
    let mut section = "";
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.starts_with('[') {
            section = line;
        } else if section == "[data]"
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "clients"
        {
            return value.trim().parse().map_err(|_| {
                format!(
                    "{}: [data] clients: expected a count, got `{}`",
                    config.display(),
                    value.trim()
                )
            });
        }
    }
    Err(format!(
        "{}: no `clients = N` in its [data] section",
        config.display()
    ))
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

/// 32 random bytes in hex, as `openssl rand -hex 32` makes a federation's secret.
fn random_secret() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A fresh random secret in a file only its owner reads.
fn write_secret(dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join("secret");
    fs::write(&path, random_secret()? + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The in-process digest: `fedshard bench job CONFIG --json`'s `model_digest`.
fn bench_job_digest(bin: &Path, config: &Path, rounds: Option<u64>) -> Result<String, String> {
    let mut command = Command::new(bin);
    command.args(["bench", "job"]).arg(config).arg("--json");
    if let Some(rounds) = rounds {
        command.args(["--rounds", &rounds.to_string()]);
    }
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let key = "\"model_digest\":\"";
    text.find(key)
        .map(|at| &text[at + key.len()..])
        .and_then(|rest| rest.split('"').next())
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "`fedshard bench job` gave no model_digest ({})",
                output.status
            )
        })
}

/// FNV-1a 64 of the model's bytes, the digest `fedshard bench job` prints.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_fnv1a_64_as_bench_job_prints_it() {
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_record_s_numbers_are_read_at_the_top_level_only() {
        let line = r#"{"round":3,"client_train_seconds":[9.0],"seconds":0.25,"accuracy":9.1e-1}"#;
        assert_eq!(json_number(line, "round"), Some(3.0));
        assert_eq!(json_number(line, "seconds"), Some(0.25));
        assert_eq!(json_number(line, "accuracy"), Some(0.91));
        assert_eq!(json_number(line, "loss"), None);
    }
}
