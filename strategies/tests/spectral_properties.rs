//! Property tests of the spectral strategies (docs/algorithms.md §1.2–1.5, §1.11 invariants) on random
//! sorted spectra with ties and zeros: `N ∈ 1..60`, `n ∈ 1..=N`, `C ∈ 1..50`.

use fedshard_strategies::metrics::expected_discrepancy;
use fedshard_strategies::sharding::{
    Marginals, collective, prism, scaled, top_n, unbiased, wallenius,
};
use proptest::prelude::*;

/// A sorted spectrum where about a tenth of the values are 0, a fifth are rounded to integers
/// (so ties are common) and a tenth are spread log-uniformly over 33 decades (tiny tails).
fn spectrum() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec((0u8..10, 0.0f64..10.0), 1..60).prop_map(|raw| {
        let mut values: Vec<f64> = raw
            .into_iter()
            .map(|(kind, x)| match kind {
                0 => 0.0,
                1 | 2 => x.round(),
                3 => 10f64.powf(3.3 * x - 30.0),
                _ => x,
            })
            .collect();
        values.sort_by(|a, b| b.total_cmp(a));
        values
    })
}

/// `(spectrum, n, C, direction, mix)`: `direction` and `mix` build a random feasible π.
fn layer() -> impl Strategy<Value = (Vec<f64>, usize, usize, Vec<f64>, f64, f64)> {
    spectrum().prop_flat_map(|s| {
        let big_n = s.len();
        (
            Just(s),
            1..=big_n,
            1usize..50,
            prop::collection::vec(0.0f64..1.0, big_n),
            0.0f64..1.0,
            0.0f64..1.0,
        )
    })
}

fn energy(spectrum: &[f64]) -> f64 {
    spectrum.iter().map(|l| l * l).sum()
}

/// Scale of every squared quantity: `(Σλ)² ≥ Σλ²`, and `≥ Λ²/(n−t)` bounds Eq. 4 at the optimum.
fn scale(spectrum: &[f64]) -> f64 {
    let total: f64 = spectrum.iter().sum();
    total * total + 1.0
}

/// Shared invariants: `Σπ = n` (1e-9), `0 ≤ π ≤ 1`, `ω` finite and ≥ 0.
fn check_marginals(m: &Marginals, n: usize, what: &str) -> Result<(), TestCaseError> {
    let sum: f64 = m.inclusion_probabilities.iter().sum();
    prop_assert!((sum - n as f64).abs() <= 1e-9, "{what}: Σπ = {sum} ≠ {n}");
    for (&p, &w) in m.inclusion_probabilities.iter().zip(&m.multipliers) {
        prop_assert!((0.0..=1.0).contains(&p), "{what}: π = {p}");
        prop_assert!(w.is_finite() && w >= 0.0, "{what}: ω = {w}");
    }
    if let Some(e) = m.expected_discrepancy {
        prop_assert!(e.is_finite() && e >= 0.0, "{what}: error {e}");
    }
    Ok(())
}

fn check_non_increasing(pi: &[f64], what: &str) -> Result<(), TestCaseError> {
    for (i, w) in pi.windows(2).enumerate() {
        prop_assert!(
            w[0] >= w[1] - 1e-12,
            "{what}: π[{i}] < π[{}]: {pi:?}",
            i + 1
        );
    }
    Ok(())
}

/// Two random feasible designs (`Σπ = n`, `0 ≤ π ≤ 1`): the optimum mixed with the uniform
/// `n/N`, and the uniform `n/N` moved a random fraction of the way to the boundary along a
/// random zero-sum direction.
fn random_feasible(
    optimum: &[f64],
    n: usize,
    direction: &[f64],
    mix: f64,
    step: f64,
) -> [Vec<f64>; 2] {
    let big_n = optimum.len();
    let uniform = n as f64 / big_n as f64;
    let mixed = optimum
        .iter()
        .map(|&p| (1.0 - mix) * p + mix * uniform)
        .collect();
    let mean = direction.iter().sum::<f64>() / big_n as f64;
    let d: Vec<f64> = direction.iter().map(|x| x - mean).collect();
    let reach = d
        .iter()
        .map(|&di| {
            if di > 0.0 {
                (1.0 - uniform) / di
            } else if di < 0.0 {
                uniform / -di
            } else {
                f64::INFINITY
            }
        })
        .fold(f64::INFINITY, f64::min);
    let gamma = if reach.is_finite() { step * reach } else { 0.0 };
    let moved = d
        .iter()
        .map(|&di| (uniform + gamma * di).clamp(0.0, 1.0))
        .collect();
    [mixed, moved]
}

/// Optimal collective multipliers for a given π: `C/(1 + (C−1)π)`, 0 where π = 0.
fn collective_omega(pi: &[f64], clients: usize) -> Vec<f64> {
    let c = clients as f64;
    pi.iter()
        .map(|&p| {
            if p > 0.0 {
                c / (1.0 + (c - 1.0) * p)
            } else {
                0.0
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn unbiased_is_feasible_and_optimal(
        (lambda, n, _c, direction, mix, step) in layer()
    ) {
        let m = unbiased::marginals(&lambda, n).unwrap();
        check_marginals(&m, n, "unbiased")?;
        check_non_increasing(&m.inclusion_probabilities, "unbiased")?;
        let tolerance = 1e-9 * scale(&lambda);
        // Closed form E* = Eq. 4 at π = Eq. 7 with C = 1 and ω = 1/π (ω = 1/π on the support).
        let closed = m.expected_discrepancy.unwrap();
        let eq4 = unbiased::discrepancy(&lambda, &m.inclusion_probabilities);
        prop_assert!((closed - eq4).abs() <= tolerance, "closed {closed} vs Eq. 4 {eq4}");
        let eq7 = expected_discrepancy(&lambda, &m.inclusion_probabilities, &m.multipliers, 1);
        prop_assert!((closed - eq7).abs() <= tolerance, "closed {closed} vs Eq. 7 {eq7}");
        // Eq. 4 at any feasible π is no better.
        for pi in random_feasible(&m.inclusion_probabilities, n, &direction, mix, step) {
            let other = unbiased::discrepancy(&lambda, &pi);
            prop_assert!(eq4 <= other + tolerance, "optimum {eq4} > random {other} at {pi:?}");
        }
    }

    #[test]
    fn collective_is_feasible_optimal_and_matches_the_sweep(
        (lambda, n, clients, direction, mix, step) in layer()
    ) {
        let fast = collective::marginals(&lambda, n, clients).unwrap();
        let sweep = collective::marginals_by_sweep(&lambda, n, clients).unwrap();
        check_marginals(&fast, n, "collective")?;
        check_marginals(&sweep, n, "collective sweep")?;
        check_non_increasing(&fast.inclusion_probabilities, "collective")?;
        let tolerance = 1e-9 * (energy(&lambda) + 1.0);
        let criterion = |m: &Marginals| {
            collective::criterion(&lambda, &m.inclusion_probabilities, &m.multipliers, clients)
        };
        let (fast_value, sweep_value) = (criterion(&fast), criterion(&sweep));
        prop_assert!(
            (fast_value - sweep_value).abs() <= tolerance,
            "fast {fast_value} vs sweep {sweep_value}: {:?} vs {:?}",
            fast.inclusion_probabilities, sweep.inclusion_probabilities
        );
        // Closed-form error = Eq. 7 at (π, ω).
        let eq7 = energy(&lambda) + fast_value;
        let closed = fast.expected_discrepancy.unwrap();
        prop_assert!((closed - eq7.max(0.0)).abs() <= tolerance, "closed {closed} vs Eq. 7 {eq7}");
        // 1 ≤ ω < C on the support (ω = 1 when C = 1).
        for (&p, &w) in fast.inclusion_probabilities.iter().zip(&fast.multipliers) {
            if p > 0.0 {
                prop_assert!(w >= 1.0 - 1e-12, "ω = {w} < 1");
                prop_assert!(clients == 1 || w < clients as f64, "ω = {w} ≥ C = {clients}");
            }
        }
        // Remark B.3: collective error(C) ≤ unbiased error / C.
        let unbiased_error = unbiased::marginals(&lambda, n).unwrap().expected_discrepancy.unwrap();
        prop_assert!(
            closed <= unbiased_error / clients as f64 + 1e-9 * scale(&lambda),
            "collective {closed} > unbiased {unbiased_error} / {clients}"
        );
        // The criterion with optimal ω at any feasible π is no better.
        for pi in random_feasible(&fast.inclusion_probabilities, n, &direction, mix, step) {
            let omega = collective_omega(&pi, clients);
            let other = collective::criterion(&lambda, &pi, &omega, clients);
            prop_assert!(fast_value <= other + tolerance, "optimum {fast_value} > random {other}");
        }
    }

    #[test]
    fn baselines_are_feasible((lambda, n, _c, _d, keep_ratio, _s) in layer()) {
        check_marginals(&top_n::marginals(&lambda, n).unwrap(), n, "top-n")?;
        check_marginals(&scaled::top_n_marginals(&lambda, n).unwrap(), n, "top-n+scaled")?;
        let keep_ratio = keep_ratio.max(0.01);
        let prism = prism::marginals(&lambda, n, keep_ratio).unwrap();
        check_marginals(&prism, n, "PriSM")?;
        let with_wallenius = prism::wallenius_marginals(&lambda, n, keep_ratio).unwrap();
        check_marginals(&with_wallenius, n, "PriSM+Wallenius")?;
        check_non_increasing(&prism.inclusion_probabilities, "PriSM")?;
        let p = prism::selection_weights(&lambda, prism::exponent(keep_ratio));
        prop_assert!((p.iter().sum::<f64>() - 1.0).abs() <= 1e-12);
        // Odds in arbitrary order: Wallenius π follows the odds.
        let odds: Vec<f64> = lambda.iter().rev().copied().collect();
        let pi = wallenius::mean_inclusion(&odds, n).unwrap();
        prop_assert!((pi.iter().sum::<f64>() - n as f64).abs() <= 1e-9);
    }
}
