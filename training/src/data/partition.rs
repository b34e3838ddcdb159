//! Federated partitions with controlled heterogeneity: client sizes from lognormal weights
//! (quantity skew) and client class mixes from a Dirichlet around the global class distribution
//! (label skew), the usual Dir(α·p) construction of non-iid federated benchmarks.
//!
//! The procedure, each step seeded from its own [`Purpose::Data`] stream:
//! 1. sizes: weights `w_c = exp(σ z_c)`, `z_c ~ N(0, 1)`; each client gets `min_samples` plus a
//!    largest-remainder share of the rest in proportion to `w`, so sizes sum to `n` exactly;
//! 2. mixes: `q_c ~ Dir(α·p)` with `p` the global class distribution (`q_c = p` when α = ∞);
//!    client `c` wants the largest-remainder rounding of `size_c · q_c` per class;
//! 3. assignment: each class's samples are shuffled into a pool; clients, in index order, take
//!    what they want from each pool. When a pool runs dry, the shortfall is taken from the pool
//!    with the most samples left (lowest class index on ties), so every client still gets
//!    exactly its size and every sample lands on exactly one client. With small α this makes
//!    the last clients a little less skewed than their draw; that is the price of exact sizes.
//!
//! [`Purpose::Data`]: fedshard_strategies::rng::Purpose::Data

use rand_distr::{Distribution, Gamma, StandardNormal};

use super::{DataError, DataStream, Result, class_counts, data_stream, shuffle};
use fedshard_strategies::rng::{ChaCha20Rng, uniform};

/// How to split a dataset across clients.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PartitionSpec {
    /// Number of clients, at least 1.
    pub clients: usize,
    /// Dirichlet concentration of the label skew, Dir(α·p): small α gives clients few classes,
    /// large α clients close to the global mix; `f64::INFINITY` means iid (exactly `p`).
    pub alpha: f64,
    /// Log-standard deviation of the lognormal client-size weights; 0 gives equal sizes.
    pub size_sigma: f64,
    /// Smallest number of samples any client gets.
    pub min_samples: usize,
}

/// Splits the samples with `labels` (each `< classes`) across `spec.clients` clients and returns,
/// per client, its sample indices in ascending order. Every index appears exactly once. The
/// result depends only on the inputs and `seed`.
///
/// Errors when there are no clients, `clients · min_samples > n`, `alpha` is not positive,
/// `size_sigma` is negative or not finite, or a label is not below `classes`.
pub fn partition(
    labels: &[u32],
    classes: usize,
    spec: &PartitionSpec,
    seed: u64,
) -> Result<Vec<Vec<usize>>> {
    validate(labels, classes, spec)?;
    let n = labels.len();
    let sizes = client_sizes(n, spec, seed);

    let counts = class_counts(labels, classes);
    let global: Vec<f64> = counts.iter().map(|&c| c as f64 / n.max(1) as f64).collect();

    let mut pools = shuffled_pools(labels, classes, seed, DataStream::PartitionShuffle);

    let mut clients = Vec::with_capacity(spec.clients);
    for (client, &size) in sizes.iter().enumerate() {
        let mix = if spec.alpha.is_infinite() {
            global.clone()
        } else {
            let mut rng = data_stream(seed, DataStream::PartitionMix, client as u64);
            dirichlet(spec.alpha, &global, &mut rng)
        };
        let wanted = apportion(size, &mix);
        let mut indices = Vec::with_capacity(size);
        let mut shortfall = 0;
        for (pool, want) in pools.iter_mut().zip(wanted) {
            let take = want.min(pool.len());
            indices.extend(pool.drain(pool.len() - take..));
            shortfall += want - take;
        }
        while shortfall > 0 {
            // Largest pool, lowest class on ties; sizes sum to n, so it is never empty here.
            let fallback = pools
                .iter_mut()
                .rev()
                .max_by_key(|pool| pool.len())
                .filter(|pool| !pool.is_empty())
                .ok_or(DataError::InvalidParameter {
                    name: "partition sizes",
                    value: shortfall.to_string(),
                    expected: "sizes summing to the number of samples (internal error)",
                })?;
            let take = shortfall.min(fallback.len());
            indices.extend(fallback.drain(fallback.len() - take..));
            shortfall -= take;
        }
        indices.sort_unstable();
        clients.push(indices);
    }
    Ok(clients)
}

/// The sample indices of each class (labels must be `< classes`), each pool shuffled by its own
/// `step` stream so samples can be drawn without replacement by popping.
pub(super) fn shuffled_pools(
    labels: &[u32],
    classes: usize,
    seed: u64,
    step: DataStream,
) -> Vec<Vec<usize>> {
    let mut pools: Vec<Vec<usize>> = vec![Vec::new(); classes];
    for (i, &label) in labels.iter().enumerate() {
        pools[label as usize].push(i);
    }
    for (class, pool) in pools.iter_mut().enumerate() {
        shuffle(pool, &mut data_stream(seed, step, class as u64));
    }
    pools
}

fn validate(labels: &[u32], classes: usize, spec: &PartitionSpec) -> Result<()> {
    let invalid = |name, value: String, expected| {
        Err(DataError::InvalidParameter {
            name,
            value,
            expected,
        })
    };
    if spec.clients == 0 {
        return invalid("clients", "0".into(), "at least one client");
    }
    // NaN fails this test too.
    if spec.alpha.is_nan() || spec.alpha <= 0.0 {
        return invalid(
            "alpha",
            spec.alpha.to_string(),
            "a positive Dirichlet concentration (inf for iid)",
        );
    }
    if !(spec.size_sigma.is_finite() && spec.size_sigma >= 0.0) {
        return invalid(
            "size_sigma",
            spec.size_sigma.to_string(),
            "a finite log-standard deviation ≥ 0",
        );
    }
    fits_clients(
        "min_samples",
        spec.min_samples,
        spec.clients,
        labels.len(),
        "clients · min_samples ≤ number of samples",
    )?;
    if let Some((sample, &label)) = labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| l as usize >= classes)
    {
        return Err(DataError::LabelOutOfRange {
            sample,
            label,
            classes,
        });
    }
    Ok(())
}

/// Checks that `clients` clients can each have `per_client` of `samples` samples; the error
/// names the parameter `name` with the numbers involved.
pub(super) fn fits_clients(
    name: &'static str,
    per_client: usize,
    clients: usize,
    samples: usize,
    expected: &'static str,
) -> Result<()> {
    let needed = clients.checked_mul(per_client);
    if needed.is_none_or(|needed| needed > samples) {
        return Err(DataError::InvalidParameter {
            name,
            value: format!("{per_client} (× {clients} clients, {samples} samples)"),
            expected,
        });
    }
    Ok(())
}

/// `min_samples` each plus a share of the remaining samples proportional to lognormal weights.
fn client_sizes(n: usize, spec: &PartitionSpec, seed: u64) -> Vec<usize> {
    let mut rng = data_stream(seed, DataStream::PartitionSizes, 0);
    let log_weights: Vec<f64> = (0..spec.clients)
        .map(|_| {
            let z: f64 = StandardNormal.sample(&mut rng);
            spec.size_sigma * z
        })
        .collect();
    // Subtract the maximum before exponentiating so a large σ cannot overflow.
    let top = log_weights.iter().copied().fold(f64::MIN, f64::max);
    let weights: Vec<f64> = log_weights.iter().map(|l| (l - top).exp()).collect();
    let free = n - spec.clients * spec.min_samples;
    apportion(free, &weights)
        .into_iter()
        .map(|extra| extra + spec.min_samples)
        .collect()
}

/// A draw from Dir(α·p): independent Gamma(α p_k, 1) normalised. Classes with `p_k = 0` get 0.
///
/// Small shapes (α p_k ≪ 1) underflow Gamma samples to exactly 0, so the draw is made in log
/// space with `G(a) = G(a + 1) · U^{1/a}` and normalised by a log-sum-exp.
pub(super) fn dirichlet(alpha: f64, p: &[f64], rng: &mut ChaCha20Rng) -> Vec<f64> {
    let logs: Vec<f64> = p
        .iter()
        .map(|&pk| {
            let shape = alpha * pk;
            if shape.is_nan() || shape <= 0.0 {
                return f64::NEG_INFINITY;
            }
            let boosted = if shape < 1.0 { shape + 1.0 } else { shape };
            // Shapes here are positive and finite, so Gamma::new cannot fail; an error is
            // treated as "class absent" rather than a panic.
            let Ok(gamma) = Gamma::new(boosted, 1.0) else {
                return f64::NEG_INFINITY;
            };
            let g: f64 = gamma.sample(rng);
            let mut log_g = g.ln();
            if shape < 1.0 {
                log_g += (1.0 - uniform(rng)).ln() / shape;
            }
            log_g
        })
        .collect();
    let top = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if top == f64::NEG_INFINITY {
        return p.to_vec();
    }
    let exps: Vec<f64> = logs.iter().map(|l| (l - top).exp()).collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

/// Splits `total` into integers proportional to `weights` (non-negative, not all zero) by the
/// largest-remainder method: floors first, then one more to the largest fractional parts,
/// lowest index first on ties. The parts always sum to `total`.
fn apportion(total: usize, weights: &[f64]) -> Vec<usize> {
    if weights.is_empty() {
        return Vec::new();
    }
    let sum: f64 = weights.iter().sum();
    let share: Vec<f64> = if sum > 0.0 && sum.is_finite() {
        weights.iter().map(|w| total as f64 * w / sum).collect()
    } else {
        vec![total as f64 / weights.len() as f64; weights.len()]
    };
    let mut parts: Vec<usize> = share.iter().map(|s| s.floor() as usize).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    // Largest fractional part first; the stable sort keeps lower indices first on ties.
    order.sort_by(|&a, &b| {
        let fa = share[a] - share[a].floor();
        let fb = share[b] - share[b].floor();
        fb.total_cmp(&fa)
    });
    let assigned: usize = parts.iter().sum();
    if assigned <= total {
        for &i in order.iter().cycle().take(total - assigned) {
            parts[i] += 1;
        }
    } else {
        // Only reachable through rounding of shares that sum a hair above `total`.
        let mut excess = assigned - total;
        for &i in order.iter().rev() {
            if excess == 0 {
                break;
            }
            let cut = excess.min(parts[i]);
            parts[i] -= cut;
            excess -= cut;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 classes × 200 samples, labels interleaved.
    fn balanced_labels() -> Vec<u32> {
        (0..2000u32).map(|i| i % 10).collect()
    }

    fn spec(clients: usize, alpha: f64, size_sigma: f64, min_samples: usize) -> PartitionSpec {
        PartitionSpec {
            clients,
            alpha,
            size_sigma,
            min_samples,
        }
    }

    fn assert_exact_cover(parts: &[Vec<usize>], n: usize) {
        let mut seen = vec![0u32; n];
        for part in parts {
            for &i in part {
                seen[i] += 1;
            }
        }
        assert!(
            seen.iter().all(|&s| s == 1),
            "some sample not used exactly once"
        );
    }

    /// Mean over clients of the largest class share in the client: 1/classes for a perfectly
    /// iid client, 1 for a single-class client.
    fn mean_max_share(labels: &[u32], parts: &[Vec<usize>]) -> f64 {
        let shares: Vec<f64> = parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| {
                let sub: Vec<u32> = p.iter().map(|&i| labels[i]).collect();
                *class_counts(&sub, 10).iter().max().unwrap() as f64 / p.len() as f64
            })
            .collect();
        shares.iter().sum::<f64>() / shares.len() as f64
    }

    #[test]
    fn every_sample_goes_to_exactly_one_client_and_sizes_respect_min() {
        let labels = balanced_labels();
        for (alpha, sigma) in [(0.1, 1.0), (1.0, 0.0), (f64::INFINITY, 2.0), (0.01, 3.0)] {
            let parts = partition(&labels, 10, &spec(20, alpha, sigma, 30), 3).unwrap();
            assert_eq!(parts.len(), 20);
            assert_exact_cover(&parts, labels.len());
            assert!(parts.iter().all(|p| p.len() >= 30), "α={alpha} σ={sigma}");
        }
    }

    #[test]
    fn zero_sigma_gives_equal_sizes() {
        let labels: Vec<u32> = (0..103u32).map(|i| i % 3).collect();
        let parts = partition(&labels, 3, &spec(10, 1.0, 0.0, 0), 0).unwrap();
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        // 103 = 10 · 10 + 3: the first three clients take the remainder.
        assert_eq!(sizes, vec![11, 11, 11, 10, 10, 10, 10, 10, 10, 10]);
    }

    #[test]
    fn partition_is_deterministic_given_seed() {
        let labels = balanced_labels();
        let s = spec(8, 0.5, 1.0, 10);
        assert_eq!(
            partition(&labels, 10, &s, 42).unwrap(),
            partition(&labels, 10, &s, 42).unwrap()
        );
        assert_ne!(
            partition(&labels, 10, &s, 42).unwrap(),
            partition(&labels, 10, &s, 43).unwrap()
        );
    }

    #[test]
    fn small_alpha_skews_labels_more_than_large_alpha() {
        let labels = balanced_labels();
        let skewed = partition(&labels, 10, &spec(20, 0.1, 0.0, 0), 7).unwrap();
        let mild = partition(&labels, 10, &spec(20, 100.0, 0.0, 0), 7).unwrap();
        let (s, m) = (
            mean_max_share(&labels, &skewed),
            mean_max_share(&labels, &mild),
        );
        // Dir(0.1·p) over 10 classes puts most of a client on one or two classes (share ≳ 0.5);
        // Dir(100·p) stays within a few points of 0.1.
        assert!(s > 0.4, "α=0.1 mean max share {s}");
        assert!(m < 0.25, "α=100 mean max share {m}");
        assert!(s > m);
    }

    #[test]
    fn infinite_alpha_matches_the_global_distribution() {
        // Global distribution 10% / 30% / 60% over 1000 samples.
        let labels: Vec<u32> = (0..1000u32)
            .map(|i| match i % 10 {
                0 => 0,
                1..=3 => 1,
                _ => 2,
            })
            .collect();
        let parts = partition(&labels, 3, &spec(10, f64::INFINITY, 0.0, 0), 1).unwrap();
        for part in &parts {
            let sub: Vec<u32> = part.iter().map(|&i| labels[i]).collect();
            // 100 samples each: exactly 10 / 30 / 60 since the global shares are exact.
            assert_eq!(class_counts(&sub, 3), vec![10, 30, 60]);
        }
    }

    #[test]
    fn bad_specs_are_named() {
        let labels = balanced_labels();
        let name = |s: PartitionSpec| match partition(&labels, 10, &s, 0) {
            Err(DataError::InvalidParameter { name, .. }) => name,
            other => panic!("expected an error, got {other:?}"),
        };
        assert_eq!(name(spec(0, 1.0, 0.0, 0)), "clients");
        assert_eq!(name(spec(5, 0.0, 0.0, 0)), "alpha");
        assert_eq!(name(spec(5, -1.0, 0.0, 0)), "alpha");
        assert_eq!(name(spec(5, f64::NAN, 0.0, 0)), "alpha");
        assert_eq!(name(spec(5, 1.0, -1.0, 0)), "size_sigma");
        assert_eq!(name(spec(5, 1.0, f64::INFINITY, 0)), "size_sigma");
        assert_eq!(name(spec(21, 1.0, 0.0, 100)), "min_samples");
        assert_eq!(name(spec(2, 1.0, 0.0, usize::MAX)), "min_samples");
        assert!(matches!(
            partition(&[0, 10], 10, &spec(1, 1.0, 0.0, 0), 0),
            Err(DataError::LabelOutOfRange { sample: 1, .. })
        ));
    }

    #[test]
    fn apportion_sums_exactly() {
        assert_eq!(apportion(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(apportion(7, &[0.0, 2.0, 5.0]), vec![0, 2, 5]);
        assert_eq!(apportion(0, &[1.0, 2.0]), vec![0, 0]);
        let w = [0.1, 0.2, 0.3, 0.4, 1e-12, 7.0];
        assert_eq!(apportion(1001, &w).iter().sum::<usize>(), 1001);
    }

    #[test]
    fn tiny_alpha_dirichlet_does_not_underflow() {
        let p = vec![0.1; 10];
        let mut rng = data_stream(0, DataStream::PartitionMix, 0);
        let q = dirichlet(1e-3, &p, &mut rng);
        assert!((q.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(q.iter().all(|x| x.is_finite() && *x >= 0.0));
    }
}
