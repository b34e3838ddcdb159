//! `fedshard run`: a whole process-local federation with a run folder.

use crate::config::{Config, Overrides, parse_metrics_addr};
use crate::federation;
use crate::report::live::RunPage;
use crate::report::rounds::read_labels;
use anyhow::{Context, anyhow, bail};
use clap::Args;
use fedshard_actors::checkpoint::write_atomically;
use fedshard_actors::live::RunState;
use fedshard_actors::metrics::{self, Exporter};
use fedshard_actors::record::{RoundRecord, Summary};
use fedshard_actors::run_folder::{CHECKPOINT_FILE, CONFIG_FILE, MODEL_FILE};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

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
    /// No progress bar or progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// When stderr is not a terminal (a log file, CI), print a progress line every K rounds and
    /// at the last one; default: a hundredth of the rounds, rounded up, so a run prints at most
    /// about 100 lines.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub progress_every: Option<u64>,
    /// Continue the run in this folder from its last checkpoint.
    #[arg(long, conflicts_with_all = ["config", "out", "seed"])]
    pub resume: Option<PathBuf>,
    /// Serve Prometheus metrics (`/metrics`, `/healthz`) on IP:PORT, or `off`; overrides the
    /// config's `[metrics] addr` (default 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR|off")]
    pub metrics_addr: Option<String>,
    /// Keep serving /metrics this many seconds after the last round, so a scraper reads the
    /// final values (at most a day).
    #[arg(long, value_name = "SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=super::serve::MAX_LINGER_SECONDS))]
    pub linger: u64,
    /// Where neural clients train; overrides `training.device` (`cuda` needs a build with
    /// `--features cuda` and a GPU).
    #[arg(long, value_enum)]
    pub device: Option<crate::config::Device>,
    /// Whether neural clients that share a sub-model shape train as one computation;
    /// overrides `training.cohorts` (default off).
    #[arg(long, value_enum, value_name = "on|off")]
    pub cohorts: Option<super::OnOff>,
    /// Real or simulated time; overrides `run.clock` (default wall). Simulated time takes each
    /// client's time from `[devices]` and `[network]`: deadlines, over-commitment and async
    /// go by it, nothing sleeps, and a seed fixes the model.
    #[arg(long, value_enum)]
    pub clock: Option<super::Clock>,
    /// Override `privacy.noise_multiplier` (a config with a `[privacy]` section), so a table of
    /// accuracy against the noise is one command per row.
    #[arg(long, value_name = "Z")]
    pub noise_multiplier: Option<f64>,
}

/// The config a run folder's run was started with.
pub(crate) fn saved_config(dir: &Path) -> anyhow::Result<Config> {
    saved_config_with(dir, &Overrides::default())
}

fn saved_config_with(dir: &Path, overrides: &Overrides) -> anyhow::Result<Config> {
    let path = dir.join(CONFIG_FILE);
    if !path.is_file() {
        bail!(
            "{} is not a run folder: it has no {CONFIG_FILE}",
            dir.display()
        );
    }
    Config::load_with(&path, overrides)
}

/// The config and folder of a new run (`config` under the command's `overrides`, in `out` or
/// `runs/NAME-seedS`, refused if that folder already holds a checkpoint) or of a resumed one
/// (`resume`, whose saved config is used, under the same overrides). `command` names the
/// subcommand in the hint.
pub(crate) fn run_folder(
    command: &str,
    resume: Option<&Path>,
    config: Option<&Path>,
    out: Option<&Path>,
    overrides: &Overrides,
) -> anyhow::Result<(Config, PathBuf)> {
    match (resume, config) {
        (Some(dir), _) => Ok((saved_config_with(dir, overrides)?, dir.to_path_buf())),
        (None, Some(path)) => {
            let config = Config::load_with(path, overrides)?;
            let dir = out.map(Path::to_path_buf).unwrap_or_else(|| {
                PathBuf::from("runs").join(format!("{}-seed{}", config.run.name, config.run.seed))
            });
            if dir.join(CHECKPOINT_FILE).exists() {
                bail!(
                    "{} already holds a run; continue it with `fedshard {command} --resume {}` or choose another --out",
                    dir.display(),
                    dir.display()
                );
            }
            Ok((config, dir))
        }
        (None, None) => bail!("give a CONFIG file or --resume RUN_DIR"),
    }
}

/// Where to serve `/metrics`: `--metrics-addr` if given, else the config's `[metrics] addr`,
/// else the default; `None` for `off`.
pub(crate) fn metrics_addr(
    option: Option<&str>,
    config: &Config,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    match option {
        Some(text) => {
            parse_metrics_addr(text).map_err(|e| anyhow!("option --metrics-addr: expected {e}"))
        }
        None => parse_metrics_addr(
            config
                .metrics
                .as_ref()
                .map_or(metrics::DEFAULT_ADDR, |m| m.addr.as_str()),
        )
        .map_err(|e| anyhow!("field `metrics.addr`: expected {e}")),
    }
}

/// Creates the run folder and writes the run's config into it, so `--resume` needs nothing else.
pub(crate) fn save_config(dir: &Path, config: &Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create run folder {}", dir.display()))?;
    let text = toml::to_string(config).context("serialising the config")?;
    write_atomically(&dir.join(CONFIG_FILE), text.as_bytes())?;
    Ok(())
}

pub fn run(args: &RunArgs) -> anyhow::Result<Summary> {
    let overrides = Overrides {
        rounds: args.rounds,
        seed: args.seed,
        device: args.device,
        cohorts: args.cohorts.map(super::OnOff::is_on),
        clock: args.clock.map(Into::into),
        noise_multiplier: args.noise_multiplier,
    };
    let (config, dir) = run_folder(
        "run",
        args.resume.as_deref(),
        args.config.as_deref(),
        args.out.as_deref(),
        &overrides,
    )?;
    let metrics_addr = metrics_addr(args.metrics_addr.as_deref(), &config)?;
    config.log_warnings();
    // The federation is built (data, clients, the device) before the run folder is written, so
    // a run that cannot start (no GPU, a missing data file) leaves no folder behind.
    // A resume reads its checkpoint before anything is written: a folder without one, or with
    // a damaged one, is left as it was.
    let (mut fed, trainers) = federation::in_process(&config)?;
    fed.run_dir = Some(dir.clone());
    if args.resume.is_some() {
        fed.resume_from_checkpoint().map_err(anyhow::Error::msg)?;
    }
    save_config(&dir, &config)?;
    let (events, mut receiver) = tokio::sync::mpsc::unbounded_channel::<RoundRecord>();
    fed.events = Some(events);
    let done = fed.history.len() as u64;
    let step = config.federation.schedule.step();
    let progress = Progress::new(config.run.rounds, done, step, args);
    let runtime = crate::runtime::build()?;
    let summary = runtime.block_on(async {
        let mut exporter = match metrics_addr {
            Some(addr) => Some(Exporter::start(addr, &config.run.name).await.map_err(|e| {
                anyhow!("{e} (set by --metrics-addr or `metrics.addr`; `off` disables)")
            })?),
            None => None,
        };
        if let Some(exporter) = &exporter {
            exporter.serve_page(Arc::new(live_page(&config, &dir, done)));
            progress.serving(exporter.addr());
        }
        // Fan out: every record goes to the progress report and to the exporter.
        let to_exporter = exporter.as_ref().map(Exporter::sender);
        if let Some(sender) = &to_exporter {
            // A resumed run starts from its history, so the counters cover the whole run.
            for record in &fed.history {
                let _ = sender.send(record.clone());
            }
        }
        let progress = progress.clone();
        let watcher = tokio::spawn(async move {
            while let Some(record) = receiver.recv().await {
                progress.round(&record);
                if let Some(sender) = &to_exporter {
                    let _ = sender.send(record);
                }
            }
        });
        let result = fedshard_actors::server::run(fed, trainers).await;
        let _ = watcher.await;
        if let Some(exporter) = &mut exporter {
            exporter.flush().await;
        }
        anyhow::Ok((result, exporter))
    })?;
    let (summary, exporter) = summary;
    let finished = summary
        .map_err(anyhow::Error::msg)
        .and_then(|(model, summary)| {
            progress.finish();
            write_atomically(&dir.join(MODEL_FILE), &model.to_file_bytes())?;
            summary.save(&dir)?;
            crate::report::write_run_plots(&dir, &summary.per_round)?;
            if !args.quiet {
                let simulated = summary
                    .per_round
                    .last()
                    .and_then(|r| r.time.as_ref())
                    .map_or_else(String::new, |t| format!(", {:.1} simulated s", t.end));
                eprintln!(
                    "{} {step}s, final accuracy {:.4}, loss {:.4}, {:.3} Mbit uplink{simulated}",
                    summary.rounds_completed,
                    summary.final_accuracy,
                    summary.final_loss,
                    summary.uplink_bits_total as f64 / 1e6
                );
            }
            Ok(summary)
        });
    if let Some(exporter) = exporter {
        exporter.set_state(run_state(&finished));
        runtime.block_on(async {
            if finished.is_ok() && args.linger > 0 {
                if !args.quiet {
                    eprintln!(
                        "serving the final page on http://{0}/ and metrics on http://{0}/metrics \
                         for {1} s",
                        exporter.addr(),
                        args.linger
                    );
                }
                tokio::time::sleep(std::time::Duration::from_secs(args.linger)).await;
            }
            exporter.shutdown().await;
        });
    }
    finished
}

/// The live page at the metrics address of the run of `config` in `dir` (whose `config.toml`
/// is written), which has `done` steps behind it (a resumed run).
pub(crate) fn live_page(config: &Config, dir: &Path, done: u64) -> RunPage {
    // The labels come from the saved file, as `fedshard report` reads them later.
    let labels = read_labels(&dir.join(CONFIG_FILE)).unwrap_or_default();
    RunPage::new(
        &config.run.name,
        &labels,
        config.run.rounds,
        config.federation.schedule.step(),
        done,
    )
}

/// What the live page says of a run that returned `finished`.
pub(crate) fn run_state<T>(finished: &anyhow::Result<T>) -> RunState {
    match finished {
        Ok(_) => RunState::Finished,
        Err(e) => RunState::Failed(format!("{e:#}")),
    }
}

/// How the rounds are reported on stderr while the run goes.
#[derive(Clone)]
enum Progress {
    /// An interactive bar, when stderr is a terminal; `step` is `round`, or `version` in async
    /// mode.
    Bar {
        bar: ProgressBar,
        step: &'static str,
    },
    /// A plain line every `every` rounds and at the last, when stderr is a file or a pipe (a
    /// log, CI), where indicatif draws nothing at all and a redrawn bar would be noise.
    Lines {
        every: u64,
        total: u64,
        started: Instant,
        /// `round`, or `version` in async mode.
        step: &'static str,
    },
    Quiet,
}

/// The bar after its first word (`round` or `version`).
const BAR_TEMPLATE: &str = "{pos}/{len} [{elapsed_precise}] {bar:30} {msg}";

impl Progress {
    fn new(total: u64, done: u64, step: &'static str, args: &RunArgs) -> Self {
        if args.quiet {
            return Progress::Quiet;
        }
        if !std::io::stderr().is_terminal() {
            let every = args.progress_every.unwrap_or(total.div_ceil(100)).max(1);
            return Progress::Lines {
                every,
                total,
                started: Instant::now(),
                step,
            };
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(&format!("{step} {BAR_TEMPLATE}"))
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_position(done);
        Progress::Bar { bar, step }
    }

    /// Says where `/metrics` is served: on a second line under the bar, or once as a line.
    fn serving(&self, addr: SocketAddr) {
        let line = format!("live page on http://{addr}/ · metrics on http://{addr}/metrics");
        match self {
            Progress::Bar { bar, step } => {
                let template = format!("{step} {BAR_TEMPLATE}\n{line}");
                if let Ok(style) = ProgressStyle::with_template(&template) {
                    bar.set_style(style);
                }
            }
            Progress::Lines { .. } => eprintln!("{line}"),
            Progress::Quiet => {}
        }
    }

    fn round(&self, record: &RoundRecord) {
        match self {
            Progress::Bar { bar, .. } => {
                bar.set_position(record.round);
                bar.set_message(progress_message(record));
            }
            Progress::Lines {
                every,
                total,
                started,
                step,
            } => {
                if record.round.is_multiple_of(*every) || record.round >= *total {
                    eprintln!(
                        "{step} {}/{total} [{:.1} s] {}",
                        record.round,
                        started.elapsed().as_secs_f64(),
                        progress_message(record)
                    );
                }
            }
            Progress::Quiet => {}
        }
    }

    fn finish(&self) {
        if let Progress::Bar { bar, .. } = self {
            bar.finish();
        }
    }
}

/// One round in a few words: accuracy, loss, clients that answered and bits sent, and under
/// simulated time the simulated clock at the round's end.
pub(crate) fn progress_message(r: &RoundRecord) -> String {
    let simulated = r
        .time
        .as_ref()
        .map_or_else(String::new, |t| format!(" | simulated {:.1} s", t.end));
    format!(
        "acc {:.4} loss {:.4} | {} ok, {} failed | {:.2} Mbit up{simulated}",
        r.accuracy,
        r.loss,
        r.successes,
        r.failures_total(),
        r.uplink_bits as f64 / 1e6
    )
}
