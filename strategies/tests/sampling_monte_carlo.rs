//! Monte Carlo checks of the joint samplers (docs/algorithms.md §1.5–1.6): fixed size, distinct
//! indices, marginals within 4σ (σ = sqrt(π(1−π)/draws)), CPS second-order probabilities,
//! determinism, and a property test over random feasible `π`.
//!
//! Each check is one fixed seed, so a pass is reproducible; at 4σ a correct sampler fails a
//! given check with probability ~6e-5.

use fedshard_strategies::rng::{ChaCha20Rng, Purpose, stream};
use fedshard_strategies::sampling::{
    ConditionalPoisson, NumpyChoice, PreparedDesign, SamplerName, prepare,
};
use fedshard_strategies::sharding::unbiased;
use fedshard_strategies::spectrum::SortedSpectrum;
use proptest::prelude::*;

const DRAWS: usize = 100_000;

/// A feasible π with integer sum n: the water-filling `π_i = min(1, λ_i / s)` with `Σπ = n`,
/// which is exactly the Unbiased strategy's marginals (docs/algorithms.md §1.2); needs n ≤ #{λ > 0}.
fn water_fill(weights: &[f64], n: usize) -> Vec<f64> {
    let sorted = SortedSpectrum::new(weights).expect("finite non-negative weights");
    let marginals = unbiased::marginals(sorted.values(), n).expect("1 ≤ n ≤ N");
    sorted.unsort(&marginals.inclusion_probabilities)
}

/// The π vectors every πps design is checked on.
fn cases() -> Vec<(&'static str, Vec<f64>)> {
    let third = 1.0 / 3.0;
    let spectrum: Vec<f64> = (0..30).map(|i| 0.85f64.powi(i)).collect();
    vec![
        ("§1.11 example", vec![0.9, 0.7, 0.5, 0.4, 0.3, 0.2]),
        (
            "certainty units and zeros",
            vec![1.0, 0.0, 0.8, 0.6, 0.35, 0.25, 1.0, 0.0],
        ),
        ("n' = 1 (R crash case)", vec![1.0, third, third, third]),
        (
            "water-filled spectrum N = 30, n = 8",
            water_fill(&spectrum, 8),
        ),
    ]
}

/// Draws `DRAWS` samples, checks size and distinctness of each, returns inclusion counts and
/// (optionally) pair counts.
fn frequencies(
    design: &dyn PreparedDesign,
    big_n: usize,
    rng: &mut ChaCha20Rng,
    pairs: bool,
) -> (Vec<f64>, Vec<f64>) {
    let n = design.sample_size();
    let mut counts = vec![0.0; big_n];
    let mut pair_counts = vec![0.0; if pairs { big_n * big_n } else { 0 }];
    let mut out = Vec::new();
    for _ in 0..DRAWS {
        design.draw_into(rng, &mut out);
        assert_eq!(out.len(), n, "sample size");
        assert!(
            out.windows(2).all(|w| w[0] < w[1]),
            "distinct ascending: {out:?}"
        );
        assert!(out.iter().all(|&i| i < big_n));
        for &i in &out {
            counts[i] += 1.0;
            if pairs {
                for &j in &out {
                    pair_counts[i * big_n + j] += 1.0;
                }
            }
        }
    }
    let scale = 1.0 / DRAWS as f64;
    counts.iter_mut().for_each(|c| *c *= scale);
    pair_counts.iter_mut().for_each(|c| *c *= scale);
    (counts, pair_counts)
}

/// `|empirical − p| ≤ 4 sqrt(p(1−p)/DRAWS)` (exact equality when p is 0 or 1).
fn assert_within_4_sigma(empirical: &[f64], exact: &[f64], what: &str) {
    for (i, (&e, &p)) in empirical.iter().zip(exact).enumerate() {
        let sigma = (p * (1.0 - p) / DRAWS as f64).sqrt();
        assert!(
            (e - p).abs() <= 4.0 * sigma + 1e-12,
            "{what}: unit {i} frequency {e} vs {p} (4σ = {})",
            4.0 * sigma
        );
    }
}

#[test]
fn every_pips_design_reproduces_pi() {
    for name in &SamplerName::ALL[..4] {
        for (k, (label, pi)) in cases().into_iter().enumerate() {
            let design = prepare(*name, &pi, None).expect("feasible π");
            let mut rng = stream(100 + k as u64, 0, 0, Purpose::Experiment);
            let (freq, _) = frequencies(design.as_ref(), pi.len(), &mut rng, false);
            assert_within_4_sigma(&freq, &pi, &format!("{name}, {label}"));
        }
    }
}

/// NumPy choice is successive sampling in distribution (see `numpy_choice.rs`): its exact
/// inclusion probabilities are the sum over ordered draws `(k_1..k_n)` of
/// `Π_j p_{k_j} / (1 − Σ_{l<j} p_{k_l})`.
fn successive_sampling_inclusion(p: &[f64], n: usize) -> Vec<f64> {
    fn recurse(
        p: &[f64],
        left: usize,
        taken: &mut Vec<usize>,
        prob: f64,
        used: f64,
        out: &mut [f64],
    ) {
        if left == 0 {
            taken.iter().for_each(|&k| out[k] += prob);
            return;
        }
        for k in 0..p.len() {
            if p[k] > 0.0 && !taken.contains(&k) {
                taken.push(k);
                recurse(
                    p,
                    left - 1,
                    taken,
                    prob * p[k] / (1.0 - used),
                    used + p[k],
                    out,
                );
                taken.pop();
            }
        }
    }
    let mut out = vec![0.0; p.len()];
    recurse(p, n, &mut Vec::new(), 1.0, 0.0, &mut out);
    out
}

#[test]
fn numpy_choice_matches_exact_successive_sampling() {
    let weights = [5.0, 1.0, 0.0, 3.0, 2.0, 8.0, 0.5];
    for n in [1, 3, 5] {
        let choice = NumpyChoice::new(&weights, n).expect("valid");
        let exact = successive_sampling_inclusion(choice.probabilities(), n);
        assert!((exact.iter().sum::<f64>() - n as f64).abs() < 1e-12);
        let mut rng = stream(7, n as u64, 0, Purpose::Experiment);
        let (freq, _) = frequencies(&choice, weights.len(), &mut rng, false);
        // Tolerance 4σ around the exact enumeration; also shows the marginals are not n·p.
        assert_within_4_sigma(&freq, &exact, &format!("numpy-choice n = {n}"));
    }
}

/// Exact CPS second-order probabilities by enumerating all `|s| = n` with `P(s) ∝ Π w`.
fn enumerate_pairs(w: &[f64], n: usize) -> Vec<f64> {
    let big_n = w.len();
    let mut pairs = vec![0.0; big_n * big_n];
    let mut total = 0.0;
    for mask in 0u32..(1 << big_n) {
        if mask.count_ones() as usize != n {
            continue;
        }
        let members: Vec<usize> = (0..big_n).filter(|&i| mask >> i & 1 == 1).collect();
        let weight: f64 = members.iter().map(|&i| w[i]).product();
        total += weight;
        for &i in &members {
            for &j in &members {
                pairs[i * big_n + j] += weight;
            }
        }
    }
    pairs.iter().map(|v| v / total).collect()
}

#[test]
fn cps_second_order_inclusion_probabilities() {
    let pi = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.6, 0.4];
    let cps = ConditionalPoisson::fit(&pi).expect("feasible π");
    let exact = enumerate_pairs(cps.odds(), 4);
    let closed = cps.second_order_inclusion();
    for (a, b) in closed.iter().zip(&exact) {
        assert!(
            (a - b).abs() < 1e-12,
            "second_order_inclusion {a} vs enumeration {b}"
        );
    }
    let mut rng = stream(11, 0, 0, Purpose::Experiment);
    let (freq, pairs) = frequencies(&cps, pi.len(), &mut rng, true);
    assert_within_4_sigma(&freq, &pi, "CPS first order");
    assert_within_4_sigma(&pairs, &exact, "CPS π_ij");
}

#[test]
fn same_seed_same_draws_different_seed_different_draws() {
    let pi = water_fill(&(0..20).map(|i| 0.8f64.powi(i)).collect::<Vec<_>>(), 6);
    for name in SamplerName::ALL {
        let design = prepare(name, &pi, Some(6)).expect("feasible");
        let run = |seed| {
            let mut rng = stream(seed, 3, 4, Purpose::Sharding);
            (0..20).map(|_| design.draw(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1), "{name}: same seed");
        assert_ne!(run(1), run(2), "{name}: different seeds");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random weights water-filled to an integer sum n (so some π are clipped to 1, and
    /// zero weights give π = 0): every design prepares and draws n distinct indices.
    #[test]
    fn random_feasible_pi_prepares_and_draws_size_n(
        weights in prop::collection::vec(prop_oneof![Just(0.0), 1e-6f64..1.0, 1.0f64..1e3], 2..60),
        fraction in 0.0f64..1.0,
        seed in 0u64..1000,
    ) {
        let positive = weights.iter().filter(|&&w| w > 0.0).count();
        prop_assume!(positive >= 1);
        let n = 1 + ((positive - 1) as f64 * fraction) as usize;
        let pi = water_fill(&weights, n);
        let mut rng = stream(seed, 0, 0, Purpose::Sharding);
        for name in SamplerName::ALL {
            let values = if name == SamplerName::NumpyChoice { &weights } else { &pi };
            let design = prepare(name, values, Some(n))
                .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
            for _ in 0..5 {
                let s = design.draw(&mut rng);
                prop_assert_eq!(s.len(), n);
                prop_assert!(s.windows(2).all(|w| w[0] < w[1]));
                prop_assert!(s.iter().all(|&i| pi[i] > 0.0));
            }
        }
    }
}
