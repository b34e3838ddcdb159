//! Thin SVD of a layer and the marginals of the spectral strategies (docs/algorithms.md §1.1–1.3).
//!
//! Targets (faer f32 on the reference machine): SVD 512×512 ≈ 35 ms, 512×4608 ≈ 130 ms
//! (numpy/OpenBLAS: 80–100 ms and 500+ ms). Besides criterion's figures, each SVD size prints
//! the relative reconstruction error `‖W − recompose(factorize(W))‖_F / ‖W‖_F` and the achieved
//! GFLOP/s against a rough Golub–Kahan–Reinsch flop count for a thin SVD of an `m × n` matrix
//! with `m ≥ n` (shape transposed otherwise), computing `U`, `Σ` and `V`:
//! `flops ≈ 4 m n² + 8 n³` (bidiagonalisation `4mn² − 4n³/3` plus forming the thin `U` and `V`
//! and the QR sweeps; the constant is a rough order-of-magnitude count, not faer's exact work).
//!
//! Strategy marginals use a decaying spectrum `λ_i = (i + 1)^(-1.2)` with `n = ⌈0.1 N⌉`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use fedshard_strategies::rng::{Purpose, stream, uniform};
use fedshard_strategies::sharding::{collective, unbiased};
use fedshard_strategies::svd::{factorize, recompose};

/// Row-major `rows × cols` matrix with entries uniform in `[-1, 1)`, seeded.
fn random_matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = stream(seed, 0, 0, Purpose::Experiment);
    (0..rows * cols)
        .map(|_| (2.0 * uniform(&mut rng) - 1.0) as f32)
        .collect()
}

/// Rough thin-SVD flop count `4 m n² + 8 n³` with `m = max`, `n = min` of the shape.
fn svd_flops(rows: usize, cols: usize) -> f64 {
    let (m, n) = (rows.max(cols) as f64, rows.min(cols) as f64);
    4.0 * m * n * n + 8.0 * n * n * n
}

fn relative_error(original: &[f32], rebuilt: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&a, &b) in original.iter().zip(rebuilt) {
        diff += (a as f64 - b as f64).powi(2);
        norm += (a as f64).powi(2);
    }
    (diff / norm).sqrt()
}

fn thin_svd(c: &mut Criterion) {
    let mut group = c.benchmark_group("thin SVD f32");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (rows, cols) in [(512, 512), (512, 4608)] {
        let w = random_matrix(rows, cols, 7);
        // One timed call for the report (best of three), separate from criterion's statistics.
        let mut best = f64::INFINITY;
        let mut factors = None;
        for _ in 0..3 {
            let started = Instant::now();
            let f = factorize::<f32>(&w, rows, cols).expect("finite matrix");
            best = best.min(started.elapsed().as_secs_f64());
            factors = Some(f);
        }
        let factors = factors.expect("at least one run");
        let error = relative_error(&w, &recompose(&factors));
        let flops = svd_flops(rows, cols);
        eprintln!(
            "SVD {rows}×{cols}: ‖W − USVᵀ‖_F/‖W‖_F = {error:.3e}; flops ≈ 4mn² + 8n³ = {:.3e}; \
             best of 3 {:.1} ms → {:.2} GFLOP/s",
            flops,
            best * 1e3,
            flops / best / 1e9
        );
        group.bench_function(format!("{rows}x{cols}"), |b| {
            b.iter(|| factorize::<f32>(black_box(&w), rows, cols).expect("finite matrix"))
        });
    }
    group.finish();
}

/// A decaying singular spectrum: `λ_i = (i + 1)^(-1.2)`.
fn spectrum(big_n: usize) -> Vec<f64> {
    (0..big_n).map(|i| ((i + 1) as f64).powf(-1.2)).collect()
}

fn strategy_marginals(c: &mut Criterion) {
    const CLIENTS: usize = 10;
    for big_n in [512usize, 4096] {
        let lambda = spectrum(big_n);
        let n = big_n.div_ceil(10);
        let mut group = c.benchmark_group(format!("marginals N={big_n} n={n}"));
        group
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        group.bench_function("unbiased", |b| {
            b.iter(|| unbiased::marginals(black_box(&lambda), n).expect("valid spectrum"))
        });
        group.bench_function(format!("collective C={CLIENTS}"), |b| {
            b.iter(|| {
                collective::marginals(black_box(&lambda), n, CLIENTS).expect("valid spectrum")
            })
        });
        group.finish();
    }
}

criterion_group!(benches, thin_svd, strategy_marginals);
criterion_main!(benches);
