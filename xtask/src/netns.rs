//! A network in a box: a bridge and a few hosts, each in a Linux network namespace of its own,
//! with an address on one /24 and an egress (uplink) limited by a `tbf` queueing discipline.
//!
//! Why namespaces: a federation's processes then talk over real links with real rates that
//! can be cut and restored under running processes, on one machine and without touching its
//! own interfaces, routes or addresses — every address lives inside the namespaces, and
//! deleting the namespaces removes every link. The bridge sits in a namespace of its own too.
//!
//! Used by `cargo xtask wan` and, through `#[path]`, by the partition tests (`tests/netns.rs`);
//! std only, so that the tests can include it. Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN)
//! and iproute2's `ip` and `tc`.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Every namespace this module makes starts with this, then the maker's process id: a later
/// run removes the namespaces of a maker that died without cleaning up (a SIGKILL, a Ctrl-C).
const PREFIX: &str = "fedshard-";

/// A host's address: `10.77.0.(index + 1)`.
pub fn address(index: usize) -> Ipv4Addr {
    let last = u8::try_from(index + 1).expect("at most 254 hosts");
    Ipv4Addr::new(10, 77, 0, last)
}

/// The bridge namespace and the hosts' namespaces of one network; dropping it deletes them.
pub struct Network {
    hub: String,
    hosts: Vec<String>,
}

impl Network {
    /// Makes `hosts` namespaces on one bridge. `uplink_mbit[i]`, when given, limits host `i`'s
    /// egress to that many Mbit/s.
    pub fn create(tag: &str, uplink_mbit: &[Option<f64>]) -> Result<Self, String> {
        if uplink_mbit.len() > 254 {
            return Err(format!(
                "{} hosts asked; a network holds at most 254",
                uplink_mbit.len()
            ));
        }
        remove_stale();
        let base = format!("{PREFIX}{}-{tag}", std::process::id());
        let mut network = Network {
            hub: format!("{base}-hub"),
            hosts: Vec::new(),
        };
        // From here on, a failure drops `network`, which deletes what exists so far.
        ip(&["netns", "add", &network.hub])?;
        let hub = network.hub.clone();
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for (index, rate) in uplink_mbit.iter().enumerate() {
            let host = format!("{base}-{index}");
            ip(&["netns", "add", &host])?;
            network.hosts.push(host.clone());
            let port = port_name(index);
            ip(&[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &host,
            ])?;
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"])?;
            let cidr = format!("{}/24", address(index));
            ip(&["-n", &host, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &host, "link", "set", "eth0", "up"])?;
            ip(&["-n", &host, "link", "set", "lo", "up"])?;
            if let Some(mbit) = rate {
                limit(&host, *mbit)?;
            }
        }
        Ok(network)
    }

    /// How many hosts.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// A command that runs `program` inside host `index`'s namespace.
    pub fn command(&self, index: usize, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.hosts[index], program]);
        command
    }

    #[allow(
        dead_code,
        reason = "the partition tests use it (tests/netns.rs), the wan task not"
    )]
    /// Cuts host `index` off the bridge (`up = false`), as if its cable were pulled at the
    /// switch, or connects it again. Its own interface keeps its address; packets are lost.
    pub fn set_link(&self, index: usize, up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.hub, "link", "set", &port_name(index), state])
    }

    /// Bytes host `index` has sent and received on its link: `(sent, received)`.
    pub fn wire_bytes(&self, index: usize) -> Result<(u64, u64), String> {
        // The bridge's port of a host sees the host's traffic mirrored: what the host sends,
        // the port receives.
        let read = |counter: &str| -> Result<u64, String> {
            let path = format!("/sys/class/net/{}/statistics/{counter}", port_name(index));
            let output = run(Command::new("ip").args(["netns", "exec", &self.hub, "cat", &path]))?;
            output
                .trim()
                .parse()
                .map_err(|e| format!("{path} in {}: `{}`: {e}", self.hub, output.trim()))
        };
        Ok((read("rx_bytes")?, read("tx_bytes")?))
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes its interfaces, and a veth's peer with it.
        for ns in self.hosts.iter().chain(std::iter::once(&self.hub)) {
            if let Err(e) = ip(&["netns", "delete", ns]) {
                eprintln!(
                    "network namespace {ns} not deleted ({e}); remove it with `ip netns delete {ns}`"
                );
            }
        }
    }
}

/// The bridge's port towards host `index`.
fn port_name(index: usize) -> String {
    format!("h{index}")
}

/// Limits the egress of `host`'s interface to `mbit` Mbit/s with a token bucket. The bucket
/// holds 10 ms at the rate (at least 16 KiB, so a full-size frame always fits) and the queue
/// 200 ms, beyond which the kernel drops and TCP backs off as on a real bottleneck.
fn limit(host: &str, mbit: f64) -> Result<(), String> {
    if !(mbit.is_finite() && mbit > 0.0) {
        return Err(format!("a link rate must be positive Mbit/s, got {mbit}"));
    }
    let bits = mbit * 1e6;
    let burst = ((bits / 8.0 * 0.010) as u64).max(16 * 1024);
    let rate = format!("{}bit", bits.round() as u64);
    let burst = format!("{burst}b");
    let status = Command::new("tc")
        .args(["-n", host, "qdisc", "add", "dev", "eth0", "root", "tbf"])
        .args(["rate", &rate, "burst", &burst, "latency", "200ms"])
        .output()
        .map_err(|e| format!("cannot run `tc` (iproute2): {e}"))?;
    if status.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`tc qdisc add … tbf rate {rate}` in {host}: {}",
            String::from_utf8_lossy(&status.stderr).trim()
        ))
    }
}

/// Deletes the namespaces left by makers that are no longer running.
fn remove_stale() {
    let Ok(listing) = run(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    for line in listing.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        let alive = !pid.is_empty() && std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(Command::new("ip").args(args)).map(drop)
}

/// Runs a command to its end: its stdout, or an error with its stderr.
fn run(command: &mut Command) -> Result<String, String> {
    let line = format!("{command:?}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {line}: {e} (network namespaces need iproute2)"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("Operation not permitted") {
            " (network namespaces need root, or CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        } else {
            ""
        };
        Err(format!("{line} failed: {}{hint}", stderr.trim()))
    }
}
