//! `compare --budget`: the width strategies beside the spectral ones at equal cost or at equal
//! nominal keep ratio (docs/algorithms.md §8.4).
//!
//! A width keep ratio r keeps about r² of an inner layer's multiply-adds (both its inputs and its
//! outputs shrink), a spectral keep ratio about r, so the same nominal r gives a width client far
//! less to compute. At equal cost (the default) each width arm runs at the widest slice whose
//! multiply-adds per sample ([`ModelWork`], the count simulated time charges) do not exceed the
//! spectral sub-model's at r: a client's budget is what it can compute, the constraint this
//! runtime is built for. The table's column keeps the spectral r.

use super::Setup;
use crate::config::{Config, KeepRatioShare};
use fedshard_protocol::model::ModelState;
use fedshard_protocol::width::{WidthGroup, widths_at};
use fedshard_protocol::work::ModelWork;

/// How `compare` puts the width strategies next to the spectral ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Budget {
    /// Equal multiply-adds per sample: a width arm at the widest slice that costs no more than
    /// the spectral sub-model at the column's keep ratio.
    #[default]
    Cost,
    /// Equal nominal keep ratio: a width arm slices every width at the column's r.
    Ratio,
}

/// The width keep ratio matched to a spectral one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostMatch {
    /// The spectral keep ratio (the table's column).
    pub ratio: f64,
    /// Its sub-model's share of the full model's multiply-adds per sample.
    pub spectral_share: f64,
    /// The widest width keep ratio whose share is at most `spectral_share` (the narrowest
    /// slice, one unit per norm group, when even that costs more).
    pub width_ratio: f64,
    pub width_share: f64,
}

/// The model a budget is measured on: its initial state, work count, sharded layers and widths.
pub struct Costs {
    global: ModelState,
    work: ModelWork,
    layers: Vec<String>,
    groups: Vec<WidthGroup>,
}

impl Costs {
    /// `config`'s model as [`Costs`] measure it.
    pub fn of(config: &Config) -> anyhow::Result<Self> {
        let model = config.model()?;
        let global = model.initial_state(config.run.seed)?;
        let work = ModelWork::new(model.arithmetic()?, &global);
        Ok(Self {
            layers: config.model.resolved_sharded_layers(),
            groups: model.width_groups(),
            global,
            work,
        })
    }

    /// The width keep ratio matched to the spectral `ratio` (bisection on the width ratio: its
    /// share only grows with it).
    pub fn equal_cost(&self, ratio: f64) -> anyhow::Result<CostMatch> {
        let spectral_share = self
            .work
            .spectral_share(&self.global, &self.layers, ratio)?;
        let share = |r: f64| -> anyhow::Result<f64> {
            let widths = widths_at(&self.groups, r)?;
            Ok(self.work.width_share(&self.global, &self.groups, &widths))
        };
        let (mut low, mut high) = (f64::MIN_POSITIVE, 1.0);
        if share(high)? <= spectral_share {
            low = high;
        }
        for _ in 0..60 {
            if low == high {
                break;
            }
            let mid = 0.5 * (low + high);
            if share(mid)? <= spectral_share {
                low = mid;
            } else {
                high = mid;
            }
        }
        Ok(CostMatch {
            ratio,
            spectral_share,
            width_ratio: low,
            width_share: share(low)?,
        })
    }

    /// `setup` with each keep ratio replaced by its equal-cost width ratio; the name stays.
    pub fn width_setup(&self, setup: &Setup) -> anyhow::Result<(Setup, Vec<CostMatch>)> {
        let matches = setup
            .keep_ratios
            .iter()
            .map(|k| self.equal_cost(k.ratio))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let keep_ratios = setup
            .keep_ratios
            .iter()
            .zip(&matches)
            .map(|(k, m)| KeepRatioShare {
                ratio: m.width_ratio,
                share: k.share,
            })
            .collect();
        Ok((
            Setup {
                name: setup.name.clone(),
                keep_ratios,
            },
            matches,
        ))
    }
}

/// One line per match, for the table's notes: `r = 0.2: width r = 0.45 (0.21 vs 0.20 of the
/// full model's multiply-adds per sample)`.
pub fn describe(matches: &[CostMatch]) -> String {
    matches
        .iter()
        .map(|m| {
            format!(
                "spectral r = {}: width r = {:.3} ({:.1}% vs {:.1}% of the full model's \
                 multiply-adds per sample)",
                m.ratio,
                m.width_ratio,
                100.0 * m.width_share,
                100.0 * m.spectral_share
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
