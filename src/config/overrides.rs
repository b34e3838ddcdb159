//! Settings a command line lays over a config file's (`--rounds`, `--seed`, `--device`,
//! `--cohorts`, `--clock`, `--noise-multiplier`). They are applied before the config is
//! validated, so that a flag can make a file valid (a `[devices]` table run with `--clock
//! virtual`), and an error they cause names them.

use super::{Config, Device};
use anyhow::bail;
use fedshard_actors::clock::ClockKind;

/// The flags a command was given; `None` leaves the file's value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    /// `--rounds`: `run.rounds`.
    pub rounds: Option<u64>,
    /// `--seed`: `run.seed`.
    pub seed: Option<u64>,
    /// `--device`: `training.device`.
    pub device: Option<Device>,
    /// `--cohorts on|off`: `training.cohorts`.
    pub cohorts: Option<bool>,
    /// `--clock`: `run.clock`.
    pub clock: Option<ClockKind>,
    /// `--noise-multiplier`: `privacy.noise_multiplier` (a config with a `[privacy]` section).
    pub noise_multiplier: Option<f64>,
}

impl Overrides {
    /// Lays the flags over `config`; only `--noise-multiplier` without a `[privacy]` section
    /// has nothing to set.
    pub fn apply(&self, config: &mut Config) -> anyhow::Result<()> {
        if let Some(rounds) = self.rounds {
            config.run.rounds = rounds;
        }
        if let Some(seed) = self.seed {
            config.run.seed = seed;
        }
        if let Some(device) = self.device {
            config.training.device = device;
        }
        if let Some(cohorts) = self.cohorts {
            config.training.cohorts = cohorts;
        }
        if let Some(clock) = self.clock {
            config.run.clock = clock;
        }
        if let Some(z) = self.noise_multiplier {
            let Some(privacy) = config.privacy.as_mut() else {
                bail!("--noise-multiplier needs a config with a [privacy] section");
            };
            privacy.noise_multiplier = z;
        }
        Ok(())
    }

    /// The flags given, as typed on the command line.
    pub fn flags(&self) -> Vec<&'static str> {
        [
            self.rounds.map(|_| "--rounds"),
            self.seed.map(|_| "--seed"),
            self.device.map(|_| "--device"),
            self.cohorts.map(|_| "--cohorts"),
            self.clock.map(|_| "--clock"),
            self.noise_multiplier.map(|_| "--noise-multiplier"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A `[devices]` table is refused on the wall clock unless `--clock virtual` is given: the
    /// flag is laid over the file before it is checked. An error caused by a flag names it.
    #[test]
    fn flags_are_laid_over_the_file_before_it_is_checked() {
        let path = Path::new("config/stragglers/digits-cnn-async.toml");
        let text = std::fs::read_to_string(path).expect("shipped")
            + "\n[devices]\nsamples_per_second = 100\nseconds_per_step = 0.05\n";
        let e = format!("{:#}", Config::parse(&text, path).expect_err("wall clock"));
        assert!(e.contains("--clock virtual"), "{e}");
        let virtual_clock = Overrides {
            clock: Some(ClockKind::Virtual),
            ..Overrides::default()
        };
        let config = Config::parse_with(&text, path, &virtual_clock).expect("valid");
        assert_eq!(config.run.clock, ClockKind::Virtual);
        let no_rounds = Overrides {
            rounds: Some(0),
            ..virtual_clock
        };
        let e = format!(
            "{:#}",
            Config::parse_with(&text, path, &no_rounds).expect_err("0 rounds")
        );
        assert!(
            e.contains("with --rounds and --clock") && e.contains("run.rounds"),
            "{e}"
        );
        let noise = Overrides {
            noise_multiplier: Some(1.0),
            ..Overrides::default()
        };
        let e = format!(
            "{:#}",
            Config::parse_with(&text, path, &noise).expect_err("no privacy")
        );
        assert!(e.contains("[privacy]"), "{e}");
    }
}
