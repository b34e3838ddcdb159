//! Which figures a run folder and a report show, built from the rounds as plain data so they are
//! tested without drawing.

use super::figure::{Figure, Legend, Series, ValueAxis};
use super::rounds::{RoundPoint, Run};
use crate::config::Mode;
use std::collections::BTreeMap;

/// One number per round, for figures that overlay several runs.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// File stem and HTML anchor: `accuracy`, `uplink-bits`, ….
    pub stem: &'static str,
    pub title: &'static str,
    pub value_label: &'static str,
    pub value_axis: ValueAxis,
    pub legend: Legend,
    pub value: fn(&RoundPoint) -> f64,
}

/// The metrics `fedshard report` overlays, one figure each, in page order.
pub const METRICS: [Metric; 8] = [
    Metric {
        stem: "accuracy",
        title: "Test accuracy per round",
        value_label: "accuracy",
        value_axis: ValueAxis::Fixed(0.0, 1.0),
        legend: Legend::LowerRight,
        value: |r| r.accuracy,
    },
    Metric {
        stem: "loss",
        title: "Test loss per round",
        value_label: "loss",
        value_axis: ValueAxis::Fit,
        legend: Legend::UpperRight,
        value: |r| r.loss,
    },
    Metric {
        stem: "train-loss",
        title: "Training loss per round (mean over accepted clients)",
        value_label: "loss",
        value_axis: ValueAxis::Fit,
        legend: Legend::UpperRight,
        value: |r| r.train_loss,
    },
    Metric {
        stem: "uplink-bits",
        title: "Uplink bits per round",
        value_label: "bits",
        value_axis: ValueAxis::FromZero,
        legend: Legend::LowerRight,
        value: |r| r.uplink_bits as f64,
    },
    Metric {
        stem: "bits-per-parameter",
        title: "Uplink bits per parameter per update",
        value_label: "bits per parameter",
        value_axis: ValueAxis::FromZero,
        legend: Legend::LowerRight,
        value: |r| r.bits_per_parameter,
    },
    Metric {
        stem: "accepted",
        title: "Accepted updates per round",
        value_label: "clients",
        value_axis: ValueAxis::FromZero,
        legend: Legend::LowerRight,
        value: |r| r.successes as f64,
    },
    Metric {
        stem: "failures",
        title: "Failed clients and rejected updates per round",
        value_label: "clients",
        value_axis: ValueAxis::FromZero,
        legend: Legend::UpperRight,
        value: |r| (r.failures_total() + r.rejected_total()) as f64,
    },
    Metric {
        stem: "anme",
        title: "ANME per round (mean over layers and clusters)",
        value_label: "ANME",
        value_axis: ValueAxis::FromZero,
        legend: Legend::UpperRight,
        value: |r| r.anme,
    },
];

fn series(
    label: impl Into<String>,
    rounds: &[RoundPoint],
    value: fn(&RoundPoint) -> f64,
) -> Series {
    Series {
        label: label.into(),
        points: rounds.iter().map(|r| (r.round as f64, value(r))).collect(),
    }
}

/// The test loss, and the clients' training loss when the server saw any (a secure run's
/// server sees no client's loss, so it has no such line).
fn losses(rounds: &[RoundPoint]) -> Vec<Series> {
    let train = series("training loss (accepted clients)", rounds, |r| r.train_loss);
    let seen = train.points.iter().any(|(_, loss)| loss.is_finite());
    let mut losses = vec![series("test loss", rounds, |r| r.loss)];
    losses.extend(seen.then_some(train));
    losses
}

/// Whether `rounds` are an asynchronous run's model versions: only those records carry the
/// staleness of the updates each folded (at least one a version).
fn asynchronous(rounds: &[RoundPoint]) -> bool {
    rounds.iter().any(|r| !r.staleness.is_empty())
}

/// What the horizontal axis of `runs` counts: rounds, model versions when every run is
/// asynchronous, both when the runs mix the modes.
fn step_of(runs: &[Run]) -> &'static str {
    let is_async = |run: &Run| asynchronous(&run.rounds);
    match (runs.iter().all(is_async), runs.iter().any(is_async)) {
        (true, _) => Mode::Async.step(),
        (false, true) => "round or version",
        (false, false) => Mode::Sync.step(),
    }
}

/// `title`, whose metric is "per round", per `step` instead.
fn per(title: &str, step: &str) -> String {
    title.replace("per round", &format!("per {step}"))
}

/// The horizontal axis of the figures against simulated time.
const SIMULATED: &str = "simulated seconds";

/// Test accuracy at the simulated end of each round or version; `None` unless every record
/// has simulated time (`--clock virtual`).
fn accuracy_in_time(label: impl Into<String>, rounds: &[RoundPoint]) -> Option<Series> {
    let points = rounds
        .iter()
        .map(|r| Some((r.time.as_ref()?.end, r.accuracy)))
        .collect::<Option<Vec<_>>>()?;
    (!points.is_empty()).then(|| Series {
        label: label.into(),
        points,
    })
}

/// The figure of test accuracy against simulated time.
fn accuracy_in_time_figure(series: Vec<Series>, legend: Legend) -> Figure {
    Figure {
        title: "Test accuracy against simulated time".into(),
        step: SIMULATED,
        value_label: "accuracy".into(),
        value_axis: ValueAxis::Fixed(0.0, 1.0),
        legend,
        series,
    }
}

/// One figure per [`METRICS`] entry, a line per run, each labelled with the run's label; and
/// when every run kept simulated time, test accuracy against it.
pub fn overlay(runs: &[Run]) -> Vec<(&'static str, Figure)> {
    let step = step_of(runs);
    let in_time: Option<Vec<Series>> = runs
        .iter()
        .map(|run| accuracy_in_time(run.label.clone(), &run.rounds))
        .collect();
    let timed = in_time.map(|series| {
        (
            "accuracy-time",
            accuracy_in_time_figure(series, Legend::LowerRight),
        )
    });
    METRICS
        .iter()
        .map(|m| {
            let figure = Figure {
                title: per(m.title, step),
                step,
                value_label: m.value_label.into(),
                value_axis: m.value_axis,
                legend: m.legend,
                series: runs
                    .iter()
                    .map(|run| series(run.label.clone(), &run.rounds, m.value))
                    .collect(),
            };
            (m.stem, figure)
        })
        .chain(timed)
        .collect()
}

/// The figures of one run folder's `plots/`, as `(file stem, figure)`: accuracy; test and
/// training loss; uplink and downlink bits; bits per parameter; participation, failures,
/// rejections and late clients; ANME, and per cluster when the round sharded more than one
/// (layer, keep ratio); in async mode, the staleness of each version's updates; with KLMS, the
/// coders' KL per block and drift ratio.
pub fn run_figures(rounds: &[RoundPoint]) -> Vec<(&'static str, Figure)> {
    let step = if asynchronous(rounds) {
        Mode::Async.step()
    } else {
        Mode::Sync.step()
    };
    let figure = |title: &str, value_label: &str, value_axis, legend, series| Figure {
        title: per(title, step),
        step,
        value_label: value_label.into(),
        value_axis,
        legend,
        series,
    };
    let mut figures = vec![
        (
            "accuracy",
            figure(
                "Test accuracy per round",
                "accuracy",
                ValueAxis::Fixed(0.0, 1.0),
                Legend::None,
                vec![series("test accuracy", rounds, |r| r.accuracy)],
            ),
        ),
        (
            "loss",
            figure(
                "Loss per round",
                "loss",
                ValueAxis::Fit,
                Legend::UpperRight,
                losses(rounds),
            ),
        ),
        (
            "bits",
            figure(
                "Bits sent per round",
                "bits",
                ValueAxis::FromZero,
                Legend::LowerRight,
                vec![
                    series("uplink (clients → server)", rounds, |r| {
                        r.uplink_bits as f64
                    }),
                    series("downlink (server → clients)", rounds, |r| {
                        r.downlink_bits as f64
                    }),
                ],
            ),
        ),
        (
            "bits-per-parameter",
            figure(
                "Uplink bits per parameter per update",
                "bits per parameter",
                ValueAxis::FromZero,
                Legend::None,
                vec![series("bits per parameter", rounds, |r| {
                    r.bits_per_parameter
                })],
            ),
        ),
        (
            "participation",
            figure(
                "Participation and failures per round",
                "clients",
                ValueAxis::FromZero,
                Legend::UpperRight,
                vec![
                    series("selected", rounds, |r| r.participants as f64),
                    series("accepted", rounds, |r| r.successes as f64),
                    series("failed", rounds, |r| r.failures_total() as f64),
                    series("rejected", rounds, |r| r.rejected_total() as f64),
                    series("late (cut off by over-commitment)", rounds, |r| {
                        r.late as f64
                    }),
                ],
            ),
        ),
        (
            "anme",
            figure(
                "ANME per round",
                "ANME",
                ValueAxis::FromZero,
                Legend::UpperRight,
                anme_series(rounds),
            ),
        ),
    ];
    if let Some(series) = accuracy_in_time("test accuracy", rounds) {
        figures.push((
            "accuracy-time",
            accuracy_in_time_figure(vec![series], Legend::None),
        ));
    }
    if asynchronous(rounds) {
        let mean = |r: &RoundPoint| {
            r.staleness.iter().sum::<u64>() as f64 / r.staleness.len().max(1) as f64
        };
        figures.push((
            "staleness",
            figure(
                "Staleness of the updates folded into each version (async)",
                "versions behind",
                ValueAxis::FromZero,
                Legend::UpperRight,
                vec![
                    series("mean", rounds, mean),
                    series("max", rounds, |r| {
                        r.staleness.iter().copied().max().unwrap_or(0) as f64
                    }),
                ],
            ),
        ));
    }
    if rounds.iter().any(|r| r.privacy.is_some()) {
        let epsilon = |r: &RoundPoint| r.privacy.map_or(f64::NAN, |p| p.epsilon);
        figures.push((
            "privacy-epsilon",
            figure(
                "Privacy spent: ε at the run's δ after each round (RDP accountant)",
                "ε",
                ValueAxis::FromZero,
                Legend::None,
                vec![series("ε", rounds, epsilon)],
            ),
        ));
    }
    if rounds.iter().any(|r| r.klms.is_some()) {
        let kl = |r: &RoundPoint| r.klms.and_then(|k| k.block_kl_bits).unwrap_or(f64::NAN);
        let rho = |r: &RoundPoint| r.klms.and_then(|k| k.drift_ratio).unwrap_or(f64::NAN);
        let mut lines = vec![series(
            // A gap: the clients cut and uploaded new blocks that round.
            "KL per block (bits)",
            rounds,
            kl,
        )];
        if rounds.iter().any(|r| !rho(r).is_nan()) {
            lines.push(series("drift ratio ρ", rounds, rho));
        }
        figures.push((
            "klms",
            figure(
                "KLMS coder: mean KL per block and drift ratio",
                "bits, or ratio",
                ValueAxis::FromZero,
                Legend::UpperRight,
                lines,
            ),
        ));
    }
    figures
}

/// The round's mean ANME and, when there are several, one line per (layer, keep ratio) cluster.
/// With a single cluster its line would repeat the mean, so it is left out.
fn anme_series(rounds: &[RoundPoint]) -> Vec<Series> {
    let mut clusters: BTreeMap<(String, u64), Series> = BTreeMap::new();
    for r in rounds {
        for g in &r.groups {
            // Keyed by the ratio's bits: the same f64 every round, ordered for positive ratios.
            let key = (g.layer.clone(), g.keep_ratio.to_bits());
            clusters
                .entry(key)
                .or_insert_with(|| Series {
                    label: format!("{}, r = {}", g.layer, g.keep_ratio),
                    points: Vec::new(),
                })
                .points
                .push((r.round as f64, g.anme));
        }
    }
    let mut out = vec![series("mean over clusters", rounds, |r| r.anme)];
    if clusters.len() > 1 {
        out.extend(clusters.into_values());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::rounds::{GroupPoint, RunLabels};
    use fedshard_actors::record::SimulatedTime;

    fn round(round: u64, groups: &[(&str, f64, f64)]) -> RoundPoint {
        RoundPoint {
            round,
            participants: 4,
            successes: 3,
            failures: BTreeMap::from([("timeout".into(), 1)]),
            rejected: BTreeMap::new(),
            accuracy: 0.1 * round as f64,
            loss: 2.0,
            train_loss: f64::NAN,
            uplink_bits: 1000,
            downlink_bits: 4000,
            bits_per_parameter: 32.0,
            anme: 0.3,
            groups: groups
                .iter()
                .map(|&(layer, keep_ratio, anme)| GroupPoint {
                    layer: layer.into(),
                    keep_ratio,
                    anme,
                })
                .collect(),
            late: 0,
            staleness: Vec::new(),
            klms: None,
            time: None,
            privacy: None,
        }
    }

    /// A run with simulated time gets accuracy against it, its points at each round's end; a
    /// run on the wall clock does not, nor does an overlay with one such run.
    #[test]
    fn simulated_time_gets_a_figure_of_accuracy_against_it() {
        let timed: Vec<RoundPoint> = (1..=3)
            .map(|i| RoundPoint {
                time: Some(SimulatedTime {
                    start: 10.0 * (i - 1) as f64,
                    end: 10.0 * i as f64,
                    clients: Default::default(),
                }),
                ..round(i, &[])
            })
            .collect();
        let figures = run_figures(&timed);
        let (_, figure) = figures
            .iter()
            .find(|(stem, _)| *stem == "accuracy-time")
            .expect("a figure against time");
        assert_eq!(figure.step, SIMULATED);
        assert_eq!(figure.series[0].points[2], (30.0, 0.1 * 3.0));
        let wall = vec![round(1, &[])];
        assert!(
            run_figures(&wall)
                .iter()
                .all(|(s, _)| *s != "accuracy-time")
        );
        let run = |rounds: Vec<RoundPoint>| Run {
            dir: "r".into(),
            label: "r".into(),
            config: RunLabels::default(),
            rounds,
        };
        assert!(
            overlay(&[run(timed.clone())])
                .iter()
                .any(|(s, _)| *s == "accuracy-time")
        );
        assert!(
            overlay(&[run(timed), run(wall)])
                .iter()
                .all(|(s, _)| *s != "accuracy-time")
        );
    }

    /// Records with ε get the "privacy-epsilon" figure, one point per round; others do not.
    #[test]
    fn private_runs_get_a_figure_of_epsilon() {
        let mut rounds = [round(1, &[]), round(2, &[])];
        assert!(
            run_figures(&rounds)
                .iter()
                .all(|(s, _)| *s != "privacy-epsilon")
        );
        for (r, epsilon) in rounds.iter_mut().zip([1.5, 2.25]) {
            r.privacy = Some(fedshard_actors::privacy::PrivacyRecord {
                epsilon,
                delta: 1e-5,
                clip_norm: 1.0,
                next_clip_norm: 1.0,
                clipped: 0,
                unclipped_fraction: None,
            });
        }
        let figures = run_figures(&rounds);
        let (_, figure) = figures
            .iter()
            .find(|(s, _)| *s == "privacy-epsilon")
            .expect("an ε figure");
        assert_eq!(figure.series[0].points, vec![(1.0, 1.5), (2.0, 2.25)]);
    }

    /// A run's figures count rounds, an asynchronous run's (whose records carry staleness)
    /// model versions, on the axis and in the titles; a report over both modes says both.
    #[test]
    fn asynchronous_runs_are_drawn_per_version() {
        let sync = [round(1, &[]), round(2, &[])];
        let mut versions = sync.clone();
        for v in &mut versions {
            v.staleness = vec![0, 1];
        }
        for (rounds, step) in [(&sync, "round"), (&versions, "version")] {
            for (stem, figure) in run_figures(rounds) {
                assert_eq!(figure.step, step, "{stem}");
                assert!(
                    !figure.title.contains("per round") || step == "round",
                    "{stem}"
                );
            }
            let accuracy = &run_figures(rounds)[0].1;
            assert_eq!(accuracy.title, format!("Test accuracy per {step}"));
        }
        let run = |rounds: &[RoundPoint]| Run {
            dir: "r".into(),
            label: "r".into(),
            config: RunLabels::default(),
            rounds: rounds.to_vec(),
        };
        let both = [run(&sync), run(&versions)];
        for (runs, step) in [
            (&both[..1], "round"),
            (&both[1..], "version"),
            (&both[..], "round or version"),
        ] {
            let (_, accuracy) = &overlay(runs)[0];
            assert_eq!(accuracy.step, step);
            assert_eq!(accuracy.title, format!("Test accuracy per {step}"));
        }
    }

    #[test]
    fn a_klms_run_gets_a_figure_of_its_block_kl_and_drift_ratio() {
        use fedshard_actors::record::KlmsStats;
        let mut rounds = [round(1, &[]), round(2, &[])];
        assert!(run_figures(&rounds).iter().all(|(stem, _)| *stem != "klms"));
        rounds[0].klms = Some(KlmsStats {
            block_uploads: 10,
            block_kl_bits: None,
            drift_ratio: Some(0.9),
        });
        rounds[1].klms = Some(KlmsStats {
            block_uploads: 0,
            block_kl_bits: Some(3.5),
            drift_ratio: Some(0.7),
        });
        let figures = run_figures(&rounds);
        let (stem, klms) = figures.last().expect("figures");
        assert_eq!(*stem, "klms");
        let kl = &klms.series[0].points;
        assert!(kl[0].1.is_nan() && kl[1] == (2.0, 3.5), "{kl:?}");
        assert_eq!(klms.series[1].points, [(1.0, 0.9), (2.0, 0.7)]);
        // Without rescale_drift or report_drift there is no ratio to draw.
        rounds.iter_mut().for_each(|r| {
            r.klms = r.klms.map(|k| KlmsStats {
                drift_ratio: None,
                ..k
            })
        });
        let figures = run_figures(&rounds);
        assert_eq!(figures.last().expect("figures").1.series.len(), 1);
    }

    #[test]
    fn anme_has_a_line_per_cluster_only_when_there_are_several() {
        let one = [round(1, &[("fc0.weight", 0.4, 0.3)])];
        assert_eq!(anme_series(&one).len(), 1);
        let two = [
            round(1, &[("fc0.weight", 0.4, 0.2), ("fc0.weight", 0.2, 0.4)]),
            round(2, &[("fc0.weight", 0.4, 0.25)]),
        ];
        let lines = anme_series(&two);
        let labels: Vec<&str> = lines.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "mean over clusters",
                "fc0.weight, r = 0.2",
                "fc0.weight, r = 0.4"
            ]
        );
        assert_eq!(lines[2].points, [(1.0, 0.2), (2.0, 0.25)]);
    }

    #[test]
    fn run_figures_plot_every_round() {
        let rounds = [round(1, &[]), round(2, &[])];
        let figures = run_figures(&rounds);
        let stems: Vec<&str> = figures.iter().map(|f| f.0).collect();
        assert_eq!(
            stems,
            [
                "accuracy",
                "loss",
                "bits",
                "bits-per-parameter",
                "participation",
                "anme"
            ]
        );
        let participation = &figures[4].1;
        assert_eq!(participation.series[2].points, [(1.0, 1.0), (2.0, 1.0)]);
        assert_eq!(
            participation.series[4].label,
            "late (cut off by over-commitment)"
        );
        assert_eq!(figures[0].1.series[0].points[1], (2.0, 0.2));
    }

    #[test]
    fn an_async_run_gets_a_staleness_figure_with_mean_and_max_per_version() {
        let mut rounds = [round(1, &[]), round(2, &[])];
        rounds[0].staleness = vec![0, 0, 1];
        rounds[1].staleness = vec![2, 4];
        let figures = run_figures(&rounds);
        let (stem, staleness) = figures.last().expect("figures");
        assert_eq!(*stem, "staleness");
        assert_eq!(staleness.series[0].points, [(1.0, 1.0 / 3.0), (2.0, 3.0)]);
        assert_eq!(staleness.series[1].points, [(1.0, 1.0), (2.0, 4.0)]);
    }
}
