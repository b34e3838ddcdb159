//! Certainty pre-processing shared by every πps design (docs/algorithms.md §1.6, first paragraph):
//! units with `π = 1` are always selected, units with `π = 0` never, and the named design runs
//! on the rest with `n' = n − #ones`. `n' = 0` needs no randomness; `n' = 1` is one categorical
//! draw with probabilities `π_i` — handled here because R's `UPmaxentropy` crashes on it
//! (e.g. `π = (1, 1/3, 1/3, 1/3)`), and it occurs in the Unbiased strategy whenever `t* = n − 1`.
//!
//! The designs themselves ([`super::ConditionalPoisson`], [`super::Brewer`], …) only ever see
//! probabilities strictly inside `(0, 1)` whose sum is an integer `1 ≤ n' < N'`
//! ([`interior_input`] is their shared check); through [`super::prepare`] they see `n' ≥ 2`.

use crate::error::{Result, StrategyError};
use crate::rng::{ChaCha20Rng, uniform};

use super::{Brewer, ConditionalPoisson, MinimumSupport, PreparedDesign, SamplerName, Systematic};

/// Probabilities within this distance of 0 or 1 are exactly 0 or 1 (docs/algorithms.md conventions).
pub const SNAP: f64 = 1e-12;

/// Largest accepted distance between `Σπ` and the integer sample size `n`.
pub const SUM_TOLERANCE: f64 = 1e-6;

/// Validates inclusion probabilities and returns them snapped to 0/1 within [`SNAP`], together
/// with `n = round(Σπ)`.
///
/// Errors: a non-finite entry or one outside `[0, 1]`; `|Σπ − n| > 1e-6` (the message states
/// `Σπ`); `expected_n` given and different from `round(Σπ)`.
pub fn validate_inclusion_probabilities(
    pi: &[f64],
    expected_n: Option<usize>,
) -> Result<(Vec<f64>, usize)> {
    let mut snapped = Vec::with_capacity(pi.len());
    for (i, &p) in pi.iter().enumerate() {
        if !p.is_finite() || !(-SNAP..=1.0 + SNAP).contains(&p) {
            return Err(StrategyError::invalid(
                "inclusion probabilities",
                format!("π[{i}] = {p} is not a probability in [0, 1]"),
            ));
        }
        snapped.push(if p <= SNAP {
            0.0
        } else if p >= 1.0 - SNAP {
            1.0
        } else {
            p
        });
    }
    let sum: f64 = snapped.iter().sum();
    let n = sum.round();
    if (sum - n).abs() > SUM_TOLERANCE {
        return Err(StrategyError::invalid(
            "inclusion probabilities",
            format!(
                "Σπ = {sum} is not within {SUM_TOLERANCE:e} of an integer sample size \
                 (fixed-size designs need an integer Σπ)"
            ),
        ));
    }
    let n = n as usize;
    if let Some(expected) = expected_n
        && expected != n
    {
        return Err(StrategyError::invalid(
            "sample size",
            format!("n = {expected} was requested but Σπ = {sum} rounds to {n}"),
        ));
    }
    Ok((snapped, n))
}

/// The shared input check of the designs proper: every `π_i` strictly inside `(0, 1)` and
/// `Σπ` within 1e-6 of an integer `1 ≤ n < N`. Returns `π` reconciled so that `Σπ = n` to
/// rounding, and `n`.
///
/// Why reconcile: the sum tolerance lets `Σπ` miss `n` by up to 1e-6, but a fixed-size design
/// can only reproduce marginals that sum to `n` exactly (CPS's fixed point would not exist, the
/// systematic grid would miss its last integer). When `Σπ > n` every `π_i` is scaled by
/// `n/Σπ`; when `Σπ < n` every `1 − π_i` is scaled by `(N − n)/(N − Σπ)`. Both keep `π` inside
/// `(0, 1)` and move each entry by at most about 1e-6.
pub fn interior_input(design: &'static str, pi: &[f64]) -> Result<(Vec<f64>, usize)> {
    let big_n = pi.len();
    if let Some((i, &p)) = pi
        .iter()
        .enumerate()
        .find(|&(_, &p)| !(p.is_finite() && p > 0.0 && p < 1.0))
    {
        return Err(StrategyError::invalid(
            design,
            format!(
                "π[{i}] = {p} is not strictly inside (0, 1); certainty units are removed by \
                 sampling::prepare"
            ),
        ));
    }
    let sum: f64 = pi.iter().sum();
    let n = sum.round();
    if (sum - n).abs() > SUM_TOLERANCE || n < 1.0 || n as usize >= big_n {
        return Err(StrategyError::invalid(
            design,
            format!("Σπ = {sum} over N = {big_n} units is not an integer n with 1 ≤ n < N"),
        ));
    }
    let n_f = n;
    let reconciled = if sum > n_f {
        let scale = n_f / sum;
        pi.iter().map(|&p| p * scale).collect()
    } else if sum < n_f {
        let scale = (big_n as f64 - n_f) / (big_n as f64 - sum);
        pi.iter().map(|&p| 1.0 - (1.0 - p) * scale).collect()
    } else {
        pi.to_vec()
    };
    Ok((reconciled, n as usize))
}

/// What is left to draw once the certainty units are fixed.
#[derive(Debug)]
enum Remainder {
    /// `n' = 0` (or every remaining unit must be taken): no randomness.
    Nothing,
    /// `n' = 1`: one categorical draw; cumulative sums of the remaining `π`.
    Categorical { cumulative: Vec<f64> },
    /// `n' ≥ 2`: the named design on the remaining units.
    Design(Box<dyn PreparedDesign>),
}

/// A πps design with its certainty units removed (docs/algorithms.md §1.6), as returned by
/// [`super::prepare`]. Draws are index sets of the original vector, ascending.
#[derive(Debug)]
pub struct CertaintyDesign {
    n: usize,
    /// Indices with `π = 1` (always drawn), ascending.
    certain: Vec<usize>,
    /// Indices with `0 < π < 1`, ascending; the remainder design indexes into this.
    uncertain: Vec<usize>,
    remainder: Remainder,
}

impl CertaintyDesign {
    /// Validates `pi` ([`validate_inclusion_probabilities`]), removes the certainty units and
    /// fits `name` on the rest.
    pub fn new(name: SamplerName, pi: &[f64], expected_n: Option<usize>) -> Result<Self> {
        if !name.takes_inclusion_probabilities() {
            return Err(StrategyError::invalid(
                "sampler",
                format!("{name} takes selection weights, not inclusion probabilities"),
            ));
        }
        let (pi, n) = validate_inclusion_probabilities(pi, expected_n)?;
        let certain: Vec<usize> = (0..pi.len()).filter(|&i| pi[i] == 1.0).collect();
        let uncertain: Vec<usize> = (0..pi.len())
            .filter(|&i| pi[i] > 0.0 && pi[i] < 1.0)
            .collect();
        let rest: Vec<f64> = uncertain.iter().map(|&i| pi[i]).collect();
        // n ≥ #ones holds because Σπ ≥ #ones and n = round(Σπ).
        let n_rest = n - certain.len();
        let (certain, uncertain, remainder) = if n_rest == 0 {
            (certain, Vec::new(), Remainder::Nothing)
        } else if n_rest == uncertain.len() {
            // Only possible when the remaining π are within 1e-6 of 1 in total: take them all.
            let mut all: Vec<usize> = certain.into_iter().chain(uncertain).collect();
            all.sort_unstable();
            (all, Vec::new(), Remainder::Nothing)
        } else if n_rest == 1 {
            let cumulative = rest
                .iter()
                .scan(0.0, |acc, &p| {
                    *acc += p;
                    Some(*acc)
                })
                .collect();
            (certain, uncertain, Remainder::Categorical { cumulative })
        } else {
            let design: Box<dyn PreparedDesign> = match name {
                SamplerName::ConditionalPoisson => Box::new(ConditionalPoisson::fit(&rest)?),
                SamplerName::Brewer => Box::new(Brewer::new(&rest)?),
                SamplerName::MinimumSupport => Box::new(MinimumSupport::new(&rest)?),
                SamplerName::Systematic => Box::new(Systematic::new(&rest)?),
                SamplerName::NumpyChoice => unreachable!("rejected above"),
            };
            (certain, uncertain, Remainder::Design(design))
        };
        Ok(Self {
            n,
            certain,
            uncertain,
            remainder,
        })
    }

    /// Indices that every draw contains (`π = 1`).
    pub fn certainty_units(&self) -> &[usize] {
        &self.certain
    }
}

impl PreparedDesign for CertaintyDesign {
    fn sample_size(&self) -> usize {
        self.n
    }

    fn draw_into(&self, rng: &mut ChaCha20Rng, out: &mut Vec<usize>) {
        out.clear();
        match &self.remainder {
            Remainder::Nothing => {
                out.extend_from_slice(&self.certain);
                return;
            }
            Remainder::Categorical { cumulative } => {
                let total = cumulative.last().copied().unwrap_or(0.0);
                let target = uniform(rng) * total;
                let k = cumulative
                    .partition_point(|&c| c <= target)
                    .min(cumulative.len() - 1);
                out.push(self.uncertain[k]);
            }
            Remainder::Design(design) => {
                design.draw_into(rng, out);
                for k in out.iter_mut() {
                    *k = self.uncertain[*k];
                }
            }
        }
        merge_sorted_into(out, &self.certain);
    }
}

/// Merges the ascending `extra` into the ascending `out` in place, from the back.
fn merge_sorted_into(out: &mut Vec<usize>, extra: &[usize]) {
    if extra.is_empty() {
        return;
    }
    let mut a = out.len();
    let mut b = extra.len();
    out.resize(a + b, 0);
    let mut dst = out.len();
    while b > 0 {
        dst -= 1;
        if a > 0 && out[a - 1] > extra[b - 1] {
            out[dst] = out[a - 1];
            a -= 1;
        } else {
            out[dst] = extra[b - 1];
            b -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    #[test]
    fn merge_keeps_order() {
        let mut out = vec![1, 4, 7];
        merge_sorted_into(&mut out, &[0, 5, 9]);
        assert_eq!(out, [0, 1, 4, 5, 7, 9]);
        let mut out = vec![];
        merge_sorted_into(&mut out, &[2, 3]);
        assert_eq!(out, [2, 3]);
    }

    #[test]
    fn validation_snaps_and_rejects() {
        let (pi, n) =
            validate_inclusion_probabilities(&[1.0 - 1e-13, 5e-13, 0.5, 0.5], None).expect("valid");
        assert_eq!(pi, [1.0, 0.0, 0.5, 0.5]);
        assert_eq!(n, 2);
        let err = validate_inclusion_probabilities(&[0.5, 0.6], None).unwrap_err();
        assert!(err.to_string().contains("Σπ = 1.1"), "{err}");
        assert!(validate_inclusion_probabilities(&[0.5, f64::NAN], None).is_err());
        assert!(validate_inclusion_probabilities(&[1.5, -0.5], None).is_err());
        assert!(validate_inclusion_probabilities(&[0.5, 0.5], Some(2)).is_err());
        assert!(validate_inclusion_probabilities(&[0.5, 0.5 + 5e-7], Some(1)).is_ok());
    }

    #[test]
    fn reconciliation_makes_the_sum_exact_and_stays_interior() {
        let (pi, n) = interior_input("test", &[0.5, 0.5 + 8e-7, 0.999_999_9]).expect("valid");
        assert_eq!(n, 2);
        assert!((pi.iter().sum::<f64>() - 2.0).abs() < 1e-14);
        let (pi, _) = interior_input("test", &[0.5, 0.5 - 8e-7, 1e-9]).expect("valid");
        assert!((pi.iter().sum::<f64>() - 1.0).abs() < 1e-14);
        assert!(pi.iter().all(|&p| p > 0.0 && p < 1.0));
        assert!(interior_input("test", &[1.0, 0.5, 0.5]).is_err());
        assert!(
            interior_input("test", &[1.0 - 1e-7, 1.0 - 1e-7]).is_err(),
            "n = N"
        );
    }

    #[test]
    fn certainty_only_and_categorical_cases() {
        let mut rng = stream(1, 0, 0, Purpose::Sharding);
        let d = CertaintyDesign::new(SamplerName::Brewer, &[0.0, 1.0, 1.0, 0.0], None).unwrap();
        assert_eq!(d.draw(&mut rng), [1, 2]);
        // The case R's UPmaxentropy crashes on.
        let third = 1.0 / 3.0;
        for name in &SamplerName::ALL[..4] {
            let d = CertaintyDesign::new(*name, &[1.0, third, third, third], Some(2)).unwrap();
            for _ in 0..50 {
                let s = d.draw(&mut rng);
                assert_eq!(s.len(), 2);
                assert_eq!(s[0], 0);
                assert!(s[1] > 0);
            }
        }
        assert!(CertaintyDesign::new(SamplerName::NumpyChoice, &[0.5, 0.5], None).is_err());
    }
}
