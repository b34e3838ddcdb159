//! `fedshard bench job CONFIG`: a config's federation end to end in this process, and where its
//! rounds spent their time: planning (the sharding SVDs), training, aggregation (validation, the
//! fold, the update cosine), evaluation and the rest, the runtime's own messaging.
//!
//! Why: a round is mostly local training, so the figure a user compares with Flower + PyTorch
//! is the whole job's wall clock; the split says which part to look at when it is slow. The
//! model's digest lets two runs be compared for bit-identity without keeping their files.

use super::profile::profiled;
use crate::config::{Config, Overrides};
use clap::Args;
use fedshard_actors::record::RoundRecord;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct JobBenchArgs {
    /// The federation to run (a TOML config, e.g. config/digits-cnn.toml).
    pub config: PathBuf,
    /// Rounds to run instead of the config's `run.rounds`.
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Where neural clients train, instead of the config's `training.device`.
    #[arg(long, value_enum)]
    pub device: Option<crate::config::Device>,
    /// Whether neural clients train in cohorts, instead of the config's `training.cohorts`.
    #[arg(long, value_enum, value_name = "on|off")]
    pub cohorts: Option<super::OnOff>,
    /// Real or simulated time, instead of the config's `run.clock`.
    #[arg(long, value_enum)]
    pub clock: Option<super::Clock>,
    /// Write a sampling profile of the whole job (every thread) to this file as folded stacks
    /// (a build with `--features profile`).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// Seconds of the whole job, by phase (sums over the rounds).
#[derive(Debug, Default, Serialize)]
pub struct JobSeconds {
    /// Building the federation before round 1: data, partition, clients, initial model.
    pub setup: f64,
    pub plan: f64,
    pub train: f64,
    pub aggregate: f64,
    pub evaluate: f64,
    /// The rest of the rounds' time: messages, task encoding, checkpoint-free bookkeeping.
    pub orchestration: f64,
    /// From start to the last round's record, as the wall clock saw it.
    pub wall: f64,
}

/// How the rounds' own times spread: a first round far above the rest is warm-up (on a GPU,
/// compiling each kernel the first time a shape needs it), a slowest round far above the
/// median a stall.
#[derive(Debug, Serialize, PartialEq)]
pub struct RoundSpread {
    pub first: f64,
    /// The median of the rounds after the first.
    pub median_after_first: f64,
    pub slowest: f64,
}

impl RoundSpread {
    /// `None` for fewer than two rounds.
    fn of(seconds: &[f64]) -> Option<Self> {
        let (&first, rest) = seconds.split_first()?;
        let mut rest = rest.to_vec();
        rest.sort_by(f64::total_cmp);
        let median = match rest.len() {
            0 => return None,
            n if n % 2 == 1 => rest[n / 2],
            n => (rest[n / 2 - 1] + rest[n / 2]) / 2.0,
        };
        Some(Self {
            first,
            median_after_first: median,
            slowest: seconds.iter().copied().fold(first, f64::max),
        })
    }
}

#[derive(Debug, Serialize)]
pub struct JobReport {
    pub config: PathBuf,
    pub rounds: u64,
    /// What `rounds` counts: `round`, or `version` in async mode.
    pub step: &'static str,
    pub final_accuracy: f64,
    pub seconds: JobSeconds,
    /// The spread of the rounds' times (absent for a one-round job).
    pub rounds_spread: Option<RoundSpread>,
    /// FNV-1a 64 of the final model's bytes: equal digests, bit-identical models.
    pub model_digest: String,
    pub threads: usize,
    pub device: crate::config::Device,
    /// On the CPU, the micro-kernels its matrix products ran on (`Device::products`): the
    /// digest is this path's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub products: Option<&'static str>,
    /// Whether the neural clients trained in cohorts.
    pub cohorts: bool,
    /// The clock the run was timed by, and under simulated time the run's simulated seconds
    /// (the end of its last round).
    pub clock: fedshard_actors::clock::ClockKind,
    pub simulated_seconds: Option<f64>,
}

pub fn job(args: &JobBenchArgs) -> anyhow::Result<JobReport> {
    let overrides = Overrides {
        rounds: args.rounds,
        device: args.device,
        cohorts: args.cohorts.map(super::OnOff::is_on),
        clock: args.clock.map(Into::into),
        ..Overrides::default()
    };
    let config = Config::load_with(&args.config, &overrides)?;
    let started = Instant::now();
    let (model, summary) = profiled(args.profile.as_deref(), || {
        crate::federation::run_to_end(&config)
    })?;
    let wall = started.elapsed().as_secs_f64();
    let history: &[RoundRecord] = &summary.per_round;
    let sum = |f: fn(&RoundRecord) -> f64| history.iter().map(f).sum::<f64>();
    let rounds_total = sum(|r| r.seconds);
    let mut seconds = JobSeconds {
        setup: (wall - rounds_total).max(0.0),
        plan: sum(|r| r.phases.plan),
        train: sum(|r| r.phases.train),
        aggregate: sum(|r| r.phases.aggregate),
        evaluate: sum(|r| r.phases.evaluate),
        wall,
        ..Default::default()
    };
    seconds.orchestration =
        (rounds_total - seconds.plan - seconds.train - seconds.aggregate - seconds.evaluate)
            .max(0.0);
    Ok(JobReport {
        config: args.config.clone(),
        rounds: summary.rounds_completed,
        step: config.federation.schedule.step(),
        final_accuracy: summary.final_accuracy,
        seconds,
        rounds_spread: RoundSpread::of(&history.iter().map(|r| r.seconds).collect::<Vec<_>>()),
        model_digest: format!("{:016x}", fnv1a(&model.to_bytes())),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        device: config.training.device,
        products: config.training.device.products(),
        cohorts: config.training.cohorts,
        clock: config.run.clock,
        simulated_seconds: history.last().and_then(|r| r.time.as_ref()).map(|t| t.end),
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(bytes);
    hasher.finish()
}

/// The human-readable report: the total, then each phase in seconds per round and in share.
pub fn describe(r: &JobReport) -> String {
    let s = &r.seconds;
    let per_round = |x: f64| x / r.rounds.max(1) as f64;
    let mut text = format!(
        "job {}: {} {}s in {:.2} s wall on {} core(s), training on {}, cohorts {}, final accuracy {:.4}, model digest {}\n",
        r.config.display(),
        r.rounds,
        r.step,
        s.wall,
        r.threads,
        r.device.label(),
        if r.cohorts { "on" } else { "off" },
        r.final_accuracy,
        r.model_digest
    );
    if let Some(simulated) = r.simulated_seconds {
        text += &format!("  simulated time: {simulated:.1} s\n");
    }
    text += &format!(
        "  {:<14} {:>9} {:>10} {:>6}\n",
        "phase",
        "total s",
        format!("s/{}", r.step),
        "share"
    );
    for (name, value) in [
        ("setup", s.setup),
        ("plan (SVD)", s.plan),
        ("train", s.train),
        ("aggregate", s.aggregate),
        ("evaluate", s.evaluate),
        ("orchestration", s.orchestration),
    ] {
        text += &format!(
            "  {name:<14} {value:>9.3} {:>10.4} {:>5.1}%\n",
            per_round(value),
            100.0 * value / s.wall.max(f64::MIN_POSITIVE)
        );
    }
    if let Some(spread) = &r.rounds_spread {
        text += &format!(
            "  {step}s: the first {:.3} s, then a median of {:.3} s, the slowest {:.3} s\n",
            spread.first,
            spread.median_after_first,
            spread.slowest,
            step = r.step
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{RoundSpread, fnv1a};

    #[test]
    fn a_rounds_spread_sets_the_first_round_apart() {
        let spread = RoundSpread::of(&[3.0, 0.2, 0.4, 0.1, 0.3]).expect("five rounds");
        assert_eq!(
            spread,
            RoundSpread {
                first: 3.0,
                median_after_first: 0.25,
                slowest: 3.0
            }
        );
        let spread = RoundSpread::of(&[0.1, 0.5, 0.2]).expect("three rounds");
        assert_eq!((spread.median_after_first, spread.slowest), (0.35, 0.5));
        assert_eq!(RoundSpread::of(&[1.0]), None);
        assert_eq!(RoundSpread::of(&[]), None);
    }

    #[test]
    fn fnv1a_has_its_published_test_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
