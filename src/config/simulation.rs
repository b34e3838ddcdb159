//! `[devices]` and `[network]`: the cost model of simulated time (`[run] clock = "virtual"`,
//! `--clock virtual`; `fedshard_actors::clock`). Each client's device speed and link rates are
//! drawn once from the seed, so a node that hosts a client sees the same client as the
//! in-process run.

use super::Model;
use anyhow::{Context, bail};
use fedshard_actors::clock::{ClientCost, ClockKind, VirtualClock};
use fedshard_actors::faults::FaultPlan;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::ClientId;
use fedshard_protocol::work::ModelWork;
use fedshard_strategies::rng::{Purpose, stream};
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `[devices]`: how fast clients train.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesSection {
    /// Samples a median device trains per second on the full model (forward and backward, one
    /// epoch); a spectral shard that does a share φ of the full model's multiply-adds per
    /// sample goes 1/φ times faster.
    pub samples_per_second: f64,
    /// Device speeds are lognormal around the median with this σ (0: every device alike).
    #[serde(default)]
    pub sigma: f64,
    /// Seconds a median device spends on each optimiser step besides its arithmetic (launches,
    /// dispatch, the optimiser's pass), which a smaller sub-model does not lower; 0 (the
    /// default) for a device bound by arithmetic alone.
    #[serde(default)]
    pub seconds_per_step: f64,
}

impl Default for DevicesSection {
    /// 100 samples a second: a phone-class device on the digits CNN, a round figure stated in
    /// docs/async.md rather than a measurement of this machine, which would not be reproducible.
    fn default() -> Self {
        Self {
            samples_per_second: 100.0,
            sigma: 0.0,
            seconds_per_step: 0.0,
        }
    }
}

/// `[network]`: each client's links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// Each client's uplink in Mbit/s (see [`Rate`]).
    pub uplink_mbit: Rate,
    /// Each client's downlink in Mbit/s.
    pub downlink_mbit: Rate,
    /// One-way latency of every message, milliseconds.
    #[serde(default)]
    pub latency_ms: f64,
}

/// A per-client rate in Mbit/s: one number for every client, a lognormal draw per client
/// (`{ kind = "lognormal", median = 10, sigma = 0.5 }`), or a trace file of rates, one per line,
/// client c taking line c modulo their count (`{ kind = "trace", path = "rates.txt" }`, relative
/// to the working directory).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Rate {
    Constant(f64),
    Drawn(DrawnRate),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DrawnRate {
    Lognormal { median: f64, sigma: f64 },
    Trace { path: PathBuf },
}

const RATE_FORM: &str = "a rate in Mbit/s (a number such as 10), { kind = \"lognormal\", median = 10, sigma = 0.5 } or { kind = \"trace\", path = \"rates.txt\" }";

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Table(toml::Table),
        }
        match Raw::deserialize(deserializer)
            .map_err(|_| serde::de::Error::custom(format!("expected {RATE_FORM}")))?
        {
            Raw::Number(mbit) => Ok(Rate::Constant(mbit)),
            Raw::Table(table) => toml::Value::Table(table)
                .try_into::<DrawnRate>()
                .map(Rate::Drawn)
                .map_err(|e| serde::de::Error::custom(format!("{e}; expected {RATE_FORM}"))),
        }
    }
}

impl Rate {
    /// Every client's rate in bits per second.
    fn draw(&self, field: &str, seed: u64, slot: u64, clients: usize) -> anyhow::Result<Vec<f64>> {
        let mbit = match self {
            Rate::Constant(mbit) => vec![*mbit; clients],
            Rate::Drawn(DrawnRate::Lognormal { median, sigma }) => {
                lognormal(seed, slot, clients, *median, *sigma)
            }
            Rate::Drawn(DrawnRate::Trace { path }) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("field `{field}`: the trace {}", path.display()))?;
                let rates = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .enumerate()
                    .map(|(i, l)| {
                        l.parse::<f64>().ok().filter(|r| *r > 0.0 && r.is_finite()).with_context(
                            || format!("field `{field}`: {} line {}: expected a positive rate in Mbit/s, found `{l}`", path.display(), i + 1),
                        )
                    })
                    .collect::<anyhow::Result<Vec<f64>>>()?;
                if rates.is_empty() {
                    bail!(
                        "field `{field}`: the trace {} holds no rate",
                        path.display()
                    );
                }
                (0..clients).map(|c| rates[c % rates.len()]).collect()
            }
        };
        Ok(mbit.into_iter().map(|m| m * 1e6).collect())
    }

    fn validate(&self, field: &str) -> anyhow::Result<()> {
        let positive = |name: &str, v: f64| -> anyhow::Result<()> {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                bail!("field `{field}{name}`: expected a positive number, found {v}")
            }
        };
        match self {
            Rate::Constant(mbit) => positive("", *mbit),
            Rate::Drawn(DrawnRate::Lognormal { median, sigma }) => {
                positive(".median", *median)?;
                if !(*sigma >= 0.0 && sigma.is_finite()) {
                    bail!("field `{field}.sigma`: expected a non-negative number, found {sigma}");
                }
                Ok(())
            }
            Rate::Drawn(DrawnRate::Trace { .. }) => Ok(()),
        }
    }
}

/// A draw per client from the lognormal of median `median` and shape σ, from the stream
/// (seed, slot, c, SimulatedTime).
fn lognormal(seed: u64, slot: u64, clients: usize, median: f64, sigma: f64) -> Vec<f64> {
    if sigma == 0.0 {
        return vec![median; clients];
    }
    // Validated: σ > 0 and finite.
    let Ok(law) = LogNormal::new(median.ln(), sigma) else {
        return vec![median; clients];
    };
    (0..clients as u64)
        .map(|c| law.sample(&mut stream(seed, slot, c, Purpose::SimulatedTime)))
        .collect()
}

/// The stream slots of the three draws.
const DEVICE_SLOT: u64 = 1;
const UPLINK_SLOT: u64 = 2;
const DOWNLINK_SLOT: u64 = 3;

/// The checks of `[devices]` and `[network]` against the clock.
pub fn validate(
    clock: ClockKind,
    devices: Option<&DevicesSection>,
    network: Option<&NetworkSection>,
) -> anyhow::Result<()> {
    if clock == ClockKind::Wall {
        for (table, present) in [
            ("devices", devices.is_some()),
            ("network", network.is_some()),
        ] {
            if present {
                bail!(
                    "field `{table}`: expected `[run] clock = \"virtual\"` (or `--clock virtual`) with a [{table}] table: it describes simulated time, which the wall clock does not use"
                );
            }
        }
    }
    if let Some(d) = devices {
        if !(d.samples_per_second > 0.0 && d.samples_per_second.is_finite()) {
            bail!(
                "field `devices.samples_per_second`: expected a positive number, found {}",
                d.samples_per_second
            );
        }
        for (field, value) in [("sigma", d.sigma), ("seconds_per_step", d.seconds_per_step)] {
            if !(value >= 0.0 && value.is_finite()) {
                bail!("field `devices.{field}`: expected a non-negative number, found {value}");
            }
        }
    }
    if let Some(n) = network {
        n.uplink_mbit.validate("network.uplink_mbit")?;
        n.downlink_mbit.validate("network.downlink_mbit")?;
        if !(n.latency_ms >= 0.0 && n.latency_ms.is_finite()) {
            bail!(
                "field `network.latency_ms`: expected a non-negative number, found {}",
                n.latency_ms
            );
        }
    }
    Ok(())
}

/// What a run's clock needs to know of the run.
pub struct Run<'a> {
    pub clock: ClockKind,
    pub seed: u64,
    /// Each client's sample count, by id.
    pub samples: &'a [u64],
    /// The model and its initial state: φ's multiply-adds ([`Model::arithmetic`]), counted
    /// only when a clock is built.
    pub model: &'a Model,
    pub initial: &'a ModelState,
    pub faults: Option<&'a FaultPlan>,
}

/// The cost model of a run: with `--clock virtual` always; on the wall clock only when the
/// stragglers simulate a training time (`base_delay_ms` > 0), to order the answers.
pub fn clock(
    run: &Run<'_>,
    devices: Option<&DevicesSection>,
    network: Option<&NetworkSection>,
) -> anyhow::Result<Option<VirtualClock>> {
    let stragglers = run.faults.and_then(|f| f.stragglers.as_ref());
    let base = stragglers.map_or(0.0, |s| s.base_delay().as_secs_f64());
    if run.clock == ClockKind::Wall && base == 0.0 {
        return Ok(None);
    }
    let arithmetic = run.model.arithmetic()?;
    let n = run.samples.len();
    let factors = stragglers.map_or_else(|| vec![1.0; n], |s| s.factors(run.seed, n));
    let simulated = run.clock == ClockKind::Virtual;
    // On the wall clock, only the stragglers' simulated time orders the answers.
    let default_devices = DevicesSection::default();
    let devices = devices.unwrap_or(&default_devices);
    let speeds = lognormal(run.seed, DEVICE_SLOT, n, 1.0, devices.sigma);
    let (up, down) = match network {
        Some(net) if simulated => (
            net.uplink_mbit
                .draw("network.uplink_mbit", run.seed, UPLINK_SLOT, n)?,
            net.downlink_mbit
                .draw("network.downlink_mbit", run.seed, DOWNLINK_SLOT, n)?,
        ),
        _ => (vec![f64::INFINITY; n], vec![f64::INFINITY; n]),
    };
    let clients: BTreeMap<ClientId, ClientCost> = (0..n)
        .map(|c| {
            let f = factors[c];
            let cost = ClientCost {
                samples: run.samples[c],
                fixed_seconds: f * base,
                seconds_per_sample: if simulated {
                    f / (devices.samples_per_second * speeds[c])
                } else {
                    0.0
                },
                seconds_per_step: if simulated {
                    f * devices.seconds_per_step / speeds[c]
                } else {
                    0.0
                },
                uplink_bps: up[c],
                downlink_bps: down[c],
            };
            (c as ClientId, cost)
        })
        .collect();
    Ok(Some(VirtualClock {
        kind: run.clock,
        clients,
        latency: network
            .filter(|_| simulated)
            .map_or(0.0, |n| n.latency_ms / 1e3),
        work: ModelWork::new(arithmetic, run.initial),
        faults: run.faults.filter(|_| simulated).cloned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NetworkSection, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn a_rate_is_a_number_a_lognormal_or_a_trace_and_anything_else_names_the_forms() {
        let n = parse(
            "uplink_mbit = 10\ndownlink_mbit = { kind = \"lognormal\", median = 50, sigma = 0.5 }",
        )
        .unwrap();
        assert_eq!(n.uplink_mbit, Rate::Constant(10.0));
        assert!(matches!(
            n.downlink_mbit,
            Rate::Drawn(DrawnRate::Lognormal { .. })
        ));
        let bad = parse("uplink_mbit = \"fast\"\ndownlink_mbit = 1")
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("uplink_mbit") && bad.contains("kind = \"trace\""),
            "{bad}"
        );
        let bad = parse("uplink_mbit = { kind = \"gamma\" }\ndownlink_mbit = 1")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("gamma") && bad.contains("lognormal"), "{bad}");
    }

    #[test]
    fn draws_depend_on_the_seed_alone_and_a_trace_cycles() {
        let a = lognormal(3, UPLINK_SLOT, 5, 10.0, 0.5);
        assert_eq!(a, lognormal(3, UPLINK_SLOT, 5, 10.0, 0.5));
        assert_ne!(a, lognormal(4, UPLINK_SLOT, 5, 10.0, 0.5));
        assert_ne!(a, lognormal(3, DOWNLINK_SLOT, 5, 10.0, 0.5));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rates.txt");
        std::fs::write(&path, "# Mbit/s\n5\n20\n").unwrap();
        let trace = Rate::Drawn(DrawnRate::Trace { path: path.clone() });
        assert_eq!(trace.draw("f", 1, 2, 3).unwrap(), vec![5e6, 20e6, 5e6]);
        std::fs::write(&path, "5\nfast\n").unwrap();
        let e = trace
            .draw("network.uplink_mbit", 1, 2, 3)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("network.uplink_mbit") && e.contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn simulated_tables_on_the_wall_clock_are_refused() {
        let e = validate(ClockKind::Wall, Some(&DevicesSection::default()), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("devices") && e.contains("clock = \"virtual\""),
            "{e}"
        );
    }

    #[test]
    fn a_devices_figure_out_of_range_is_named() {
        for (text, field) in [
            ("samples_per_second = 0", "devices.samples_per_second"),
            ("samples_per_second = 10\nsigma = -1", "devices.sigma"),
            (
                "samples_per_second = 10\nseconds_per_step = -0.5",
                "devices.seconds_per_step",
            ),
        ] {
            let devices: DevicesSection = toml::from_str(text).expect("parses");
            let e = validate(ClockKind::Virtual, Some(&devices), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
        let fine: DevicesSection =
            toml::from_str("samples_per_second = 10\nseconds_per_step = 0.002").expect("parses");
        assert!(validate(ClockKind::Virtual, Some(&fine), None).is_ok());
    }
}
