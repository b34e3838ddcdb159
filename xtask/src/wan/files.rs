//! What the task reads of fedshard's files and output, each through the format it is written
//! in (TOML with toml, JSON with serde_json), and the lines it prints from them.

use serde::{Deserialize, Serialize};
use std::fs;
use std::hash::Hasher;
use std::path::Path;
use std::process::{Command, Stdio};

/// `[data] clients` of a config: how many clients to split over the hosts.
pub fn data_clients(config: &Path) -> Result<usize, String> {
    #[derive(Deserialize)]
    struct Config {
        data: Data,
    }
    #[derive(Deserialize)]
    struct Data {
        clients: usize,
    }
    let text = fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()))?;
    toml::from_str::<Config>(&text)
        .map(|c| c.data.clients)
        .map_err(|e| {
            format!(
                "{}: expected a `[data]` section with `clients = N`, a count: {e}",
                config.display()
            )
        })
}

/// The fields of a round's record in `metrics.jsonl` that the task prints.
#[derive(Debug, Deserialize)]
pub struct RoundRecord {
    round: u64,
    seconds: f64,
    /// `null` when the round's evaluation gave no number (serde_json writes NaN so).
    accuracy: Option<f64>,
    uplink_bits: u64,
    downlink_bits: u64,
}

impl RoundRecord {
    /// Line `number` (1-based) of `file`.
    pub fn parse(line: &str, file: &Path, number: usize) -> Result<Self, String> {
        serde_json::from_str(line).map_err(|e| {
            format!(
                "{} line {number}: expected a round's record (round, seconds, accuracy, uplink_bits, downlink_bits): {e}",
                file.display()
            )
        })
    }

    /// The round's line: the bytes the run counted (the links' own counts are read at the end;
    /// a round is often shorter than a reading of them).
    pub fn report(&self, json: bool) -> Result<String, String> {
        /// The JSON line, its keys in this order.
        #[derive(Serialize)]
        struct Line {
            round: u64,
            seconds: f64,
            accuracy: Option<f64>,
            uplink_bytes: u64,
            downlink_bytes: u64,
        }
        let (up, down) = (self.uplink_bits / 8, self.downlink_bits / 8);
        let (round, seconds) = (self.round, self.seconds);
        if json {
            json_line(&Line {
                round,
                seconds: rounded(seconds, 3),
                accuracy: self.accuracy.map(|a| rounded(a, 4)),
                uplink_bytes: up,
                downlink_bytes: down,
            })
        } else {
            let accuracy = self.accuracy.unwrap_or(f64::NAN);
            Ok(format!(
                "round {round}: {seconds:.2} s, accuracy {accuracy:.4}, {up} bytes up, {down} down"
            ))
        }
    }
}

/// `value` as one line of JSON.
pub fn json_line(value: &impl Serialize) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot write a JSON line: {e}"))
}

/// `value` to `decimals` places, for a JSON line as short as the prose one.
pub fn rounded(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// The last line of `stdout` that is not blank, as the JSON object `T`; `what` names the
/// output in the error.
fn last_json_line<T: for<'de> Deserialize<'de>>(stdout: &str, what: &str) -> Result<T, String> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty());
    serde_json::from_str(line.unwrap_or_default()).map_err(|e| {
        format!(
            "{what}: expected a JSON line, got `{}`: {e}",
            line.unwrap_or("")
        )
    })
}

/// The in-process digest: `fedshard bench job CONFIG --json`'s `model_digest`.
pub fn bench_job_digest(bin: &Path, config: &Path, rounds: Option<u64>) -> Result<String, String> {
    #[derive(Deserialize)]
    struct BenchJob {
        model_digest: String,
    }
    let mut command = Command::new(bin);
    command.args(["bench", "job"]).arg(config).arg("--json");
    if let Some(rounds) = rounds {
        command.args(["--rounds", &rounds.to_string()]);
    }
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let what = format!("`fedshard bench job` ({})", output.status);
    last_json_line::<BenchJob>(&String::from_utf8_lossy(&output.stdout), &what)
        .map(|job| job.model_digest)
}

/// A `bench cluster-node`'s report: its peak memory.
pub fn peak_rss_bytes(report: &Path) -> Result<u64, String> {
    #[derive(Deserialize)]
    struct Node {
        peak_rss_bytes: u64,
    }
    let text = fs::read_to_string(report).map_err(|e| format!("{}: {e}", report.display()))?;
    last_json_line::<Node>(&text, &report.display().to_string()).map(|n| n.peak_rss_bytes)
}

/// FNV-1a 64 of the model's bytes in hex, the digest `fedshard bench job` prints.
pub fn model_digest(bytes: &[u8]) -> String {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(bytes);
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_fnv1a_64_as_bench_job_prints_it() {
        assert_eq!(model_digest(b"foobar"), "85944171f73967e8");
        assert_eq!(model_digest(b""), "cbf29ce484222325");
    }

    /// A record's top-level numbers are read, not those nested in it, whatever the order; NaN
    /// (written as null) stays a missing accuracy rather than a failed read.
    #[test]
    fn a_round_record_is_read_as_json() {
        let line = r#"{"client_train_seconds":[9.0],"round":3,"seconds":0.25,"accuracy":9.1e-1,"phases":{"seconds":7},"uplink_bits":800,"downlink_bits":16}"#;
        let record = RoundRecord::parse(line, Path::new("m.jsonl"), 4).unwrap();
        assert_eq!(
            record.report(true).unwrap(),
            r#"{"round":3,"seconds":0.25,"accuracy":0.91,"uplink_bytes":100,"downlink_bytes":2}"#
        );
        assert_eq!(
            record.report(false).unwrap(),
            "round 3: 0.25 s, accuracy 0.9100, 100 bytes up, 2 down"
        );
        let line = r#"{"round":1,"seconds":1.5,"accuracy":null,"uplink_bits":8,"downlink_bits":8}"#;
        let record = RoundRecord::parse(line, Path::new("m.jsonl"), 1).unwrap();
        assert!(record.report(true).unwrap().contains(r#""accuracy":null"#));
        let error = RoundRecord::parse(r#"{"round":1}"#, Path::new("m.jsonl"), 2).unwrap_err();
        assert!(
            error.starts_with("m.jsonl line 2: expected a round's record"),
            "{error}"
        );
    }

    #[test]
    fn the_clients_are_read_from_the_data_section_only() {
        let dir = std::env::temp_dir().join(format!("xtask-wan-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let config = dir.join("c.toml");
        fs::write(
            &config,
            "[run]\nclients = 3 # not this one\n[data]\ndataset = \"digits\"\nclients = 20\n",
        )
        .unwrap();
        assert_eq!(data_clients(&config), Ok(20));
        fs::write(&config, "[data]\nclients = \"many\"\n").unwrap();
        let error = data_clients(&config).unwrap_err();
        assert!(
            error.contains("c.toml") && error.contains("clients"),
            "{error}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_last_json_line_is_the_report() {
        let job: serde_json::Value =
            last_json_line("progress…\n{\"model_digest\":\"ab\"}\n\n", "job").unwrap();
        assert_eq!(job["model_digest"], "ab");
        assert!(last_json_line::<serde_json::Value>("", "job").is_err());
    }
}
