//! The spectral oracles of docs/algorithms.md §1.11, each as: input, expected output, tolerance.
//!
//! Table values are printed to 6 decimals, so they are compared to 1e-6; exact identities
//! (`Σπ = n`, criterion = Eq. 7 at `(π, ω)`, closed-form E = Eq. 4) to 1e-9. For `*` boundary
//! cases only `π`, `ω` and the criterion are asserted, never the `(t, u)` label.

use fedshard_strategies::metrics::{anme, anme_layer, expected_discrepancy};
use fedshard_strategies::sharding::{
    Marginals, collective, prism, scaled, top_n, unbiased, wallenius,
};

const A: [f64; 6] = [10.0, 5.0, 3.0, 2.0, 1.0, 0.5];
const B: [f64; 8] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3];
const G: [f64; 10] = [
    8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625,
];
const TABLE: f64 = 1e-6;
const EXACT: f64 = 1e-9;

fn assert_close(actual: &[f64], expected: &[f64], tolerance: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tolerance,
            "{what}[{i}] = {a}, expected {e} ± {tolerance}\n  actual {actual:?}"
        );
    }
}

fn assert_scalar(actual: f64, expected: f64, tolerance: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= tolerance,
        "{what} = {actual}, expected {expected} ± {tolerance}"
    );
}

/// Σπ = n and, where the strategy has one, its closed-form error equals Eq. 7 at its own (π, ω)
/// with the given group size.
fn assert_identities(spectrum: &[f64], m: &Marginals, n: usize, clients: usize) {
    let sum: f64 = m.inclusion_probabilities.iter().sum();
    assert_scalar(sum, n as f64, EXACT, "Σπ");
    if let Some(error) = m.expected_discrepancy {
        let eq7 = expected_discrepancy(
            spectrum,
            &m.inclusion_probabilities,
            &m.multipliers,
            clients,
        );
        assert_scalar(error, eq7, EXACT, "closed form vs Eq. 7");
    }
}

// ---- Unbiased (§1.2) ------------------------------------------------------------------------

fn check_unbiased(spectrum: &[f64], n: usize, pi: &[f64], omega: Option<&[f64]>, error: f64) {
    let m = unbiased::marginals(spectrum, n).unwrap();
    assert_close(&m.inclusion_probabilities, pi, TABLE, "unbiased π");
    if let Some(omega) = omega {
        assert_close(&m.multipliers, omega, TABLE, "unbiased ω");
    }
    let closed_form = m.expected_discrepancy.unwrap();
    assert_scalar(closed_form, error, TABLE, "unbiased E");
    // The closed form Λ²/(n−t) − Σ_{i>t} λ² equals Eq. 4 evaluated at π (exact identity), and
    // Eq. 7 with C = 1 and ω = 1/π.
    let eq4 = unbiased::discrepancy(spectrum, &m.inclusion_probabilities);
    assert_scalar(closed_form, eq4, EXACT, "closed form vs Eq. 4");
    assert_identities(spectrum, &m, n, 1);
}

#[test]
fn unbiased_spectrum_a_n1() {
    check_unbiased(
        &A,
        1,
        &[0.465116, 0.232558, 0.139535, 0.093023, 0.046512, 0.023256],
        Some(&[2.15, 4.3, 7.166667, 10.75, 21.5, 43.0]),
        323.0,
    );
}

#[test]
fn unbiased_spectrum_a_n2() {
    check_unbiased(
        &A,
        2,
        &[0.930233, 0.465116, 0.279070, 0.186047, 0.093023, 0.046512],
        Some(&[1.075, 2.15, 3.583333, 5.375, 10.75, 21.5]),
        91.875,
    );
}

#[test]
fn unbiased_spectrum_a_n3() {
    check_unbiased(
        &A,
        3,
        &[1.0, 0.869565, 0.521739, 0.347826, 0.173913, 0.086957],
        Some(&[1.0, 1.15, 1.916667, 2.875, 5.75, 11.5]),
        26.875,
    );
}

#[test]
fn unbiased_spectrum_b_n3() {
    check_unbiased(
        &B,
        3,
        &[
            0.576923, 0.519231, 0.461538, 0.403846, 0.346154, 0.288462, 0.230769, 0.173077,
        ],
        None,
        5.213333,
    );
}

#[test]
fn unbiased_spectrum_g_n4_has_one_interior_slot() {
    // t* = 3, n − t* = 1: the case that crashes R's UPmaxentropy.
    check_unbiased(
        &G,
        4,
        &[
            1.0, 1.0, 1.0, 0.503937, 0.251969, 0.125984, 0.062992, 0.031496, 0.015748, 0.007874,
        ],
        None,
        2.604492,
    );
}

// ---- Collective (§1.3) ----------------------------------------------------------------------

/// Checks π, ω (on the support; 0 elsewhere), the criterion (Eq. 7 − Σλ²) and the error, for
/// both the fast solver and the reference sweep.
fn check_collective(
    spectrum: &[f64],
    n: usize,
    clients: usize,
    pi: &[f64],
    omega: Option<&[f64]>,
    criterion: Option<f64>,
    error: f64,
) {
    let fast = collective::marginals(spectrum, n, clients).unwrap();
    let sweep = collective::marginals_by_sweep(spectrum, n, clients).unwrap();
    for (m, which) in [(&fast, "fast"), (&sweep, "sweep")] {
        let what = format!("collective {which} n={n} C={clients}");
        assert_close(&m.inclusion_probabilities, pi, TABLE, &format!("{what} π"));
        if let Some(omega) = omega {
            assert_close(&m.multipliers, omega, TABLE, &format!("{what} ω"));
        }
        let value = collective::criterion(
            spectrum,
            &m.inclusion_probabilities,
            &m.multipliers,
            clients,
        );
        if let Some(expected) = criterion {
            assert_scalar(value, expected, TABLE, &format!("{what} criterion"));
        }
        assert_scalar(
            m.expected_discrepancy.unwrap(),
            error,
            TABLE,
            &format!("{what} error"),
        );
        let energy: f64 = spectrum.iter().map(|l| l * l).sum();
        assert_scalar(energy + value, error, TABLE, &format!("{what} Σλ² + crit"));
        assert_identities(spectrum, m, n, clients);
    }
}

#[test]
fn collective_spectrum_a_n1_c2_is_top_n_boundary() {
    // λ_1 = 10 = C λ_2: boundary (*) where top-n and (0, 1) coincide.
    check_collective(
        &A,
        1,
        2,
        &[1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        Some(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        Some(-100.0),
        39.25,
    );
}

#[test]
fn collective_spectrum_a_n1_c5() {
    check_collective(
        &A,
        1,
        5,
        &[0.722222, 0.236111, 0.041667, 0.0, 0.0, 0.0],
        Some(&[1.285714, 2.571429, 4.285714, 0.0, 0.0, 0.0]),
        Some(-109.642857),
        29.607143,
    );
}

#[test]
fn collective_spectrum_a_n2_c2() {
    check_collective(
        &A,
        2,
        2,
        &[1.0, 0.875, 0.125, 0.0, 0.0, 0.0],
        Some(&[1.0, 1.066667, 1.777778, 0.0, 0.0, 0.0]),
        Some(-125.333333),
        13.916667,
    );
}

#[test]
fn collective_spectrum_a_n2_c5() {
    check_collective(
        &A,
        2,
        5,
        &[1.0, 0.625, 0.275, 0.1, 0.0, 0.0],
        Some(&[1.0, 1.428571, 2.380952, 3.571429, 0.0, 0.0]),
        Some(-129.642857),
        9.607143,
    );
}

#[test]
fn collective_spectrum_a_n2_c10() {
    check_collective(
        &A,
        2,
        10,
        &[1.0, 0.545455, 0.282828, 0.151515, 0.020202, 0.0],
        Some(&[1.0, 1.692308, 2.820513, 4.230769, 8.461538, 0.0]),
        Some(-132.991453),
        6.258547,
    );
}

#[test]
fn collective_spectrum_a_n3_c2() {
    check_collective(
        &A,
        3,
        2,
        &[1.0, 1.0, 0.8, 0.2, 0.0, 0.0],
        Some(&[1.0, 1.0, 1.111111, 1.666667, 0.0, 0.0]),
        Some(-134.333333),
        4.916667,
    );
}

#[test]
fn collective_spectrum_a_n3_c10_boundary() {
    // (*) λ_1 = 10 sits exactly on √C s: labels (0,5) and (1,4) give the same π.
    check_collective(
        &A,
        3,
        10,
        &[1.0, 1.0, 0.555556, 0.333333, 0.111111, 0.0],
        Some(&[1.0, 1.0, 1.666667, 2.5, 5.0, 0.0]),
        Some(-137.222222),
        2.027778,
    );
}

#[test]
fn collective_spectrum_b_n3() {
    // C = 2 is a boundary case (*).
    check_collective(
        &B,
        3,
        2,
        &[1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.0, 0.0],
        None,
        None,
        1.2,
    );
    // C = 5: (0, 8), only the end points are tabulated.
    let m = collective::marginals(&B, 3, 5).unwrap();
    assert_scalar(m.inclusion_probabilities[0], 0.711538, TABLE, "π_1");
    assert_scalar(m.inclusion_probabilities[7], 0.038462, TABLE, "π_8");
    assert_scalar(m.expected_discrepancy.unwrap(), 0.74, TABLE, "error");
    assert_identities(&B, &m, 3, 5);
    let sweep = collective::marginals_by_sweep(&B, 3, 5).unwrap();
    assert_close(
        &sweep.inclusion_probabilities,
        &m.inclusion_probabilities,
        EXACT,
        "sweep π",
    );
}

#[test]
fn collective_spectrum_g_n2() {
    let mut pi = vec![0.0; 10];
    pi[..3].copy_from_slice(&[1.0, 0.833333, 0.166667]);
    let mut omega = vec![0.0; 10];
    omega[..3].copy_from_slice(&[1.0, 1.125, 2.25]);
    check_collective(&G, 2, 3, &pi, Some(&omega), None, 4.833252);

    let mut pi = vec![0.0; 10];
    pi[..4].copy_from_slice(&[1.0, 0.650794, 0.269841, 0.079365]);
    let mut omega = vec![0.0; 10];
    omega[..4].copy_from_slice(&[1.0, 1.458333, 2.916667, 5.833333]);
    check_collective(&G, 2, 10, &pi, Some(&omega), None, 2.536956);
}

#[test]
fn collective_top_n_rule() {
    // λ = (10, 4, 1, .5), n = 2: λ_2 = 4 ≥ 2·λ_3 → top-n for C = 2; 4 < 5·1 → (1, 2) for C = 5,
    // where s = √5·5/6 gives π = (1, .95, .05, 0).
    let lambda = [10.0, 4.0, 1.0, 0.5];
    let top = top_n::marginals(&lambda, 2).unwrap();
    check_collective(
        &lambda,
        2,
        2,
        &top.inclusion_probabilities,
        Some(&top.multipliers),
        Some(-116.0),
        1.25,
    );
    let m = collective::marginals(&lambda, 2, 5).unwrap();
    assert_close(
        &m.inclusion_probabilities,
        &[1.0, 0.95, 0.05, 0.0],
        EXACT,
        "C = 5 π",
    );
    check_collective(
        &lambda,
        2,
        5,
        &[1.0, 0.95, 0.05, 0.0],
        Some(&[1.0, 5.0 / 4.8, 5.0 / 1.2, 0.0]),
        None,
        m.expected_discrepancy.unwrap(),
    );
}

// ---- ANME (§1.9) ----------------------------------------------------------------------------

#[test]
fn anme_oracles() {
    let unbiased_a = unbiased::marginals(&A, 2).unwrap();
    assert_scalar(
        anme_layer(&unbiased_a.inclusion_probabilities, 2),
        0.658234,
        TABLE,
        "ANME unbiased A n=2",
    );
    let unbiased_b = unbiased::marginals(&B, 3).unwrap();
    assert_scalar(
        anme_layer(&unbiased_b.inclusion_probabilities, 3),
        0.941924,
        TABLE,
        "ANME unbiased B n=3",
    );
    for (clients, expected) in [(2, 0.197309), (5, 0.412354), (10, 0.473613)] {
        let m = collective::marginals(&A, 2, clients).unwrap();
        assert_scalar(
            anme_layer(&m.inclusion_probabilities, 2),
            expected,
            TABLE,
            "ANME collective A n=2",
        );
    }
    let m = collective::marginals(&A, 1, 2).unwrap();
    assert_eq!(anme_layer(&m.inclusion_probabilities, 1), 0.0);
    // The model-level ANME is the unweighted mean of the layers.
    let layers: [(&[f64], usize); 2] = [
        (&unbiased_a.inclusion_probabilities, 2),
        (&unbiased_b.inclusion_probabilities, 3),
    ];
    assert_scalar(
        anme(&layers),
        (0.658234 + 0.941924) / 2.0,
        TABLE,
        "ANME mean",
    );
}

// ---- PriSM and Wallenius (§1.5) -------------------------------------------------------------

#[test]
fn wallenius_oracles() {
    let odds = |k: f64| A.map(|l: f64| l.powf(k));
    let cases: [(f64, usize, [f64; 6]); 3] = [
        (
            2.5,
            2,
            [0.996798, 0.637749, 0.246596, 0.097650, 0.018000, 0.003206],
        ),
        (
            4.0,
            3,
            [1.0, 0.999974, 0.745414, 0.236808, 0.016749, 0.001055],
        ),
        (
            4.0,
            2,
            [1.0, 0.780767, 0.178550, 0.038106, 0.002425, 0.000152],
        ),
    ];
    for (k, n, expected) in cases {
        let pi = wallenius::mean_inclusion(&odds(k), n).unwrap();
        assert_close(&pi, &expected, TABLE, &format!("Wallenius k={k} n={n}"));
        assert_scalar(pi.iter().sum(), n as f64, EXACT, "Wallenius Σπ");
        // Through PriSM with a keep ratio that selects the same exponent.
        let keep_ratio = if k == 4.0 { 0.2 } else { 0.8 };
        let m = prism::marginals(&A, n, keep_ratio).unwrap();
        assert_close(&m.inclusion_probabilities, &expected, TABLE, "PriSM π");
        assert_eq!(m.multipliers, vec![1.0; 6]);
        let w = prism::wallenius_marginals(&A, n, keep_ratio).unwrap();
        let inverse: Vec<f64> = pi.iter().map(|p| 1.0 / p).collect();
        assert_close(&w.multipliers, &inverse, 1e-9 * inverse[5], "PriSM+W ω");
    }
}

#[test]
fn prism_selection_weights_oracle() {
    let p = prism::selection_weights(&A, prism::exponent(0.1));
    assert_close(
        &p,
        &[0.932569, 0.058286, 0.007554, 0.001492, 0.000093, 0.000006],
        TABLE,
        "PriSM p, k = 4",
    );
    assert_scalar(p.iter().sum(), 1.0, EXACT, "Σp");
}

// ---- Top-n + Scaled (§1.4) ------------------------------------------------------------------

#[test]
fn scaled_oracle() {
    // λ = A, I = {1, 3} (1-based) → ω = 1.130276.
    assert_scalar(scaled::multiplier(&A, &[0, 2]), 1.130276, TABLE, "Scaled ω");
    let m = scaled::top_n_marginals(&A, 3).unwrap();
    let omega = (139.25_f64 / 134.0).sqrt();
    assert_close(
        &m.multipliers,
        &[omega, omega, omega, 0.0, 0.0, 0.0],
        EXACT,
        "Top-n+Scaled ω",
    );
    // Deterministic design: its error is Eq. 7 with C = 1 at (π, ω).
    assert_identities(&A, &m, 3, 1);
}

#[test]
fn top_n_error_is_eq7_with_one_client() {
    let m = top_n::marginals(&A, 2).unwrap();
    assert_scalar(m.expected_discrepancy.unwrap(), 14.25, EXACT, "top-n error");
    assert_identities(&A, &m, 2, 1);
}
