//! KLMS encode and decode throughput on Bernoulli coordinates (ALGORITHMS.md §4.1; issue 14:
//! at least 10⁷ parameters per second per core for K ≤ 16).
//!
//! The floor of the encoder is `K · S` random draws from `p` and `K · S` log-ratio evaluations
//! per block of `S` coordinates (plus `S` log-ratio preparations): the work per parameter grows
//! with K. The decoder jumps to candidate `k*` in the shared stream and draws `S` values per
//! block, whatever K. Throughput is reported in parameters (coordinates) per second, one thread.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fedshard_strategies::compression::{Bernoulli, KlmsEncoder, Partition, SharedSeed, decode};
use fedshard_strategies::rng::{Purpose, stream, uniform};

/// The number of coordinates per run: large enough that per-call overhead vanishes.
const D: usize = 1 << 16;

fn probabilities(salt: u64) -> Vec<f64> {
    let mut rng = stream(salt, 0, 0, Purpose::Experiment);
    (0..D).map(|_| 0.05 + 0.9 * uniform(&mut rng)).collect()
}

fn klms(c: &mut Criterion) {
    let (qs, ps) = (probabilities(1), probabilities(2));
    let q = Bernoulli::new(&qs).expect("probabilities in [0, 1]");
    let p = Bernoulli::new(&ps).expect("probabilities in [0, 1]");
    let shared = SharedSeed {
        seed: 7,
        round: 1,
        client: 3,
    };
    for block_size in [64, 256] {
        let partition = Partition::fixed(D, block_size).expect("d, S > 0");
        for k in [2, 4, 16] {
            eprintln!(
                "S = {block_size}, K = {k}: encoder floor {} draws + {} log-ratio evaluations per \
                 block ({k} of each per parameter); decoder {block_size} draws per block",
                k * block_size,
                k * block_size,
            );
            let mut group = c.benchmark_group(format!("klms bernoulli S={block_size} K={k}"));
            group
                .throughput(Throughput::Elements(D as u64))
                .sample_size(20)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2));
            let mut encoder = KlmsEncoder::new();
            let mut selected = vec![false; D];
            let mut selection = shared.selection_stream();
            group.bench_function("encode", |b| {
                b.iter(|| {
                    encoder
                        .encode(
                            &q,
                            &p,
                            &partition,
                            k,
                            &shared,
                            &mut selection,
                            &mut selected,
                        )
                        .expect("valid input")
                })
            });
            let indices = encoder
                .encode(
                    &q,
                    &p,
                    &partition,
                    k,
                    &shared,
                    &mut selection,
                    &mut selected,
                )
                .expect("valid input");
            let mut decoded = vec![false; D];
            group.bench_function("decode", |b| {
                b.iter(|| {
                    decode(
                        &p,
                        &partition,
                        k,
                        black_box(&indices),
                        &shared,
                        &mut decoded,
                    )
                    .expect("valid indices")
                })
            });
            group.finish();
        }
    }
}

criterion_group!(benches, klms);
criterion_main!(benches);
