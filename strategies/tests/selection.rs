//! Optimal client sampling with partial training against docs/algorithms.md §2.5, its optimality
//! conditions (§2.2), and a Monte Carlo check of the estimator it is designed for (§2.1, §2.4).

use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::selection::{
    ClientSelector, ClientStats, OptimalPartialSelector, SelectorName, UniformSelector,
    optimal_partial_probabilities, poisson_sampling_variance,
};
use proptest::prelude::*;

// §2.5: n = (100,200,50,300,80), ‖U‖ = (1,.5,4,.2,2) so a = (100,100,200,60,160);
// r = (1,.5,.25,1,.5), R = 3.25.
const SAMPLES: [f64; 5] = [100.0, 200.0, 50.0, 300.0, 80.0];
const NORMS: [f64; 5] = [1.0, 0.5, 4.0, 0.2, 2.0];
const RATIOS: [f64; 5] = [1.0, 0.5, 0.25, 1.0, 0.5];
const A: [f64; 5] = [100.0, 100.0, 200.0, 60.0, 160.0];

/// The table prints 6 decimals: half a unit of the last digit.
const PRINTED: f64 = 5e-7 + 1e-12;

fn check_oracle(m: f64, p_want: [f64; 5], theta_exact: f64, theta_printed: f64, obj: f64) {
    let (p, theta) = optimal_partial_probabilities(&SAMPLES, &NORMS, &RATIOS, m).unwrap();
    for (i, (g, w)) in p.iter().zip(p_want).enumerate() {
        assert!(
            (g - w).abs() <= PRINTED,
            "m = {m}, p_{i}: got {g}, want {w}"
        );
    }
    assert!(
        (theta - theta_exact).abs() <= 1e-9 * theta_exact,
        "θ = {theta}"
    );
    assert!((theta - theta_printed).abs() <= PRINTED, "θ = {theta}");
    let objective = poisson_sampling_variance(&A, &p);
    assert!(
        (objective - obj).abs() <= PRINTED,
        "objective {objective}, want {obj}"
    );
    let spent: f64 = p.iter().zip(RATIOS).map(|(p, r)| p * r).sum();
    assert!((spent - m).abs() <= 1e-12 * m);
}

#[test]
fn oracle_m_1() {
    // Nobody saturates: S = everyone, θ = Σ √r a / m = 260 + 130√2.
    check_oracle(
        1.0,
        [0.225302, 0.318626, 0.901210, 0.135181, 0.509801],
        260.0 + 130.0 * 2f64.sqrt(),
        443.847763,
        107800.836816,
    );
}

#[test]
fn oracle_m_1_5() {
    // Client 3 (ρ = 400) saturates: θ = (160 + 130√2) / (1.5 − 3.25 + 3).
    check_oracle(
        1.5,
        [0.363533, 0.514113, 1.0, 0.218120, 0.822581],
        (160.0 + 130.0 * 2f64.sqrt()) / 1.25,
        275.078210,
        45385.027356,
    );
}

#[test]
fn oracle_m_2_5() {
    // Exact: θ = 128, p = (.78125, 1, 1, .46875, 1), objective 6880.
    let (p, theta) = optimal_partial_probabilities(&SAMPLES, &NORMS, &RATIOS, 2.5).unwrap();
    let want = [0.78125, 1.0, 1.0, 0.46875, 1.0];
    for (g, w) in p.iter().zip(want) {
        assert!((g - w).abs() <= 1e-12, "{p:?}");
    }
    assert!((theta - 128.0).abs() <= 1e-9);
    assert!((poisson_sampling_variance(&A, &p) - 6880.0).abs() <= 1e-9);
}

#[test]
fn oracle_m_3_25() {
    // m = R: everyone, objective 0.
    let (p, _) = optimal_partial_probabilities(&SAMPLES, &NORMS, &RATIOS, 3.25).unwrap();
    assert_eq!(p, vec![1.0; 5]);
    assert_eq!(poisson_sampling_variance(&A, &p), 0.0);
}

#[test]
fn registry_builds_selectors() {
    let s = "optimal-partial".parse::<SelectorName>().unwrap().build();
    assert!(s.needs_update_norms());
    assert!(!SelectorName::Uniform.build().needs_update_norms());
    assert_eq!(SelectorName::OptimalPartial.to_string(), "optimal-partial");
}

/// A random feasible `p` (`Σ r p = m`, `0 ≤ p ≤ 1`): `p_k = min(1, t u_k)` with `t` found by
/// bisection.
fn random_feasible(u: &[f64], r: &[f64], m: f64) -> Vec<f64> {
    let spent = |t: f64| -> f64 { u.iter().zip(r).map(|(u, r)| r * (t * u).min(1.0)).sum() };
    let (mut lo, mut hi) = (0.0, 1.0);
    while spent(hi) < m {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if spent(mid) < m { lo = mid } else { hi = mid }
    }
    u.iter().map(|u| (hi * u).min(1.0)).collect()
}

proptest! {
    /// §2.2–2.5 invariants: budget met exactly, probabilities in [0, 1] and monotone in ρ, the
    /// KKT conditions (ρ_k/p_k = θ where p_k < 1, ρ_k ≥ θ where p_k = 1), and no random
    /// feasible p has a smaller variance.
    #[test]
    fn optimal_partial_invariants(
        clients in prop::collection::vec((1.0f64..1000.0, 0.01f64..10.0, 0.05f64..=1.0, 0.01f64..1.0), 1..30),
        fraction in 0.01f64..0.99,
    ) {
        let n: Vec<f64> = clients.iter().map(|c| c.0).collect();
        let u: Vec<f64> = clients.iter().map(|c| c.1).collect();
        let r: Vec<f64> = clients.iter().map(|c| c.2).collect();
        let big_r: f64 = r.iter().sum();
        let m = fraction * big_r;
        let (p, theta) = optimal_partial_probabilities(&n, &u, &r, m).unwrap();
        let spent: f64 = p.iter().zip(&r).map(|(p, r)| p * r).sum();
        prop_assert!((spent - m).abs() <= 1e-12 * m, "Σ r p = {spent}, m = {m}");
        let a: Vec<f64> = n.iter().zip(&u).map(|(n, u)| n * u).collect();
        let rho: Vec<f64> = a.iter().zip(&r).map(|(a, r)| a / r.sqrt()).collect();
        for k in 0..p.len() {
            prop_assert!((0.0..=1.0).contains(&p[k]));
            if p[k] < 1.0 {
                prop_assert!((rho[k] / p[k] - theta).abs() <= 1e-12 * theta);
            } else {
                prop_assert!(rho[k] >= theta * (1.0 - 1e-12));
            }
            for j in 0..p.len() {
                if rho[k] < rho[j] {
                    prop_assert!(p[k] <= p[j]);
                }
            }
        }
        let best = poisson_sampling_variance(&a, &p);
        let uniform_p = vec![m / big_r; p.len()];
        prop_assert!(best <= poisson_sampling_variance(&a, &uniform_p) * (1.0 + 1e-12));
        let weights: Vec<f64> = clients.iter().map(|c| c.3).collect();
        let other = random_feasible(&weights, &r, m);
        prop_assert!(best <= poisson_sampling_variance(&a, &other) * (1.0 + 1e-9));
    }
}

/// Monte Carlo (§2.1, §2.4): under independent Bernoulli(p_k) selection with the optimal
/// probabilities, `Ĝ = Σ_{k∈A} (n_k/p_k) U_k` averages to `G = Σ_k n_k U_k`, and its spread is
/// smaller than that of uniform selection of m clients (the HT estimate with `p = m/K`).
///
/// Budgets are comparable because `r_k = 1`: both policies upload `m` full models in
/// expectation. Tolerance of the mean: each coordinate j of `Ĝ` has the exact variance
/// `σ_j² = Σ_k n_k² U_kj² (1/p_k − 1)` (independent inclusions), so its average over T draws is
/// within 5 σ_j/√T of `G_j` (a false alarm has probability < 1e-5 per coordinate; the seed is
/// fixed, so the outcome is deterministic anyway). The empirical total variance must be within
/// 10% of `Σ a_k² (1/p_k − 1)`.
#[test]
fn inverse_probability_estimate_is_unbiased_and_beats_uniform() {
    const K: usize = 40;
    const DIM: usize = 4;
    const T: usize = 40_000;
    let m = 8.0;
    let mut data = stream(11, 0, 0, Purpose::Experiment);
    let mut draw = || fedshard_strategies::rng::uniform(&mut data);
    let samples: Vec<f64> = (0..K).map(|_| (10.0 + 990.0 * draw()).floor()).collect();
    // Heterogeneous update norms: a few clients dominate.
    let updates: Vec<[f64; DIM]> = (0..K)
        .map(|k| {
            let scale = if k % 7 == 0 { 20.0 } else { 1.0 };
            std::array::from_fn(|_| scale * (2.0 * draw() - 1.0))
        })
        .collect();
    let clients: Vec<ClientStats> = (0..K)
        .map(|k| ClientStats {
            id: k as u64,
            samples: samples[k],
            keep_ratio: 1.0,
            update_norm: Some(updates[k].iter().map(|x| x * x).sum::<f64>().sqrt()),
        })
        .collect();
    let target: [f64; DIM] =
        std::array::from_fn(|j| (0..K).map(|k| samples[k] * updates[k][j]).sum());

    let estimate = |selector: &dyn ClientSelector, seed: u64| -> (Vec<[f64; DIM]>, Vec<f64>) {
        let mut rng = stream(seed, 0, 0, Purpose::Selection);
        let mut out = Vec::with_capacity(T);
        let mut p_used = Vec::new();
        for _ in 0..T {
            let s = selector.select(&clients, m, &mut rng).unwrap();
            let mut g = [0.0; DIM];
            for &k in &s.chosen {
                for (gj, uj) in g.iter_mut().zip(updates[k]) {
                    *gj += samples[k] / s.probabilities[k] * uj;
                }
            }
            out.push(g);
            p_used = s.probabilities;
        }
        (out, p_used)
    };
    let total_variance = |draws: &[[f64; DIM]]| -> f64 {
        draws
            .iter()
            .map(|g| {
                g.iter()
                    .zip(&target)
                    .map(|(x, t)| (x - t) * (x - t))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / draws.len() as f64
    };

    let (optimal, p) = estimate(&OptimalPartialSelector, 1);
    let spent: f64 = p.iter().sum();
    assert!((spent - m).abs() < 1e-12 * m);
    for j in 0..DIM {
        let mean = optimal.iter().map(|g| g[j]).sum::<f64>() / T as f64;
        let sigma2: f64 = (0..K)
            .map(|k| (samples[k] * updates[k][j]).powi(2) * (1.0 / p[k] - 1.0))
            .sum();
        let tol = 5.0 * (sigma2 / T as f64).sqrt();
        assert!(
            (mean - target[j]).abs() <= tol,
            "coordinate {j}: mean {mean}, target {}, tolerance {tol}",
            target[j]
        );
    }
    let a: Vec<f64> = clients
        .iter()
        .map(|c| c.samples * c.update_norm.unwrap_or(0.0))
        .collect();
    let exact = poisson_sampling_variance(&a, &p);
    let empirical_optimal = total_variance(&optimal);
    assert!(
        (empirical_optimal / exact - 1.0).abs() < 0.1,
        "empirical {empirical_optimal}, exact {exact}"
    );

    let (uniform, _) = estimate(&UniformSelector, 2);
    let empirical_uniform = total_variance(&uniform);
    assert!(
        empirical_optimal < empirical_uniform,
        "optimal {empirical_optimal} vs uniform {empirical_uniform}"
    );
}
