//! `fedshard run`: a whole process-local federation with a run folder.

use crate::config::Config;
use crate::federation;
use anyhow::{Context, bail};
use clap::Args;
use fedshard_actors::checkpoint::{self, write_atomically};
use fedshard_actors::record::{RoundRecord, Summary};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The TOML config (see `config/`). Not needed with --resume.
    #[arg(required_unless_present = "resume")]
    pub config: Option<PathBuf>,
    /// Run folder (default: runs/NAME-seedS). Refused if it already holds a checkpoint.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Override `run.rounds`.
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Override `run.seed`.
    #[arg(long)]
    pub seed: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Continue the run in this folder from its last checkpoint.
    #[arg(long, conflicts_with_all = ["config", "out", "seed"])]
    pub resume: Option<PathBuf>,
}

const CONFIG_FILE: &str = "config.toml";
/// The final global model, as `ModelState::to_bytes`.
pub const MODEL_FILE: &str = "model.bin";

pub fn run(args: &RunArgs) -> anyhow::Result<Summary> {
    let (mut config, dir) = match (&args.resume, &args.config) {
        (Some(dir), _) => {
            let path = dir.join(CONFIG_FILE);
            if !path.exists() {
                bail!(
                    "{} is not a run folder: it has no {CONFIG_FILE}",
                    dir.display()
                );
            }
            (Config::load(&path)?, dir.clone())
        }
        (None, Some(path)) => {
            let mut config = Config::load(path)?;
            if let Some(seed) = args.seed {
                config.run.seed = seed;
            }
            let dir = args.out.clone().unwrap_or_else(|| {
                PathBuf::from("runs").join(format!("{}-seed{}", config.run.name, config.run.seed))
            });
            if dir.join(checkpoint::FILE_NAME).exists() {
                bail!(
                    "{} already holds a run; continue it with `fedshard run --resume {}` or choose another --out",
                    dir.display(),
                    dir.display()
                );
            }
            (config, dir)
        }
        (None, None) => bail!("give a CONFIG file or --resume RUN_DIR"),
    };
    if let Some(rounds) = args.rounds {
        config.run.rounds = rounds;
        config.validate()?;
    }
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create run folder {}", dir.display()))?;
    let text = toml::to_string(&config).context("serialising the config")?;
    write_atomically(&dir.join(CONFIG_FILE), text.as_bytes())?;

    let mut fed = federation::build(&config)?;
    fed.run_dir = Some(dir.clone());
    if args.resume.is_some() {
        let resumed = fed.resume_from_checkpoint().map_err(anyhow::Error::msg)?;
        if !resumed {
            tracing::warn!(
                "{} has no checkpoint yet; starting from round 1",
                dir.display()
            );
        }
    }
    let (events, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    fed.events = Some(events);
    let done = fed.history.len() as u64;
    let bar = progress_bar(config.run.rounds, done, args.quiet);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(async {
        let bar = bar.clone();
        let watcher = tokio::spawn(async move {
            while let Some(record) = receiver.recv().await {
                bar.set_position(record.round);
                bar.set_message(progress_message(&record));
            }
        });
        let result = fedshard_actors::server::run(fed).await;
        let _ = watcher.await;
        result
    });
    let (model, summary) = summary.map_err(anyhow::Error::msg)?;
    bar.finish();
    write_atomically(&dir.join(MODEL_FILE), &model.to_bytes())?;
    write_summary(&dir, &summary)?;
    Ok(summary)
}

fn progress_bar(rounds: u64, done: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(rounds);
    bar.set_style(
        ProgressStyle::with_template("round {pos}/{len} [{elapsed_precise}] {bar:30} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(done);
    bar
}

fn progress_message(r: &RoundRecord) -> String {
    format!(
        "acc {:.4} loss {:.4} | {} ok, {} failed | {:.2} Mbit up",
        r.accuracy,
        r.loss,
        r.successes,
        r.failures_total(),
        r.uplink_bits as f64 / 1e6
    )
}

fn write_summary(dir: &Path, summary: &Summary) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(summary)?;
    write_atomically(&dir.join("summary.json"), text.as_bytes())?;
    Ok(())
}
