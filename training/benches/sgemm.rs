//! The machine's limit for local training: one thread of the `gemm` crate, through the call
//! the fused CPU kernels make ([`sgemm`]: `Parallelism::None`, row-major operands), at large square
//! shapes (the core's peak) and at the models' own product shapes. `docs/performance.md`
//! divides each model's flops per sample by these figures to say how far `bench train` is
//! from the machine.
//!
//! `cargo bench -p fedshard-training --bench sgemm --features avx512` prints GFLOP/s, best of
//! five timed batches of calls per shape, and which kernels ran ([`product_kernels`]: AVX-512
//! with the feature on a CPU that has it; without the feature, the AVX2 path on any CPU).

use fedshard_training::models::kernels::{product_kernels, sgemm};
use std::hint::black_box;
use std::time::Instant;

/// `[m, k, n]` and what the product is in fedshard's models.
const SHAPES: [([usize; 3], &str); 9] = [
    ([512, 512, 512], "square 512 (the core's peak)"),
    ([1024, 1024, 1024], "square 1024"),
    ([32, 144, 2048], "digits-cnn conv1, batch 32"),
    ([32, 144, 512], "digits-cnn conv1, batch 8"),
    ([64, 288, 512], "digits-cnn conv2, batch 32"),
    ([800, 128, 384], "char-transformer q/k/v, batch 10"),
    ([800, 512, 128], "char-transformer MLP out, batch 10"),
    ([80, 32, 80], "char-transformer one attention head"),
    ([32, 64, 128], "digits-mlp hidden, batch 32"),
];

/// Best GFLOP/s over five batches of calls, each batch about 0.2 s long.
fn gflops(shape: [usize; 3]) -> f64 {
    let [m, k, n] = shape;
    let a: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 13) as f32 * 0.01).collect();
    let mut c = vec![0.0f32; m * n];
    let flops = 2.0 * (m * k * n) as f64;
    let calls = ((0.2 * 50e9 / flops) as usize).max(1);
    sgemm(shape, &a, &b, &mut c);
    let mut best = 0.0f64;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..calls {
            sgemm(shape, black_box(&a), black_box(&b), black_box(&mut c));
        }
        best = best.max(flops * calls as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    best
}

fn main() {
    let width = product_kernels();
    println!("sgemm, one thread, gemm crate with {width} kernels; best of five batches");
    for (shape, what) in SHAPES {
        let [m, k, n] = shape;
        println!(
            "{:>6.1} GFLOP/s  {m:>4} × {k:>4} × {n:>4}  {what}",
            gflops(shape)
        );
    }
}
