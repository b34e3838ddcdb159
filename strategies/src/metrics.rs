//! Diagnostics of a sharding strategy: how exploratory its marginals are (ANME, docs/algorithms.md
//! §1.9) and how far its estimator is from the full matrix, in expectation (Eq. 7) and for one
//! realised index set.

use crate::sharding::collective;

/// Probabilities this close to 0 or 1 are treated as exact (docs/algorithms.md conventions).
const CERTAINTY: f64 = 1e-12;

/// Entropy of a Bernoulli(p) in nats, `−p ln p − (1−p) ln(1−p)`, 0 at (and within 1e-12 of)
/// 0 and 1; `p` is clamped to [0, 1].
fn bernoulli_entropy(p: f64) -> f64 {
    let p = p.clamp(0.0, 1.0);
    if p <= CERTAINTY || p >= 1.0 - CERTAINTY {
        0.0
    } else {
        -p * p.ln() - (1.0 - p) * (1.0 - p).ln()
    }
}

/// ANME of one layer (docs/algorithms.md §1.9; the sharding paper §4.2.2): the mean marginal entropy
/// `(1/N) Σ_i H(π_i)` normalised by that of the uniform design, `H(n/N)`. 0 for Top-n, 1 for
/// uniform `π = n/N`; low values mean an exploitative strategy (every client gets the same
/// terms), high values an explorative one.
///
/// Defined as 0 when `n = 0`, `n ≥ N` or `π` is empty (then `H(n/N) = 0`: every design is
/// deterministic).
pub fn anme_layer(pi: &[f64], n: usize) -> f64 {
    let big_n = pi.len();
    if n == 0 || n >= big_n {
        return 0.0;
    }
    let uniform = bernoulli_entropy(n as f64 / big_n as f64);
    let mean = pi.iter().map(|&p| bernoulli_entropy(p)).sum::<f64>() / big_n as f64;
    mean / uniform
}

/// ANME of a model (docs/algorithms.md §1.9): the unweighted mean of [`anme_layer`] over the sharded
/// layers, each given as `(π, n)`. 0 for no layers.
pub fn anme(layers: &[(&[f64], usize)]) -> f64 {
    if layers.is_empty() {
        return 0.0;
    }
    layers.iter().map(|&(pi, n)| anme_layer(pi, n)).sum::<f64>() / layers.len() as f64
}

/// Eq. 7 (docs/algorithms.md §1.3, paper Theorem 3.2), the general form for fixed multipliers:
/// `E‖W − (1/C) Σ_c Ŵ^(c)‖²_F = Σλ² + Σ λ_i² ω_i π_i (−2 + ω_i/C + ω_i π_i (C−1)/C)`, where the
/// `C` clients draw i.i.d. index sets with marginals `π`. `C = 1` gives the single-client error
/// of any strategy with fixed `ω` (e.g. Eq. 4 when `ω = 1/π`). `clients = 0` is treated as 1.
///
/// # Panics
/// If `spectrum`, `pi` and `omega` differ in length.
pub fn expected_discrepancy(spectrum: &[f64], pi: &[f64], omega: &[f64], clients: usize) -> f64 {
    let energy: f64 = spectrum.iter().map(|l| l * l).sum();
    energy + collective::criterion(spectrum, pi, omega, clients)
}

/// The discrepancy of one realised estimator `Ŵ = Σ_j ω_j λ_{I_j} u_{I_j} v_{I_j}ᵀ`:
/// `Σ_{i∉I} λ_i² + Σ_j (1 − ω_j)² λ_{I_j}²`. Because the rank-one terms are orthogonal in the
/// Frobenius inner product, this equals `‖W − Ŵ‖²_F` exactly (checked against
/// [`crate::svd::recompose_subset`] in the tests). A repeated index adds its multipliers (the
/// coefficient of term i is `c_i = Σ_{j: I_j = i} ω_j` and the result is `Σ λ_i² (1 − c_i)²`).
///
/// # Panics
/// If `indices` and `multipliers` differ in length or an index is `≥ N`.
pub fn realised_discrepancy(spectrum: &[f64], indices: &[usize], multipliers: &[f64]) -> f64 {
    assert_eq!(
        indices.len(),
        multipliers.len(),
        "one multiplier per selected term"
    );
    let mut coefficient = vec![0.0; spectrum.len()];
    for (&i, &w) in indices.iter().zip(multipliers) {
        coefficient[i] += w;
    }
    spectrum
        .iter()
        .zip(&coefficient)
        .map(|(&l, &c)| l * l * (1.0 - c) * (1.0 - c))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream, uniform};
    use crate::svd::{factorize, recompose, recompose_subset};

    #[test]
    fn anme_extremes() {
        // Top-n → 0; uniform n/N → 1; n = N → 0 by definition.
        assert_eq!(anme_layer(&[1.0, 1.0, 0.0, 0.0], 2), 0.0);
        assert!((anme_layer(&[0.5; 4], 2) - 1.0).abs() < 1e-12);
        assert_eq!(anme_layer(&[1.0; 3], 3), 0.0);
        assert_eq!(anme(&[]), 0.0);
        let layers: [(&[f64], usize); 2] = [(&[0.5; 4], 2), (&[1.0, 0.0], 1)];
        assert!((anme(&layers) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn eq7_with_one_client_is_eq4_for_ht_multipliers() {
        // C = 1, ω = 1/π: Σλ² + Σλ²(−2 + 1/π) = Σλ²(1/π − 1).
        let lambda = [3.0, 2.0, 1.0];
        let pi = [0.9, 0.6, 0.5];
        let omega: Vec<f64> = pi.iter().map(|p| 1.0 / p).collect();
        let eq4: f64 = lambda
            .iter()
            .zip(&pi)
            .map(|(l, p)| l * l * (1.0 / p - 1.0))
            .sum();
        assert!((expected_discrepancy(&lambda, &pi, &omega, 1) - eq4).abs() < 1e-12);
    }

    #[test]
    fn realised_discrepancy_is_the_frobenius_error() {
        // Random 12 × 9 matrix, I = {0, 3, 4, 7}, ω = (1.5, 0.7, 2.0, 1.0):
        // ‖W − Ŵ‖²_F from the SVD factors equals the orthogonal-terms formula.
        let mut rng = stream(11, 0, 0, Purpose::Experiment);
        let (rows, cols) = (12, 9);
        let w: Vec<f64> = (0..rows * cols).map(|_| uniform(&mut rng) - 0.5).collect();
        let f = factorize(&w, rows, cols).unwrap();
        let full = recompose(&f);
        let indices = [0, 3, 4, 7];
        let multipliers = [1.5, 0.7, 2.0, 1.0];
        let approx = recompose_subset(&f, &indices, &multipliers);
        let frobenius: f64 = full.iter().zip(&approx).map(|(a, b)| (a - b).powi(2)).sum();
        let formula = realised_discrepancy(&f.singular_values, &indices, &multipliers);
        assert!((frobenius - formula).abs() < 1e-10 * formula.max(1.0));
        // The empty set leaves all of ‖W‖²; all terms with ω = 1 leave nothing.
        let energy: f64 = f.singular_values.iter().map(|l| l * l).sum();
        assert!((realised_discrepancy(&f.singular_values, &[], &[]) - energy).abs() < 1e-12);
        let all: Vec<usize> = (0..9).collect();
        assert_eq!(
            realised_discrepancy(&f.singular_values, &all, &[1.0; 9]),
            0.0
        );
    }
}
