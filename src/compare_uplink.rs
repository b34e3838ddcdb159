//! The uplink grid (the KLMS paper's Tables 1–2 in shape): the same federation run under several
//! compressors, the KLMS ones at several `D_target`, over several seeds, summarised as final test
//! accuracy and the bits each update really took per parameter.
//!
//! The runs go through the one grid runner, [`run_grid`] (journal and `--resume` included); the
//! bits are those of the payload bytes the clients sent (`RoundRecord::uplink_bits`), not a
//! formula.

use crate::compare::{
    GridArm, OnRun, mean_and_sample_std, parse_list, run_grid, t_interval_95, time_per_round,
    time_to, time_to_cell,
};
use crate::compare_journal::{Journal, JournalRow};
use crate::config::Config;
use anyhow::{Context, ensure};
use fedshard_actors::record::{RoundRecord, Summary};
use fedshard_protocol::uplink::{BlockMode, Compressor, qsgd};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One row of the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UplinkArm {
    pub compressor: Compressor,
    /// The adaptive KLMS `D_target`; `None` for the other compressors and fixed blocks.
    pub d_target: Option<u32>,
}

impl UplinkArm {
    /// The row label: `fedpm-klms (D = 2)`.
    pub fn label(&self) -> String {
        match self.d_target {
            Some(d) => format!("{} (D = {d})", self.compressor),
            None => self.compressor.to_string(),
        }
    }
}

/// The rows: each compressor, the adaptive KLMS ones once per `D_target`.
pub fn arms(compressors: &[Compressor], d_targets: &[u32], blocks: BlockMode) -> Vec<UplinkArm> {
    compressors
        .iter()
        .flat_map(|&compressor| {
            let sweep = compressor.klms() && blocks == BlockMode::Adaptive;
            let ds: Vec<Option<u32>> = if sweep {
                d_targets.iter().copied().map(Some).collect()
            } else {
                vec![None]
            };
            ds.into_iter().map(move |d_target| UplinkArm {
                compressor,
                d_target,
            })
        })
        .collect()
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UplinkRun {
    pub compressor: Compressor,
    pub d_target: Option<u32>,
    pub seed: u64,
    pub final_accuracy: Option<f64>,
    /// Uplink bits per parameter per update, averaged over the rounds.
    pub bits_per_parameter: Option<f64>,
    pub uplink_bits_total: Option<u64>,
    pub error: Option<String>,
    pub seconds: f64,
    #[serde(skip)]
    pub accuracy_per_round: Vec<f64>,
    /// The time at the end of each round ([`time_per_round`]); kept, like the accuracies, in
    /// the journal and not in the JSON.
    #[serde(skip)]
    pub time_per_round: Vec<f64>,
}

impl UplinkRun {
    /// When the test accuracy first reached `target`.
    pub fn time_to(&self, target: f64) -> Option<f64> {
        time_to(&self.accuracy_per_round, &self.time_per_round, target)
    }
}

/// The config of one run: `base` with the arm's compressor and `D_target`, and `seed`.
pub fn run_config(base: &Config, arm: &UplinkArm, seed: u64) -> anyhow::Result<Config> {
    let mut config = base.clone();
    config.run.seed = seed;
    config.federation.compressor = arm.compressor;
    config.compression = match arm.compressor {
        Compressor::Identity => None,
        _ => {
            let mut c = base.compression.clone().unwrap_or_default();
            if let Some(d) = arm.d_target {
                c.d_target = d;
            }
            Some(c)
        }
    };
    config.validate()?;
    Ok(config)
}

/// Runs every arm of [`arms`] for every seed through [`run_grid`] (with the journal, when given,
/// as the strategy grid does) and returns the runs in run order.
pub fn compare_uplink(
    base: &Config,
    compressors: &[Compressor],
    d_targets: &[u32],
    seeds: &[u64],
    journal: Option<&mut Journal<UplinkRun>>,
    on_run: &mut OnRun<'_, UplinkRun>,
    on_round: &mut dyn FnMut(&str, &RoundRecord),
) -> anyhow::Result<Vec<UplinkRun>> {
    ensure!(!compressors.is_empty(), "no compressor to compare");
    let blocks = base.compression.clone().unwrap_or_default().blocks;
    let arms = arms(compressors, d_targets, blocks);
    run_grid(base, &arms, seeds, journal, on_run, on_round)
}

impl GridArm for UplinkArm {
    type Run = UplinkRun;

    fn label(&self) -> String {
        UplinkArm::label(self)
    }

    fn config(&self, base: &Config, seed: u64) -> anyhow::Result<Config> {
        run_config(base, self, seed).with_context(|| UplinkArm::label(self))
    }

    /// Final accuracy and the bits per parameter the clients really sent.
    fn result(&self, seed: u64, outcome: anyhow::Result<Summary>, seconds: f64) -> UplinkRun {
        let summary = outcome.as_ref().ok();
        let rounds = summary.map(|s| s.per_round.as_slice()).unwrap_or_default();
        UplinkRun {
            compressor: self.compressor,
            d_target: self.d_target,
            seed,
            final_accuracy: summary.map(|s| s.final_accuracy),
            bits_per_parameter: summary.and_then(Summary::mean_bits_per_parameter),
            uplink_bits_total: summary.map(|s| s.uplink_bits_total),
            error: outcome.as_ref().err().map(|e| format!("{e:#}")),
            seconds,
            accuracy_per_round: rounds.iter().map(|r| r.accuracy).collect(),
            time_per_round: time_per_round(rounds),
        }
    }
}

impl JournalRow for UplinkRun {
    fn per_round(&self) -> (&[f64], &[f64]) {
        (&self.accuracy_per_round, &self.time_per_round)
    }

    fn set_per_round(&mut self, accuracy: Vec<f64>, time: Vec<f64>) {
        self.accuracy_per_round = accuracy;
        self.time_per_round = time;
    }
}

/// The table as markdown: per row, accuracy (mean ± std over seeds), bits per parameter, the
/// saving against the same host without KLMS and against 32-bit floats, and the accuracy against
/// that host paired by seed ([`paired_difference`]). QSGD-KLMS rows are also set against QSGD as
/// the KLMS paper counts it ([`qsgd::reference_bound_bits`] for one update of `parameters` values),
/// since the paper's ratios are against that count and not against a real code.
///
/// With `target = Some((accuracy, clock))`, a last column gives the mean time to that test
/// accuracy over the seeds that reached it, in `clock`'s seconds (`simulated` or `wall`).
pub fn markdown(
    runs: &[UplinkRun],
    (compressors, d_targets, blocks): (&[Compressor], &[u32], BlockMode),
    parameters: usize,
    target: Option<(f64, &str)>,
) -> String {
    let mut out = String::new();
    let time_header = target.map_or_else(String::new, |(accuracy, clock)| {
        format!(
            " {clock} s per round | time to {:.0}% ({clock} s, seeds reaching it) |",
            100.0 * accuracy
        )
    });
    let _ = writeln!(
        out,
        "| compressor | accuracy % | bits / parameter | vs. host without KLMS | vs. f32 | accuracy vs. host, paired by seed (points, 95% CI) | failed runs |{time_header}"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|{}",
        if target.is_some() { "---|---|" } else { "" }
    );
    let row_runs = |arm: &UplinkArm| -> Vec<&UplinkRun> {
        runs.iter()
            .filter(|r| r.compressor == arm.compressor && r.d_target == arm.d_target)
            .collect()
    };
    let bpp = |rs: &[&UplinkRun]| {
        mean_and_sample_std(
            &rs.iter()
                .filter_map(|r| r.bits_per_parameter)
                .collect::<Vec<_>>(),
        )
        .0
    };
    for arm in arms(compressors, d_targets, blocks) {
        let rs = row_runs(&arm);
        let accuracies: Vec<f64> = rs
            .iter()
            .filter_map(|r| r.final_accuracy.map(|a| 100.0 * a))
            .collect();
        let (mean, std) = mean_and_sample_std(&accuracies);
        let bits = bpp(&rs);
        // Against every plain encoding of the same host in the grid (QSGD: five symbols a byte
        // and Elias-coded).
        let plains: Vec<Compressor> = Compressor::ALL
            .into_iter()
            .filter(|c| {
                arm.compressor.klms()
                    && !c.klms()
                    && c.host().is_some()
                    && c.host() == arm.compressor.host()
            })
            .collect();
        let plain_runs = |plain: Compressor| {
            row_runs(&UplinkArm {
                compressor: plain,
                d_target: None,
            })
        };
        let joined = |cells: Vec<String>| {
            if cells.is_empty() {
                "—".to_string()
            } else {
                cells.join("; ")
            }
        };
        let mut versus_host: Vec<String> = plains
            .iter()
            .filter_map(|&plain| {
                let base = bpp(&plain_runs(plain));
                (base.is_finite() && bits > 0.0)
                    .then(|| format!("{:.1}× fewer than {plain}", base / bits))
            })
            .collect();
        if arm.compressor == Compressor::QsgdKlms && bits > 0.0 && parameters > 0 {
            let paper = qsgd::reference_bound_bits(parameters, 1) / parameters as f64;
            versus_host.push(format!(
                "{:.1}× fewer than QSGD as the KLMS paper counts it ({paper:.4}, the QSGD paper's bound)",
                paper / bits
            ));
        }
        let versus_host = joined(versus_host);
        let paired = joined(
            plains
                .iter()
                .filter_map(|&plain| {
                    let d = paired_difference(&rs, &plain_runs(plain))?;
                    let interval = d.interval.map_or_else(String::new, |(low, high)| {
                        format!(" [{low:+.2}, {high:+.2}]")
                    });
                    Some(format!(
                        "{:+.2}{interval} vs {plain}, n = {}",
                        d.mean, d.seeds
                    ))
                })
                .collect(),
        );
        let failed = rs.iter().filter(|r| r.error.is_some()).count();
        // SGLD without KLMS sends f32 values: nothing saved against f32.
        let versus_f32 = match arm.compressor {
            Compressor::Identity | Compressor::Sgld => "—".to_string(),
            _ => format!("{:.0}× fewer", 32.0 / bits),
        };
        let time = target.map_or_else(String::new, |(accuracy, _)| {
            let per_round: Vec<f64> = rs
                .iter()
                .filter_map(|r| Some(r.time_per_round.last()? / r.time_per_round.len() as f64))
                .collect();
            let per_round = if per_round.is_empty() {
                "—".to_string()
            } else {
                format!("{:.2}", mean_and_sample_std(&per_round).0)
            };
            let runs: Vec<(&[f64], &[f64])> = rs
                .iter()
                .map(|r| (&r.accuracy_per_round[..], &r.time_per_round[..]))
                .collect();
            format!(" {per_round} | {} |", time_to_cell(&runs, accuracy))
        });
        let _ = writeln!(
            out,
            "| {} | {mean:.2} ± {std:.2} | {bits:.4} | {versus_host} | {versus_f32} | {paired} | {failed} |{time}",
            arm.label(),
        );
    }
    out
}

/// The accuracy of one row minus another's over the seeds both completed, in points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedDifference {
    pub mean: f64,
    /// The 95% Student-t interval of the mean difference; `None` below two seeds.
    pub interval: Option<(f64, f64)>,
    pub seeds: usize,
}

/// `runs` minus `baseline`, paired by seed: the same seed gives both the same data split and
/// initial model, so the seeds' spread (often several points) cancels and a difference of a
/// point can be told from noise. `None` when no seed completed in both.
pub fn paired_difference(runs: &[&UplinkRun], baseline: &[&UplinkRun]) -> Option<PairedDifference> {
    let differences: Vec<f64> = runs
        .iter()
        .filter_map(|r| {
            let base = baseline.iter().find(|b| b.seed == r.seed)?.final_accuracy?;
            Some(100.0 * (r.final_accuracy? - base))
        })
        .collect();
    if differences.is_empty() {
        return None;
    }
    let (mean, std) = mean_and_sample_std(&differences);
    Some(PairedDifference {
        mean,
        interval: t_interval_95(mean, std, differences.len()),
        seeds: differences.len(),
    })
}

/// `D_target` values parsed from `1,2,4`.
pub fn parse_d_targets(list: &str) -> anyhow::Result<Vec<u32>> {
    list.split(',')
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .ok()
                .filter(|d| (1..=16).contains(d))
                .with_context(|| format!("expected whole bits per block in 1..=16, found `{t}`"))
        })
        .collect()
}

/// Compressor names parsed from `fedpm,fedpm-klms` (no empty entries, no repeats).
pub fn parse_compressors(list: &str) -> anyhow::Result<Vec<Compressor>> {
    parse_list(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seed: u64, accuracy: Option<f64>) -> UplinkRun {
        UplinkRun {
            compressor: Compressor::Signsgd,
            d_target: None,
            seed,
            final_accuracy: accuracy,
            bits_per_parameter: Some(1.0),
            uplink_bits_total: Some(1),
            error: None,
            seconds: 0.0,
            accuracy_per_round: vec![],
            time_per_round: vec![],
        }
    }

    #[test]
    fn paired_difference_pairs_by_seed_and_skips_what_did_not_complete() {
        let klms = [
            run(1, Some(0.80)),
            run(2, Some(0.70)),
            run(3, Some(0.60)),
            run(5, Some(0.99)),
        ];
        let host = [
            run(3, Some(0.63)),
            run(1, Some(0.81)),
            run(2, Some(0.72)),
            run(4, Some(0.10)),
            run(5, None),
        ];
        let d = paired_difference(
            &klms.iter().collect::<Vec<_>>(),
            &host.iter().collect::<Vec<_>>(),
        )
        .expect("three pairs");
        // Differences −1, −2, −3 points: mean −2, std 1, t(0.975; 2) = 4.302653.
        assert_eq!(d.seeds, 3);
        assert!((d.mean + 2.0).abs() < 1e-9, "{d:?}");
        let half = 4.302_653 / 3f64.sqrt();
        let (low, high) = d.interval.expect("an interval");
        assert!(
            (low - (-2.0 - half)).abs() < 1e-5 && (high - (-2.0 + half)).abs() < 1e-5,
            "{d:?}"
        );
        assert_eq!(
            paired_difference(&[&run(9, Some(0.5))], &host.iter().collect::<Vec<_>>()),
            None
        );
    }

    #[test]
    fn qsgd_klms_rows_are_set_against_elias_and_against_the_papers_count() {
        let with = |compressor, d_target, bits| UplinkRun {
            compressor,
            d_target,
            bits_per_parameter: Some(bits),
            ..run(1, Some(0.8))
        };
        let runs = [
            with(Compressor::QsgdElias, None, 0.0685),
            with(Compressor::QsgdKlms, Some(8), 0.0253),
        ];
        let compressors = [Compressor::QsgdElias, Compressor::QsgdKlms];
        let table = markdown(&runs, (&compressors, &[8], BlockMode::Adaptive), 7850, None);
        // 0.0685 / 0.0253 = 2.71; the bound for 7 850 values is 1 302.5 bits, 0.1659 a value,
        // 6.56 times 0.0253.
        assert!(
            table.contains(
                "2.7× fewer than qsgd-elias; 6.6× fewer than QSGD as the KLMS paper counts it (0.1659,"
            ),
            "{table}"
        );
        assert_eq!(
            table.matches("as the KLMS paper counts it").count(),
            1,
            "{table}"
        );
    }

    /// The time to a target is the end of the first round at or above it, averaged over the
    /// seeds that reached it; a row that never did says so.
    #[test]
    fn the_time_to_a_target_is_the_first_round_that_reaches_it() {
        let curve = |seed, accuracy: &[f64]| UplinkRun {
            accuracy_per_round: accuracy.to_vec(),
            time_per_round: vec![10.0, 20.0, 30.0],
            ..run(seed, accuracy.last().copied())
        };
        let reached = [curve(1, &[0.5, 0.91, 0.95]), curve(2, &[0.9, 0.8, 0.95])];
        assert_eq!(reached[0].time_to(0.9), Some(20.0));
        assert_eq!(reached[1].time_to(0.9), Some(10.0));
        let table = markdown(
            &reached,
            (&[Compressor::Signsgd], &[], BlockMode::Fixed),
            10,
            Some((0.9, "simulated")),
        );
        assert!(table.contains("time to 90% (simulated s"), "{table}");
        assert!(table.contains("| 10.00 | 15.0 (2/2) |"), "{table}");
        let never = markdown(
            &[curve(1, &[0.1, 0.2, 0.3])],
            (&[Compressor::Signsgd], &[], BlockMode::Fixed),
            10,
            Some((0.9, "simulated")),
        );
        assert!(never.contains("| 10.00 | never (0/1) |"), "{never}");
    }

    #[test]
    fn rounds_are_timed_by_the_simulated_clock_when_there_is_one() {
        let record = |seconds, time: Option<f64>| {
            RoundRecord {
            seconds,
            time: time.map(|end| fedshard_actors::record::SimulatedTime {
                end,
                ..Default::default()
            }),
            ..serde_json::from_str(r#"{"round":1,"participants":0,"successes":0,"failures":{},"rejected":{},"model_updated":false,"accuracy":0,"loss":0,"train_loss":0,"uplink_bits":0,"client_uplink_bits":{},"downlink_bits":0,"bits_per_parameter":0,"anme":0,"groups":[],"learning_rate":0,"client_train_seconds":[],"seconds":0}"#).unwrap()
        }
        };
        assert_eq!(
            time_per_round(&[record(1.0, None), record(2.0, None)]),
            vec![1.0, 3.0]
        );
        assert_eq!(time_per_round(&[record(1.0, Some(40.0))]), vec![40.0]);
    }
}
