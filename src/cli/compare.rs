//! `fedshard compare`: the paper's Table 1 for a config (the grid lives in [`crate::compare`]).

use crate::compare::{self, DEFAULT_SETUPS, DEFAULT_STRATEGIES, RunResult};
use crate::compare_journal::{Journal, JournalRow};
use crate::config::{Config, Overrides};
use crate::federation;
use anyhow::{Context, ensure};
use clap::Args;
use fedshard_actors::record::RoundRecord;
use fedshard_strategies::sharding::strategy::Strategy;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The TOML config: its data, model and training are shared by every run.
    pub config: PathBuf,
    /// Comma-separated strategy names (see `fedshard probs --help`). Parsed here rather than by
    /// clap so that an unknown name is a one-line error (exit code 2) like every other bad input.
    #[arg(long, default_value = DEFAULT_STRATEGIES)]
    pub strategies: String,
    /// Number of seeds: the config's `run.seed`, seed + 1, ….
    #[arg(long, default_value_t = 3)]
    pub seeds: usize,
    /// Comma-separated keep-ratio setups, one table column each: ratios in (0, 1], or `mixed`
    /// (60% of the clients r = 0.2, 40% r = 0.4).
    #[arg(long, default_value = DEFAULT_SETUPS)]
    pub keep_ratios: String,
    /// How width strategies (`heterofl`, `fedrolex`, `fjord`) sit next to the spectral ones: `cost`, at
    /// the widest slice whose multiply-adds per sample do not exceed the spectral sub-model's
    /// at the column's keep ratio (a client's budget is what it can compute); `ratio`, at the
    /// column's keep ratio itself (which leaves a width client about r² of an inner layer).
    #[arg(long, value_enum, default_value_t = compare::Budget::Cost)]
    pub budget: compare::Budget,
    /// Override `run.rounds` (for quick runs).
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Print the per-run results `{"runs": [{strategy, setup, seed, final_accuracy, mean_anme,
    /// mean_update_cosine, error, seconds}, …]}` instead of the table (`null` accuracy, ANME and
    /// cosine for a failed run).
    #[arg(long)]
    pub json: bool,
    /// Also write the table as `table.md` and `table.csv`, every run as `runs.csv`, and per
    /// setup a figure of test accuracy per round (`accuracy-SETUP.svg`, `.png`) into this folder.
    /// Each run is also appended to `DIR/runs.jsonl` as soon as it ends, so a stopped grid keeps
    /// what it finished (see --resume).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Reuse the runs that `--out DIR/runs.jsonl` already holds for an identical config
    /// (strategy or compressor, keep ratios, seed, rounds, recipe, data) instead of running
    /// them again, in either grid: a long grid continues where it stopped, or grows by seeds.
    /// Results of a different code version are reused too; that is your call. Without it an
    /// existing journal is an error.
    #[arg(long, requires = "out")]
    pub resume: bool,
    /// Compare uplink compressors instead of sharding strategies (the KLMS paper's Tables 1–2):
    /// comma-separated names (`identity`, `qsgd`, `qsgd-elias`, `qsgd-klms`, `signsgd`, `signsgd-klms`,
    /// `fedpm`, `fedpm-klms`, `sgld`, `sgld-klms`); the config's strategy and keep ratios stay.
    /// Prints accuracy and the bits per parameter the clients really sent.
    #[arg(long, value_name = "LIST")]
    pub compressors: Option<String>,
    /// With --compressors: the adaptive KLMS `D_target` values, one row each.
    #[arg(long, value_name = "LIST", default_value = "2")]
    pub d_targets: String,
    /// Also the mean time to this test accuracy (a fraction such as 0.9) per row, or per
    /// strategy and setup in a table of its own, in simulated seconds under `--clock virtual` or
    /// `[run] clock = "virtual"`, else in the wall clock's.
    #[arg(long, value_name = "ACCURACY", value_parser = accuracy_target)]
    pub target: Option<f64>,
    /// Real or simulated time for every run, over the config's `run.clock`.
    #[arg(long, value_enum)]
    pub clock: Option<super::Clock>,
}

/// What the times of `config`'s runs count: `simulated` or `wall` seconds.
fn clock_name(config: &Config) -> &'static str {
    match config.run.clock {
        fedshard_actors::clock::ClockKind::Virtual => "simulated",
        fedshard_actors::clock::ClockKind::Wall => "wall",
    }
}

/// What a grid with width strategies compares them at, for the table: the equal-cost width
/// ratio of each keep ratio, or the equal nominal ratio; `None` without width strategies.
fn budget_note(
    config: &Config,
    strategies: &[Strategy],
    setups: &[compare::Setup],
    budget: compare::Budget,
) -> anyhow::Result<Option<String>> {
    if !strategies.iter().any(|s| matches!(s, Strategy::Width(_))) {
        return Ok(None);
    }
    Ok(Some(match budget {
        compare::Budget::Ratio => {
            "Width strategies at equal nominal keep ratio (`--budget ratio`).".to_string()
        }
        compare::Budget::Cost => {
            let costs = compare::Costs::of(config)?;
            let mut ratios: Vec<f64> = setups
                .iter()
                .flat_map(|s| s.keep_ratios.iter().map(|k| k.ratio))
                .collect();
            ratios.sort_by(f64::total_cmp);
            ratios.dedup();
            let matches = ratios
                .into_iter()
                .map(|r| costs.equal_cost(r))
                .collect::<anyhow::Result<Vec<_>>>()?;
            format!(
                "Width strategies at equal cost (`--budget cost`, the default): {}.",
                compare::describe(&matches)
            )
        }
    }))
}

/// The flags beyond the grid's own that a Reproduce line must repeat.
fn extra_flags(args: &CompareArgs) -> String {
    let clock = args.clock.map(|c| match c {
        super::Clock::Virtual => " --clock virtual".to_string(),
        super::Clock::Wall => " --clock wall".to_string(),
    });
    let target = args.target.map(|t| format!(" --target {t}"));
    let budget = (args.budget == compare::Budget::Ratio).then(|| " --budget ratio".to_string());
    clock.into_iter().chain(target).chain(budget).collect()
}

/// `--target`: a test accuracy in (0, 1].
fn accuracy_target(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(a) if a > 0.0 && a <= 1.0 => Ok(a),
        _ => Err(format!(
            "expected a test accuracy in (0, 1], such as 0.9; got `{text}`"
        )),
    }
}

#[derive(Debug, Serialize)]
struct CompareReport {
    runs: Vec<RunResult>,
}

/// Runs the grid with a progress line per run on stderr, then prints the table or the JSON.
pub fn run(args: &CompareArgs) -> anyhow::Result<()> {
    if let Some(list) = &args.compressors {
        return run_uplink(args, list);
    }
    let strategies = compare::parse_strategies(&args.strategies).context("--strategies")?;
    let setups = compare::parse_setups(&args.keep_ratios).context("--keep-ratios")?;
    let (config, seeds) = config_and_seeds(args)?;
    let mut journal = open_journal(args)?;
    let budget = budget_note(&config, &strategies, &setups, args.budget)?;
    if let Some(note) = &budget {
        eprintln!("{note}");
    }
    let started = Instant::now();
    let runs = compare::compare(
        &config,
        &strategies,
        &setups,
        args.budget,
        &seeds,
        journal.as_mut(),
        &mut |k, total, r, resumed| {
            let outcome = match (r.final_accuracy, &r.error) {
                (Some(accuracy), _) => format!("{:.1}%", 100.0 * accuracy),
                (None, error) => format!("failed: {}", error.as_deref().unwrap_or("no result")),
            };
            let source = if resumed { ", from the journal" } else { "" };
            eprintln!(
                "[{k}/{total}] {} {} seed {} → {outcome} ({:.1} s{source})",
                r.strategy, r.setup, r.seed, r.seconds
            );
        },
        &mut round_lines(config.run.rounds, config.federation.schedule.step()),
    )
    .with_context(|| args.config.display().to_string())?;
    eprintln!(
        "{} runs in {:.1} s",
        runs.len(),
        started.elapsed().as_secs_f64()
    );
    let names = |items: Vec<String>| items.join(",");
    let mut markdown = String::new();
    let _ = writeln!(
        markdown,
        "Final test accuracy in % (mean ± std over seeds {}) and ANME (mean over rounds and \
         seeds) on {}: {}.",
        names(seeds.iter().map(ToString::to_string).collect()),
        args.config.display(),
        config.schedule_caption()
    );
    let _ = writeln!(
        markdown,
        "Reproduce: `fedshard compare {} --strategies {} --keep-ratios {} --seeds {} --rounds {}{}`",
        args.config.display(),
        names(strategies.iter().map(ToString::to_string).collect()),
        names(setups.iter().map(|s| s.name.clone()).collect()),
        args.seeds,
        config.run.rounds,
        extra_flags(args)
    );
    if let Some(note) = &budget {
        let _ = writeln!(markdown, "\n{note}");
    }
    markdown.push('\n');
    markdown.push_str(&compare::table(&runs, &strategies, &setups));
    markdown.push('\n');
    markdown.push_str(&compare::ranking(&runs, &strategies, &setups));
    if let Some(target) = args.target {
        markdown.push('\n');
        markdown.push_str(&compare::time_table(
            &runs,
            (&strategies, &setups),
            target,
            clock_name(&config),
        ));
    }
    if let Some(out) = &args.out {
        let step = config.federation.schedule.step();
        crate::report::compare::write(out, &markdown, &runs, &strategies, &setups, step)?;
        eprintln!("wrote the table and figures into {}", out.display());
    }
    if args.json {
        return super::print_json(&CompareReport { runs });
    }
    print!("{markdown}");
    Ok(())
}

/// The journal of `--out DIR` (with `--resume`, the runs it holds are reused), for either grid.
fn open_journal<R: JournalRow>(args: &CompareArgs) -> anyhow::Result<Option<Journal<R>>> {
    let Some(dir) = args.out.as_deref() else {
        return Ok(None);
    };
    let journal = Journal::open(dir, args.resume)?;
    if !journal.is_empty() {
        eprintln!(
            "resuming: {} holds {} runs",
            journal.path().display(),
            journal.len()
        );
    }
    Ok(Some(journal))
}

/// The config with `--rounds` and `--clock` laid over it, and the `--seeds` seeds from its
/// `run.seed` on.
fn config_and_seeds(args: &CompareArgs) -> anyhow::Result<(Config, Vec<u64>)> {
    ensure!(args.seeds >= 1, "--seeds: expected at least 1, found 0");
    let overrides = Overrides {
        rounds: args.rounds,
        clock: args.clock.map(Into::into),
        ..Overrides::default()
    };
    let config = Config::load_with(&args.config, &overrides)?;
    let seeds = compare::seeds(config.run.seed, args.seeds);
    config.log_warnings();
    Ok((config, seeds))
}

/// Progress inside a grid's runs, on stderr: a line at every tenth of a run's `rounds` (the
/// run's own line follows its last), so a grid of long runs never goes quiet for long.
fn round_lines(rounds: u64, step: &'static str) -> impl FnMut(&str, &RoundRecord) {
    let every = rounds.div_ceil(10).max(1);
    // The run's label and the seconds its rounds took so far.
    let mut current = (String::new(), 0.0);
    move |label, record| {
        if current.0 != label {
            current = (label.to_string(), 0.0);
        }
        current.1 += record.seconds;
        if record.round.is_multiple_of(every) && record.round < rounds {
            eprintln!(
                "{label} {step} {}/{rounds} [{:.1} s] {}",
                record.round,
                current.1,
                super::run::progress_message(record)
            );
        }
    }
}

/// `fedshard compare --compressors`: the uplink grid of [`crate::compare_uplink`].
fn run_uplink(args: &CompareArgs, list: &str) -> anyhow::Result<()> {
    use crate::compare_uplink::{self, parse_compressors, parse_d_targets};
    let compressors = parse_compressors(list).context("--compressors")?;
    let d_targets = parse_d_targets(&args.d_targets).context("--d-targets")?;
    let (config, seeds) = config_and_seeds(args)?;
    let mut journal = open_journal(args)?;
    let runs = compare_uplink::compare_uplink(
        &config,
        &compressors,
        &d_targets,
        &seeds,
        journal.as_mut(),
        &mut |k, total, r, resumed| {
            let outcome = match (r.final_accuracy, r.bits_per_parameter, &r.error) {
                (Some(a), Some(b), _) => format!("{:.1}%, {b:.4} bits/parameter", 100.0 * a),
                (_, _, error) => format!("failed: {}", error.as_deref().unwrap_or("no result")),
            };
            let d = r.d_target.map(|d| format!(" D = {d}")).unwrap_or_default();
            let source = if resumed { ", from the journal" } else { "" };
            eprintln!(
                "[{k}/{total}] {}{d} seed {} → {outcome} ({:.1} s{source})",
                r.compressor, r.seed, r.seconds
            );
        },
        &mut round_lines(config.run.rounds, config.federation.schedule.step()),
    )
    .with_context(|| args.config.display().to_string())?;
    if args.json {
        return super::print_json(&serde_json::json!({ "runs": runs }));
    }
    let blocks = config.compression.clone().unwrap_or_default().blocks;
    let parameters = federation::initial_model(&config, config.run.seed).num_parameters();
    let table = compare_uplink::markdown(
        &runs,
        (&compressors, &d_targets, blocks),
        parameters,
        args.target.map(|t| (t, clock_name(&config))),
    );
    println!(
        "Final test accuracy in % (mean ± std over {} seeds) and uplink bits per parameter per \
         update (mean over rounds) on {}: {}.\n\n{table}\n\
         Reproduce: `fedshard compare {} --compressors {list} --d-targets {} --seeds {} --rounds {}{}`",
        args.seeds,
        args.config.display(),
        config.schedule_caption(),
        args.config.display(),
        args.d_targets,
        args.seeds,
        config.run.rounds,
        extra_flags(args)
    );
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
        let path = dir.join("compressors.md");
        std::fs::write(&path, &table).with_context(|| path.display().to_string())?;
    }
    Ok(())
}
