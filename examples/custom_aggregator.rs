//! Bring your own aggregator: a coordinate-wise trimmed mean (each value of a block moves to
//! the mean of its holders' values without the smallest and the largest, a robust rule
//! against one wild client), written against the `Aggregator` seam, checked by hand on small
//! updates, then used in a federation on the embedded digits in place of the config's
//! `aggregator`. Exits non-zero if the hand computation or the run's accuracy disagrees.
//!
//! Run: `cargo run --release --example custom_aggregator` (CI runs it through
//! tests/examples.rs).

use fedshard::config::Config;
use fedshard::federation;
use fedshard_strategies::StrategyError;
use fedshard_strategies::aggregation::{Aggregator, Contribution, Fit, FitRound, RoundOutcome};
use std::path::Path;
use std::sync::Arc;

/// Coordinate-wise trimmed mean. Sample counts are ignored: every holder of a value counts
/// once, which is what makes one client's outlier unable to move the model far.
#[derive(Debug)]
struct TrimmedMean;

impl Aggregator for TrimmedMean {
    fn name(&self) -> &'static str {
        "trimmed-mean"
    }

    /// For every block, the holders' values of each coordinate, sorted; with three holders or
    /// more the extremes are dropped; the block takes the mean of the rest. A block nobody
    /// trained keeps its values. Everything is checked before a value is written, so on
    /// error the model is untouched (the seam's contract).
    fn aggregate_fit(
        &self,
        global: &mut [&mut [f32]],
        round: &FitRound,
    ) -> Result<Fit, StrategyError> {
        if round.updates.is_empty() {
            return Ok(Fit::NoUpdate("no successful results".into()));
        }
        let mut holders: Vec<Vec<&[f32]>> = vec![Vec::new(); global.len()];
        for blocks in round.updates {
            for &(b, values) in blocks {
                let fits = global.get(b).is_some_and(|g| g.len() == values.len());
                if !fits || values.iter().any(|v| !v.is_finite()) {
                    return Err(StrategyError::invalid(
                        "block update",
                        format!("block {b}: out of range, of the wrong length or not finite"),
                    ));
                }
                holders[b].push(values);
            }
        }
        for (block, held) in global.iter_mut().zip(&holders) {
            if held.is_empty() {
                continue;
            }
            let trim = usize::from(held.len() >= 3);
            for (k, x) in block.iter_mut().enumerate() {
                let mut column: Vec<f32> = held.iter().map(|values| values[k]).collect();
                column.sort_by(f32::total_cmp);
                let kept = &column[trim..column.len() - trim];
                let sum: f64 = kept.iter().map(|&v| f64::from(v)).sum();
                *x = (sum / kept.len() as f64) as f32;
            }
        }
        Ok(Fit::Updated)
    }
}

/// The aggregator against a hand computation: three clients, one of them wild.
fn check_by_hand() -> anyhow::Result<()> {
    let (mut block0, mut block1, mut block2) = ([0.0f32, 0.0], [5.0f32], [9.0f32]);
    let results = [0, 1, 2].map(|client| Contribution {
        client,
        samples: 10.0,
        inclusion_probability: 1.0,
    });
    let updates = vec![
        vec![(0, &[1.0f32, 10.0][..])],
        vec![(0, &[2.0, -40.0][..])],
        vec![(0, &[3.0, 4.0][..]), (1, &[7.0][..])],
    ];
    let round = FitRound {
        outcome: RoundOutcome {
            results: &results,
            failures: &[],
            population_samples: 30.0,
        },
        updates: &updates,
    };
    let mut global = [&mut block0[..], &mut block1[..], &mut block2[..]];
    let fit = TrimmedMean.aggregate_fit(&mut global, &round)?;
    anyhow::ensure!(fit == Fit::Updated, "expected an update, got {fit:?}");
    // Block 0, value 0: {1, 2, 3} without 1 and 3 → 2. Value 1: {10, −40, 4} without −40 and
    // 10 → 4 (a mean would give −8.67). Block 1 has one holder → 7. Block 2 none → stays 9.
    anyhow::ensure!(
        block0 == [2.0, 4.0] && block1 == [7.0] && block2 == [9.0],
        "by hand: [2, 4], [7], [9]; got {block0:?}, {block1:?}, {block2:?}"
    );
    Ok(())
}

/// A whole config: the digits MLP, 10 clients, all 10 every round.
const CONFIG: &str = r#"
[run]
name = "custom-aggregator"
seed = 3
rounds = 4

[data]
dataset = "digits"
clients = 10

[model]
kind = "neural"

[model.network]
architecture = "mlp"
inputs = 64
hidden = [64]
classes = 10

[training]
learning_rate = 0.05
momentum = 0.5
epochs = 2
batch_size = 16

[federation]
clients_per_round = 10
aggregator = "fedavg"
"#;

/// Held-out accuracy the run must reach.
const MIN_ACCURACY: f64 = 0.80;

pub fn main() -> anyhow::Result<()> {
    check_by_hand()?;
    let config = Config::parse(CONFIG, Path::new("custom_aggregator.toml"))?;
    let (mut federation, trainers) = federation::in_process(&config)?;
    // In place of the config's `fedavg`; the engine checks it against the schedule.
    federation.aggregator = Some(Arc::new(TrimmedMean));
    let (_, summary) = federation::run(federation, trainers)?;
    let accuracy = summary.final_accuracy;
    println!(
        "custom aggregator: held-out accuracy {accuracy:.3} after {} rounds",
        summary.rounds_completed
    );
    anyhow::ensure!(
        accuracy >= MIN_ACCURACY,
        "accuracy {accuracy:.3} is below {MIN_ACCURACY}"
    );
    Ok(())
}
