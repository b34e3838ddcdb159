//! KLMS encode and decode throughput on Bernoulli coordinates (docs/algorithms.md §4.1; issue 14:
//! at least 10⁷ parameters per second per core for K ≤ 16), and SignSGD's bit-candidate coder
//! against the generic one on the same signs.
//!
//! The floor of the encoder is `K · S` random draws from `p` and `K · S` log-ratio evaluations
//! per block of `S` coordinates (plus `S` log-ratio preparations): the work per parameter grows
//! with K. The decoder jumps to candidate `k*` in the shared stream and draws `S` values per
//! block, whatever K. Throughput is reported in parameters (coordinates) per second, one thread.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use fedshard_strategies::compression::{
    Bernoulli, Categorical, FairSignEncoder, KlmsEncoder, Partition, ProductDistribution,
    Selection, SharedSeed, decode,
};
use fedshard_strategies::rng::{Purpose, stream, uniform};

/// The number of coordinates per run: large enough that per-call overhead vanishes.
const D: usize = 1 << 16;

fn probabilities(salt: u64) -> Vec<f64> {
    let mut rng = stream(salt, 0, 0, Purpose::Experiment);
    (0..D).map(|_| 0.05 + 0.9 * uniform(&mut rng)).collect()
}

/// A benchmark group measured in parameters per second, `samples` samples of about 2 s.
fn configured(c: &mut Criterion, name: String, samples: usize) -> BenchmarkGroup<'_, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .throughput(Throughput::Elements(D as u64))
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    group
}

/// The seed, round and client of every benchmarked message.
const SHARED: SharedSeed = SharedSeed {
    seed: 7,
    round: 1,
    client: 3,
};

/// One generic-encoder setting: `q` against `p` in the blocks of `partition`, `k` candidates.
struct Case<'a, D> {
    q: &'a D,
    p: &'a D,
    partition: &'a Partition,
    k: usize,
}

impl<D: ProductDistribution> Case<'_, D> {
    /// Benchmarks the generic encoder with `selection` as `name`; returns the indices of one
    /// more encoding, for the decoder.
    fn bench_encode(
        &self,
        group: &mut BenchmarkGroup<'_, WallTime>,
        name: &str,
        selection: Selection,
    ) -> Vec<u32> {
        let mut encoder = KlmsEncoder::new().with_selection(selection);
        let mut selected = vec![D::Symbol::default(); self.q.len()];
        let mut selection = SHARED.selection_stream();
        let mut run = || {
            encoder
                .encode(
                    self.q,
                    self.p,
                    self.partition,
                    self.k,
                    &SHARED,
                    &mut selection,
                    &mut selected,
                )
                .expect("valid input")
        };
        group.bench_function(name, |b| b.iter(&mut run));
        run()
    }
}

fn klms(c: &mut Criterion) {
    let (qs, ps) = (probabilities(1), probabilities(2));
    let q = Bernoulli::new(&qs).expect("probabilities in [0, 1]");
    let p = Bernoulli::new(&ps).expect("probabilities in [0, 1]");
    for block_size in [64, 256] {
        let partition = Partition::fixed(D, block_size).expect("d, S > 0");
        for k in [2, 4, 16] {
            eprintln!(
                "S = {block_size}, K = {k}: encoder floor {} draws + {} log-ratio evaluations per \
                 block ({k} of each per parameter); decoder {block_size} draws per block",
                k * block_size,
                k * block_size,
            );
            let mut group = configured(c, format!("klms bernoulli S={block_size} K={k}"), 20);
            let case = Case {
                q: &q,
                p: &p,
                partition: &partition,
                k,
            };
            let indices = case.bench_encode(&mut group, "encode", Selection::Importance);
            case.bench_encode(&mut group, "encode ordered", Selection::Ordered);
            let mut decoded = vec![false; D];
            group.bench_function("decode", |b| {
                b.iter(|| {
                    decode(
                        &p,
                        &partition,
                        k,
                        black_box(&indices),
                        &SHARED,
                        &mut decoded,
                    )
                    .expect("valid indices")
                })
            });
            group.finish();
        }
    }
    // The shipped MNIST configs' regime: blocks of up to 1 024 values and about 8 bits of KL,
    // K = 2^(8 + 4) candidates, ordered selection.
    let (block_size, k) = (1024, 4096);
    eprintln!(
        "S = {block_size}, K = {k}, ordered: encoder floor {} draws + {} log-ratio evaluations \
         per block ({k} of each per parameter)",
        k * block_size,
        k * block_size,
    );
    let partition = Partition::fixed(D, block_size).expect("d, S > 0");
    let mut group = configured(c, format!("klms bernoulli S={block_size} K={k}"), 10);
    let case = Case {
        q: &q,
        p: &p,
        partition: &partition,
        k,
    };
    case.bench_encode(&mut group, "encode ordered", Selection::Ordered);
    group.finish();
}

/// SignSGD's bit-candidate coder (`fair_signs`) against the generic categorical coder on the
/// same signs: per block, the generic coder draws `K · S` words and looks up `K · S` log ratios;
/// this one draws `K · ⌈S/32⌉` words and looks up `K · ⌈S/8⌉` byte tables.
fn fair_signs(c: &mut Criterion) {
    let plus = probabilities(3);
    let rows: Vec<[f64; 3]> = plus.iter().map(|&x| [1.0 - x, 0.0, x]).collect();
    let fair = vec![[0.5, 0.0, 0.5]; D];
    let q = Categorical::new(&rows).expect("probabilities in [0, 1]");
    let p = Categorical::new(&fair).expect("probabilities in [0, 1]");
    let block_size = 128;
    let partition = Partition::fixed(D, block_size).expect("d, S > 0");
    for k in [16, 256] {
        eprintln!(
            "signs, S = {block_size}, K = {k}: generic coder {} words + {} look-ups per block, \
             bit coder {} words + {} look-ups",
            k * block_size,
            k * block_size,
            k * block_size.div_ceil(32),
            k * block_size.div_ceil(8),
        );
        let mut group = configured(c, format!("klms signs S={block_size} K={k}"), 10);
        let case = Case {
            q: &q,
            p: &p,
            partition: &partition,
            k,
        };
        case.bench_encode(&mut group, "encode generic", Selection::Importance);
        let mut selection = SHARED.selection_stream();
        for (name, choice) in [
            ("encode bit candidates", Selection::Importance),
            ("encode bit candidates ordered", Selection::Ordered),
        ] {
            let mut bits = FairSignEncoder::new().with_selection(choice);
            group.bench_function(name, |b| {
                b.iter(|| {
                    bits.encode(
                        black_box(&plus),
                        &partition,
                        k,
                        &SHARED,
                        &mut selection,
                        false,
                    )
                    .expect("valid input")
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, klms, fair_signs);
criterion_main!(benches);
