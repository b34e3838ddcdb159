//! The coordinate-wise statistics (docs/algorithms.md §9.1): every coordinate of the model moves
//! by the median, or the trimmed mean, of the clients' changes of that coordinate, each client
//! counted once whatever its sample count (Yin et al., "Byzantine-Robust Distributed Learning:
//! Towards Optimal Statistical Rates", ICML 2018, Definitions 1 and 2).

use super::{Changes, Statistic};
use crate::{Result, StrategyError};
use std::fmt;
use std::hash::{Hash, Hasher};

/// The median of the sorted `values` (at least one): the middle one, or for an even count the
/// mean of the two middle ones, as `np.median` takes it.
fn median_of_sorted(values: &[f64]) -> f64 {
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The change of every coordinate from its sorted column of changes, by `statistic`.
fn coordinate_wise(changes: &Changes, statistic: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut column = Vec::with_capacity(changes.len());
    (0..changes.dimension())
        .map(|k| {
            changes.column(k, &mut column);
            column.sort_by(f64::total_cmp);
            statistic(&column)
        })
        .collect()
}

/// Coordinate-wise median (Yin et al. 2018, Definition 1; Flower's `aggregate_median`, the
/// `FedMedian` strategy): `ΔW[k] = med_c ΔW_c[k]`, sample counts ignored. Defined for any
/// number of results; it resists up to half of them less one being arbitrary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Median;

impl fmt::Display for Median {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::NAME)
    }
}

impl Statistic for Median {
    const NAME: &'static str = "median";

    fn min_results(&self) -> usize {
        1
    }

    fn change(&self, changes: &Changes) -> Result<Vec<f64>> {
        Ok(coordinate_wise(changes, median_of_sorted))
    }
}

/// β of the trimmed mean: the fraction of the results cut from **each** end of every
/// coordinate, in `[0, 0.5)` so that at least one value is left (scipy's and Flower's
/// `proportiontocut`). Only [`TrimFraction::new`] makes one, so a held β is always in range.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct TrimFraction(f64);

impl TrimFraction {
    /// β, or an error naming `aggregator.beta` when it is not in `[0, 0.5)`.
    pub fn new(beta: f64) -> Result<Self> {
        if (0.0..0.5).contains(&beta) {
            // −0.0 is 0.0: one value, one bit pattern (Eq and Hash go by the bits).
            Ok(Self(beta + 0.0))
        } else {
            Err(StrategyError::invalid(
                "aggregator.beta",
                format!("expected the fraction cut from each end, in [0, 0.5), found {beta}"),
            ))
        }
    }

    pub fn get(self) -> f64 {
        self.0
    }

    /// `⌊β n⌋`, the values cut from each end of a column of `n` (Flower's
    /// `int(proportiontocut * nobs)`; `< n/2`, since β < ½).
    pub fn cut(self, n: usize) -> usize {
        (self.0 * n as f64) as usize
    }
}

/// A β is never NaN, so equality is an equivalence.
impl Eq for TrimFraction {}

impl Hash for TrimFraction {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// Coordinate-wise trimmed mean (Yin et al. 2018, Definition 2; Flower's
/// `aggregate_trimmed_avg` with `_trim_mean`, the `FedTrimmedAvg` strategy): every coordinate's
/// changes sorted, `⌊β n⌋` cut from each end, the rest averaged with equal weights. β = 0 is
/// the plain mean; it resists up to `⌊β n⌋` arbitrary results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrimmedMean {
    pub beta: TrimFraction,
}

impl fmt::Display for TrimmedMean {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{ kind = \"{}\", beta = {} }}",
            Self::NAME,
            self.beta.get()
        )
    }
}

impl Statistic for TrimmedMean {
    const NAME: &'static str = "trimmed-mean";

    fn min_results(&self) -> usize {
        1
    }

    fn change(&self, changes: &Changes) -> Result<Vec<f64>> {
        let n = changes.len();
        let cut = self.beta.cut(n);
        Ok(coordinate_wise(changes, |sorted| {
            let kept = &sorted[cut..n - cut];
            kept.iter().sum::<f64>() / kept.len() as f64
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Odd counts take the middle value, even counts the mean of the two middle ones.
    #[test]
    fn the_median_of_a_sorted_column() {
        assert_eq!(median_of_sorted(&[4.0]), 4.0);
        assert_eq!(median_of_sorted(&[-1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median_of_sorted(&[-1.0, 2.0, 3.0, 9.0]), 2.5);
    }

    /// β ∈ [0, 0.5), named when it is not; ⌊β n⌋ is Python's `int(β * n)`: 0.2 · 7 = 1.4 → 1,
    /// 0.3 · 7 = 2.1 → 2, 0.3 · 6 = 1.8 → 1.
    #[test]
    fn trim_fractions() {
        for beta in [-0.1, 0.5, 0.7, f64::NAN, f64::INFINITY] {
            match TrimFraction::new(beta) {
                Err(StrategyError::InvalidInput { what, reason }) => {
                    assert_eq!(what, "aggregator.beta");
                    assert!(reason.contains("[0, 0.5)"), "{reason}");
                }
                other => panic!("{beta}: {other:?}"),
            }
        }
        let cut = |beta, n| TrimFraction::new(beta).unwrap().cut(n);
        assert_eq!(
            (cut(0.2, 7), cut(0.3, 7), cut(0.3, 6), cut(0.0, 5)),
            (1, 2, 1, 0)
        );
        assert_eq!(cut(0.49, 1), 0);
        assert_eq!(TrimFraction::new(-0.0).unwrap().get().to_bits(), 0);
    }
}
