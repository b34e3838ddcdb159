//! The journal of `fedshard compare --out DIR`, for either kind of grid: every finished run is appended to
//! `DIR/runs.jsonl` the moment it ends, so a grid that stops early (a killed process, the end of
//! a working session) keeps every run it finished, and `--resume` reuses them instead of running
//! them again. A grid of hours can so be spread over several sittings, and seeds can be added to
//! a finished grid (`--seeds 5` after `--seeds 3` runs only seeds 4 and 5).
//!
//! A line holds the run's whole config as JSON next to its result, and a run is reused only for
//! an identical config (seed, strategy, keep ratios, compressor, rounds, recipe, data…). The code that ran
//! it is not recorded: resuming after changing the runtime is the user's decision, which is why
//! it takes the explicit `--resume` flag and an existing journal is otherwise an error.

use crate::config::Config;
use anyhow::{Context, bail};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The journal's file name inside the `--out` folder.
pub const FILE: &str = "runs.jsonl";

/// A grid's result of one run, as the journal keeps it.
pub trait JournalRow: Serialize + DeserializeOwned + Clone {
    /// The test accuracy after each round and the time at its end: left out of the result's
    /// own JSON (one number per run), but needed to redraw the figures and the times to a
    /// target of a resumed grid.
    fn per_round(&self) -> (&[f64], &[f64]);
    fn set_per_round(&mut self, accuracy: Vec<f64>, time: Vec<f64>);
}

/// One line of the journal.
#[derive(Debug, Serialize, Deserialize)]
struct Line<R> {
    /// The run's config, as `serde_json` writes [`Config`].
    config: Value,
    result: R,
    /// Not part of [`RunResult`]'s JSON (whose shape stays one number per run), but needed to
    /// redraw the accuracy figures of a resumed grid.
    accuracy_per_round: Vec<f64>,
    /// The time at each round's end (absent in journals written before it was kept).
    #[serde(default)]
    time_per_round: Vec<f64>,
}

/// Every complete line of the journal at `path` whose text is `text`.
fn lines<R: DeserializeOwned>(path: &Path, text: &str) -> anyhow::Result<Vec<Line<R>>> {
    let mut out = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: expected one JSON object {{\"config\", \"result\", \
                 \"accuracy_per_round\"}} per line, as `fedshard compare --out` writes them",
                path.display(),
                k + 1
            )
        })?);
    }
    Ok(out)
}

/// A finished run of a grid as `fedshard report --serve` reads it while the grid goes on: the
/// result as JSON (either kind of grid) and its test accuracy after each round.
#[derive(Debug, Clone)]
pub struct Finished {
    pub result: Value,
    pub accuracy_per_round: Vec<f64>,
}

/// The runs that `dir/runs.jsonl` holds now, without opening it for writing; a last line being
/// written is left for the next read.
pub fn read_finished(dir: &Path) -> anyhow::Result<Vec<Finished>> {
    let path = dir.join(FILE);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    Ok(lines::<Value>(&path, &text[..complete])?
        .into_iter()
        .map(|line| Finished {
            result: line.result,
            accuracy_per_round: line.accuracy_per_round,
        })
        .collect())
}

/// The runs recorded so far and the file that new ones are appended to.
#[derive(Debug)]
pub struct Journal<R> {
    path: PathBuf,
    file: File,
    recorded: Vec<(Value, R)>,
}

impl<R: JournalRow> Journal<R> {
    /// Opens `dir/runs.jsonl`, creating `dir` and the file if needed.
    ///
    /// Without `resume` a journal that already holds runs is an error: its runs would silently
    /// stand in for new ones. With it, the runs are read back. A last line without its newline
    /// is a write that a kill interrupted; it is cut off (with a warning on stderr) so the next
    /// run starts a clean line. Any other line that is not a journal entry is an error naming
    /// the file and line: the journal is never rewritten around it.
    pub fn open(dir: &Path, resume: bool) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if !text.is_empty() && !resume {
            bail!(
                "{} already holds runs of an earlier grid: pass --resume to reuse the runs whose \
                 config is identical, or choose another --out folder",
                path.display()
            );
        }
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        let mut recorded = Vec::new();
        for entry in lines::<R>(&path, &text[..complete])? {
            let mut result = entry.result;
            result.set_per_round(entry.accuracy_per_round, entry.time_per_round);
            recorded.push((entry.config, result));
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if complete < text.len() {
            eprintln!(
                "warning: {} ends in an incomplete line ({} bytes, a write cut short); it is \
                 dropped and that run will run again",
                path.display(),
                text.len() - complete
            );
            file.set_len(complete as u64)
                .with_context(|| format!("truncating {}", path.display()))?;
        }
        Ok(Self {
            path,
            file,
            recorded,
        })
    }

    /// The recorded result of the run with exactly this config, if any (the first, should the
    /// journal hold it twice).
    pub fn recorded(&self, config: &Config) -> anyhow::Result<Option<R>> {
        let key = serde_json::to_value(config)?;
        Ok(self
            .recorded
            .iter()
            .find(|(recorded, _)| *recorded == key)
            .map(|(_, result)| result.clone()))
    }

    /// Appends one finished run as a single line and flushes it to the disk.
    pub fn record(&mut self, config: &Config, result: &R) -> anyhow::Result<()> {
        let line = Line {
            config: serde_json::to_value(config)?,
            result: result.clone(),
            accuracy_per_round: result.per_round().0.to_vec(),
            time_per_round: result.per_round().1.to_vec(),
        };
        let mut text = serde_json::to_string(&line)?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.sync_data())
            .with_context(|| format!("appending to {}", self.path.display()))?;
        self.recorded.push((line.config, line.result));
        Ok(())
    }

    /// How many runs the journal holds.
    pub fn len(&self) -> usize {
        self.recorded.len()
    }

    /// Whether the journal holds no run.
    pub fn is_empty(&self) -> bool {
        self.recorded.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::RunResult;

    type Journal = super::Journal<RunResult>;

    const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/digits-linear.toml");

    fn result(seed: u64) -> RunResult {
        RunResult {
            strategy: "unbiased".into(),
            setup: "0.1".into(),
            seed,
            final_accuracy: Some(0.5),
            mean_anme: Some(0.25),
            mean_update_cosine: Some(0.75),
            error: None,
            seconds: 1.5,
            accuracy_per_round: vec![0.125, 0.5],
            time_per_round: vec![1.0, 2.0],
        }
    }

    #[test]
    fn runs_come_back_for_the_identical_config_only() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::load(Path::new(CONFIG)).unwrap();
        let mut journal = Journal::open(dir.path(), false).unwrap();
        assert!(journal.recorded(&config).unwrap().is_none());
        journal.record(&config, &result(1)).unwrap();
        drop(journal);

        let err = Journal::open(dir.path(), false).unwrap_err().to_string();
        assert!(
            err.contains("runs.jsonl") && err.contains("--resume"),
            "{err}"
        );

        let journal = Journal::open(dir.path(), true).unwrap();
        assert_eq!(journal.len(), 1);
        assert_eq!(journal.recorded(&config).unwrap(), Some(result(1)));
        let mut other = config.clone();
        other.run.seed += 1;
        assert!(journal.recorded(&other).unwrap().is_none());
        other.run.seed -= 1;
        other.training.recipe.learning_rate *= 2.0;
        assert!(journal.recorded(&other).unwrap().is_none());
    }

    #[test]
    fn a_cut_short_last_line_is_dropped_and_a_corrupt_line_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::load(Path::new(CONFIG)).unwrap();
        let mut journal = Journal::open(dir.path(), false).unwrap();
        journal.record(&config, &result(1)).unwrap();
        drop(journal);
        let path = dir.path().join(FILE);
        let whole = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{whole}{{\"config\": {{\"ru")).unwrap();

        let mut journal = Journal::open(dir.path(), true).unwrap();
        assert_eq!(journal.len(), 1);
        let mut second = config.clone();
        second.run.seed = 2;
        journal.record(&second, &result(2)).unwrap();
        drop(journal);
        let journal = Journal::open(dir.path(), true).unwrap();
        assert_eq!(journal.len(), 2);
        assert_eq!(journal.recorded(&second).unwrap(), Some(result(2)));

        std::fs::write(&path, format!("{whole}not json\n")).unwrap();
        let err = format!("{:#}", Journal::open(dir.path(), true).unwrap_err());
        assert!(err.contains("runs.jsonl line 2"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{whole}not json\n"),
            "a corrupt journal is left as it is"
        );
    }
}
