//! A run folder as the report reads it: the per-round numbers it plots, and the config's labels.
//!
//! The report reads `metrics.jsonl` into its own [`RoundPoint`] rather than the runtime's
//! `RoundRecord` because `serde_json` writes a NaN as `null` (the train loss of a round in which
//! no update was accepted), which a plain `f64` field refuses to read back; here a `null` float
//! becomes NaN again, and the plots leave a gap there. Fields the report does not plot are
//! ignored, so a folder from a run with more fields still reads.

use anyhow::{Context, bail};
use fedshard_actors::record::{KlmsStats, RoundRecord, SimulatedTime};
use fedshard_actors::run_folder::{CONFIG_FILE, METRICS_FILE, SUMMARY_FILE};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One round's numbers, as plotted. NaN stands for "not measured" (`null` in the JSON).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RoundPoint {
    pub round: u64,
    pub participants: usize,
    pub successes: usize,
    /// Failed clients by kind (`timeout`, `panic`, …).
    pub failures: BTreeMap<String, usize>,
    /// Rejected updates by kind (`stale`, `non_finite`, …).
    pub rejected: BTreeMap<String, usize>,
    #[serde(deserialize_with = "float_or_null")]
    pub accuracy: f64,
    #[serde(deserialize_with = "float_or_null")]
    pub loss: f64,
    #[serde(deserialize_with = "float_or_null")]
    pub train_loss: f64,
    pub uplink_bits: u64,
    pub downlink_bits: u64,
    #[serde(deserialize_with = "float_or_null")]
    pub bits_per_parameter: f64,
    #[serde(deserialize_with = "float_or_null")]
    pub anme: f64,
    /// One entry per (sharded layer, keep-ratio cluster) of the round.
    #[serde(default)]
    pub groups: Vec<GroupPoint>,
    /// Clients cut off by over-commitment (absent in records older than over-commitment).
    #[serde(default)]
    pub late: usize,
    /// Async mode: the staleness τ of each update folded into this version (empty otherwise).
    #[serde(default)]
    pub staleness: Vec<u64>,
    /// What the KLMS coders reported (absent without KLMS and in older records).
    #[serde(default)]
    pub klms: Option<KlmsStats>,
    /// Simulated time (`--clock virtual`); absent on the wall clock.
    #[serde(default)]
    pub time: Option<SimulatedTime>,
    /// With `[privacy]`, what the round's release spent (absent or `null` otherwise).
    #[serde(default)]
    pub privacy: Option<fedshard_actors::privacy::PrivacyRecord>,
}

/// The ANME of one keep-ratio cluster on one sharded layer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GroupPoint {
    pub layer: String,
    pub keep_ratio: f64,
    #[serde(deserialize_with = "float_or_null")]
    pub anme: f64,
}

impl RoundPoint {
    pub fn failures_total(&self) -> usize {
        self.failures.values().sum()
    }

    pub fn rejected_total(&self) -> usize {
        self.rejected.values().sum()
    }
}

impl From<&RoundRecord> for RoundPoint {
    fn from(r: &RoundRecord) -> Self {
        Self {
            round: r.round,
            participants: r.participants,
            successes: r.successes,
            failures: r
                .failures
                .iter()
                .map(|(k, n)| (k.label().to_string(), *n))
                .collect(),
            rejected: r
                .rejected
                .iter()
                .map(|(k, n)| (k.label().to_string(), *n))
                .collect(),
            accuracy: r.accuracy,
            loss: r.loss,
            train_loss: r.train_loss,
            uplink_bits: r.uplink_bits,
            downlink_bits: r.downlink_bits,
            bits_per_parameter: r.bits_per_parameter,
            anme: r.anme,
            groups: r
                .groups
                .iter()
                .map(|g| GroupPoint {
                    layer: g.layer.clone(),
                    keep_ratio: g.keep_ratio,
                    anme: g.anme,
                })
                .collect(),
            late: r.late,
            staleness: r.staleness.clone(),
            klms: r.klms,
            time: r.time.clone(),
            privacy: r.privacy,
        }
    }
}

fn float_or_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// What the run's `config.toml` says about it, for the report's table; `None` where the folder
/// has no config or the config lacks the field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunLabels {
    pub name: Option<String>,
    pub seed: Option<u64>,
    /// The sharding strategy, when some layer is sharded (or the config does not say).
    pub strategy: Option<String>,
    pub dataset: Option<String>,
    /// The uplink compressor, when there is one.
    pub compressor: Option<String>,
    /// `async` for buffered asynchronous runs.
    pub mode: Option<String>,
}

/// One run folder, loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The folder as the user named it.
    pub dir: PathBuf,
    /// How the run is called in legends and tables (see [`label_runs`]).
    pub label: String,
    pub config: RunLabels,
    /// In round order, at least one.
    pub rounds: Vec<RoundPoint>,
}

impl Run {
    /// Reads `dir/metrics.jsonl`, or `dir/summary.json` when there is no JSONL, and
    /// `dir/config.toml` when there is one. Errors name the file and what was expected.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        if !dir.is_dir() {
            bail!(
                "{}: not a folder; expected a run folder written by `fedshard run`",
                dir.display()
            );
        }
        let jsonl = dir.join(METRICS_FILE);
        let summary = dir.join(SUMMARY_FILE);
        let rounds = if jsonl.is_file() {
            read_jsonl(&jsonl)?
        } else if summary.is_file() {
            read_summary(&summary)?
        } else {
            bail!(
                "{}: no {METRICS_FILE} or {SUMMARY_FILE} in it; expected a run folder written \
                 by `fedshard run`",
                dir.display()
            );
        };
        if rounds.is_empty() {
            bail!(
                "{}: the run has not completed a round yet",
                dir.join(METRICS_FILE).display()
            );
        }
        let config_path = dir.join(CONFIG_FILE);
        let config = if config_path.is_file() {
            read_labels(&config_path)?
        } else {
            RunLabels::default()
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            label: folder_name(dir),
            config,
            rounds,
        })
    }

    /// The last round (`None` only for a `Run` built by hand: `load` refuses an empty run).
    pub fn last(&self) -> Option<&RoundPoint> {
        self.rounds.last()
    }

    pub fn uplink_bits_total(&self) -> u64 {
        self.rounds.iter().map(|r| r.uplink_bits).sum()
    }
}

/// Loads every folder, in order, and gives each a distinct label: its folder name, or its
/// whole path where two folders share a name (`a/run` and `b/run`).
pub fn load_runs(dirs: &[PathBuf]) -> anyhow::Result<Vec<Run>> {
    let mut runs = dirs
        .iter()
        .map(|d| Run::load(d))
        .collect::<anyhow::Result<Vec<_>>>()?;
    label_runs(&mut runs);
    Ok(runs)
}

/// Replaces a label shared by several runs with each one's path (and its position if even the
/// paths agree), so no two legend entries read the same.
pub fn label_runs(runs: &mut [Run]) {
    fn shared(runs: &[Run]) -> Vec<bool> {
        let count = |label: &str| runs.iter().filter(|r| r.label == label).count();
        runs.iter().map(|r| count(&r.label) > 1).collect()
    }
    let first = shared(runs);
    for (run, shared) in runs.iter_mut().zip(first) {
        if shared {
            run.label = run.dir.display().to_string();
        }
    }
    let second = shared(runs);
    for (i, (run, shared)) in runs.iter_mut().zip(second).enumerate() {
        if shared {
            run.label = format!("{} ({})", run.label, i + 1);
        }
    }
}

fn folder_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string())
}

fn read_jsonl(path: &Path) -> anyhow::Result<Vec<RoundPoint>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).with_context(|| {
                format!(
                    "{} line {}: expected one JSON round record per line, as `fedshard run` \
                     writes",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

fn read_summary(path: &Path) -> anyhow::Result<Vec<RoundPoint>> {
    #[derive(Deserialize)]
    struct Summary {
        per_round: Vec<RoundPoint>,
    }
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let summary: Summary = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected the JSON summary `fedshard run` writes, with `per_round`",
            path.display()
        )
    })?;
    Ok(summary.per_round)
}

/// Reads the few labels of the table from the TOML as plain values, not through
/// [`crate::config::Config`]: a report of an older run should not fail because a config field
/// has been renamed since.
pub(crate) fn read_labels(path: &Path) -> anyhow::Result<RunLabels> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("{}: expected a TOML config", path.display()))?;
    let field = |section: &str, key: &str| table.get(section).and_then(|s| s.get(key));
    let text_field = |section, key| {
        field(section, key)
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    // A strategy names how sharded layers are cut: without one it would only be the default.
    let unsharded = field("model", "sharded_layers")
        .and_then(toml::Value::as_array)
        .is_some_and(|layers| layers.is_empty());
    Ok(RunLabels {
        name: text_field("run", "name"),
        seed: field("run", "seed")
            .and_then(toml::Value::as_integer)
            .and_then(|s| u64::try_from(s).ok()),
        strategy: text_field("federation", "strategy").filter(|_| !unsharded),
        dataset: text_field("data", "dataset"),
        compressor: text_field("federation", "compressor").filter(|c| c != "identity"),
        mode: text_field("federation", "mode").filter(|m| m != "sync"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `null` floats (NaN written by serde_json) read back as NaN; unknown fields are ignored.
    #[test]
    fn null_floats_read_as_nan() {
        let line = r#"{"round":2,"participants":4,"successes":0,"failures":{"timeout":4},
            "rejected":{},"model_updated":false,"accuracy":0.5,"loss":1.25,"train_loss":null,
            "uplink_bits":0,"downlink_bits":100,"bits_per_parameter":0.0,"anme":0.0,
            "groups":[{"layer":"fc0.weight","keep_ratio":0.4,"clients":2,"kept":4,"anme":null,
            "expected_discrepancy":null}],"learning_rate":0.1,"client_train_seconds":[],
            "seconds":0.2}"#;
        let p: RoundPoint = serde_json::from_str(line).unwrap();
        assert!(p.train_loss.is_nan() && p.groups[0].anme.is_nan());
        assert_eq!((p.accuracy, p.failures_total()), (0.5, 4));
    }

    /// An unsharded run's default strategy is not a label; its compressor and async mode are.
    #[test]
    fn labels_say_what_the_run_did() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let config = "[run]\nname = \"a\"\nseed = 2\n[data]\ndataset = \"mnist\"\n\
                      [model]\nkind = \"neural\"\nsharded_layers = []\n\
                      [federation]\nstrategy = \"top-n\"\ncompressor = \"signsgd-klms\"\n\
                      mode = \"async\"\n";
        std::fs::write(&path, config).unwrap();
        let labels = read_labels(&path).unwrap();
        assert_eq!(labels.strategy, None);
        assert_eq!(labels.compressor.as_deref(), Some("signsgd-klms"));
        assert_eq!(labels.mode.as_deref(), Some("async"));
        let sharded = config
            .replace("sharded_layers = []", "sharded_layers = [\"all\"]")
            .replace("signsgd-klms", "identity")
            .replace("async", "sync");
        std::fs::write(&path, sharded).unwrap();
        let labels = read_labels(&path).unwrap();
        assert_eq!(labels.strategy.as_deref(), Some("top-n"));
        assert_eq!((labels.compressor, labels.mode), (None, None));
    }

    #[test]
    fn shared_folder_names_become_paths() {
        let run = |dir: &str| Run {
            dir: PathBuf::from(dir),
            label: "run".into(),
            config: RunLabels::default(),
            rounds: Vec::new(),
        };
        let mut runs = [run("a/run"), run("b/run"), run("b/run"), run("c/other")];
        runs[3].label = "other".into();
        label_runs(&mut runs);
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["a/run", "b/run (2)", "b/run (3)", "other"]);
    }
}
