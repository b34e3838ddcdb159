//! The `fedshard` command line.

use clap::{Parser, Subcommand};

pub mod oneshot;

#[derive(Debug, Parser)]
#[command(
    name = "fedshard",
    version,
    about = "Federated learning for heterogeneous clients"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One-shot federated learning experiments.
    Oneshot {
        #[command(subcommand)]
        command: oneshot::OneshotCommand,
    },
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Oneshot { command } => oneshot::run(command),
    }
}
