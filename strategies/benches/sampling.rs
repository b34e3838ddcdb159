//! Set-up and per-draw cost of the joint samplers (docs/algorithms.md §1.5–1.6).
//!
//! Targets for conditional Poisson (100× R `sampling::UPmaxentropy` on the reference machine):
//! N = 512, n = 52: fit ≤ 0.48 ms, draw ≤ 7 µs; N = 2048, n = 205: fit ≤ 6 ms, draw ≤ 32 µs.
//! `π` is water-filled from a decaying spectrum, `π_i = min(1, c λ_i)` with `Σπ = n`, so it
//! has a few certainty units and a long tail, like the Unbiased strategy's output (§1.2).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::sampling::{ConditionalPoisson, SamplerName, prepare};
use fedshard_strategies::sharding::unbiased;
use fedshard_strategies::spectrum::SortedSpectrum;

/// A feasible π with integer sum n: the water-filling `π_i = min(1, λ_i / s)` with `Σπ = n`,
/// which is exactly the Unbiased strategy's marginals (docs/algorithms.md §1.2); needs n ≤ #{λ > 0}.
fn water_fill(weights: &[f64], n: usize) -> Vec<f64> {
    let sorted = SortedSpectrum::new(weights).expect("finite non-negative weights");
    let marginals = unbiased::marginals(sorted.values(), n).expect("1 ≤ n ≤ N");
    sorted.unsort(&marginals.inclusion_probabilities)
}

/// A decaying singular spectrum: `λ_i = (i + 1)^(-1.2)`.
fn spectrum(big_n: usize) -> Vec<f64> {
    (0..big_n).map(|i| ((i + 1) as f64).powf(-1.2)).collect()
}

fn conditional_poisson(c: &mut Criterion) {
    for (big_n, n) in [(512, 52), (2048, 205)] {
        let pi = water_fill(&spectrum(big_n), n);
        let ones = pi.iter().filter(|&&p| p >= 1.0 - 1e-12).count();
        let rest: Vec<f64> = pi.iter().copied().filter(|&p| p < 1.0 - 1e-12).collect();
        let fitted = ConditionalPoisson::fit(&rest).expect("feasible π");
        eprintln!(
            "N = {big_n}, n = {n}: {ones} certainty units, fit took {} sweeps",
            fitted.fit_iterations()
        );
        let mut group = c.benchmark_group(format!("conditional-poisson N={big_n} n={n}"));
        group
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        group.bench_function("set-up (prepare)", |b| {
            b.iter(|| prepare(SamplerName::ConditionalPoisson, black_box(&pi), None))
        });
        let design = prepare(SamplerName::ConditionalPoisson, &pi, None).expect("feasible π");
        let mut rng = stream(1, 0, 0, Purpose::Sharding);
        let mut out = Vec::with_capacity(n);
        group.bench_function("draw", |b| {
            b.iter(|| {
                design.draw_into(&mut rng, &mut out);
                black_box(&out);
            })
        });
        group.finish();
    }
}

fn other_samplers(c: &mut Criterion) {
    let (big_n, n) = (512, 52);
    let pi = water_fill(&spectrum(big_n), n);
    let mut group = c.benchmark_group(format!("draw N={big_n} n={n}"));
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for name in SamplerName::ALL {
        let design = prepare(name, &pi, Some(n)).expect("feasible π");
        let mut rng = stream(2, 0, 0, Purpose::Sharding);
        let mut out = Vec::with_capacity(n);
        group.bench_function(name.as_str(), |b| {
            b.iter(|| {
                design.draw_into(&mut rng, &mut out);
                black_box(&out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, conditional_poisson, other_samplers);
criterion_main!(benches);
