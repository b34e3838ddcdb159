//! `fedshard oneshot …`: one-shot federated learning experiments.

use clap::{Args, Subcommand};
use fedshard_training::oneshot::{RidgeConfig, RidgeForm, run_ridge};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Subcommand)]
pub enum OneshotCommand {
    /// The FESC synthetic ridge experiment (docs/algorithms.md §3.3, Figure 1 of the FESC paper):
    /// mean squared error of centralised, FedAvg, FESC and oracle-FESC estimators versus γ.
    Ridge(RidgeArgs),
}

#[derive(Debug, Args)]
pub struct RidgeArgs {
    /// Number of nodes m.
    #[arg(long, default_value_t = 500)]
    pub nodes: usize,
    /// Dimension d of θ*.
    #[arg(long, default_value_t = 50)]
    pub dim: usize,
    /// Size exponents γ, comma-separated (mean node size m^γ) [default: 0.2,0.3,…,1.2].
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub gammas: Option<Vec<f64>>,
    /// Independent runs per γ.
    #[arg(long, default_value_t = 50)]
    pub runs: usize,
    /// Base seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Local loss: `mean` ((1/n)‖y − Xθ‖² + λ‖θ‖², the paper's) or `sum` (scikit-learn's).
    #[arg(long, default_value_t = RidgeForm::Mean)]
    pub ridge_form: RidgeForm,
    /// Print one JSON object `{"rows": […]}` instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs a `oneshot` subcommand.
pub fn run(command: OneshotCommand) -> anyhow::Result<()> {
    match command {
        OneshotCommand::Ridge(args) => ridge(args),
    }
}

fn ridge(args: RidgeArgs) -> anyhow::Result<()> {
    let config = RidgeConfig {
        nodes: args.nodes,
        dim: args.dim,
        gammas: args.gammas.unwrap_or_else(|| RidgeConfig::default().gammas),
        runs: args.runs,
        seed: args.seed,
        form: args.ridge_form,
    };
    let bar = ProgressBar::new((config.gammas.len() * config.runs) as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} ridge runs {pos}/{len} [{elapsed}, eta {eta}]")
    {
        bar.set_style(style);
    }
    let report = run_ridge(&config, &|| bar.inc(1));
    bar.finish_and_clear();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
