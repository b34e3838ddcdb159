//! `fedshard sample`: empirical inclusion frequencies of a joint sampler.

use super::input::read_vector;
use anyhow::Context;
use clap::Args;
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::sampling::{SamplerName, prepare};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct SampleArgs {
    /// conditional-poisson, brewer, minimum-support, systematic or numpy-choice. Parsed by
    /// [`sample`] rather than by clap so that an unknown name is a one-line error (exit code 2).
    #[arg(long)]
    pub method: String,
    /// Number of independent draws.
    #[arg(long)]
    pub draws: u64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// JSON array of inclusion probabilities (numpy-choice: selection weights).
    #[arg(long)]
    pub pi: PathBuf,
    /// Sample size; required for numpy-choice, otherwise Σπ.
    #[arg(long)]
    pub n: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct SampleReport {
    pub method: String,
    pub n: usize,
    pub draws: u64,
    pub frequencies: Vec<f64>,
    pub seconds_per_draw: f64,
}

pub fn sample(args: &SampleArgs) -> anyhow::Result<SampleReport> {
    let method: SamplerName = args.method.parse().context("--method")?;
    if args.draws == 0 {
        anyhow::bail!("--draws must be at least 1");
    }
    let values = read_vector(&args.pi, "inclusion probabilities")?;
    let design = prepare(method, &values, args.n)
        .with_context(|| format!("{} ({})", args.pi.display(), method))?;
    let mut rng = stream(args.seed, 0, 0, Purpose::Experiment);
    let mut counts = vec![0u64; values.len()];
    let mut drawn = Vec::with_capacity(design.sample_size());
    let started = Instant::now();
    for _ in 0..args.draws {
        design.draw_into(&mut rng, &mut drawn);
        for &i in &drawn {
            counts[i] += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(SampleReport {
        method: method.to_string(),
        n: design.sample_size(),
        draws: args.draws,
        frequencies: counts
            .iter()
            .map(|&c| c as f64 / args.draws as f64)
            .collect(),
        seconds_per_draw: seconds / args.draws as f64,
    })
}
