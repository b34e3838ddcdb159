//! FESC and generic water-filling against the oracles of docs/algorithms.md §3.4 and the KKT
//! conditions of Proposition 3.4 (§3.1).
//!
//! Tolerances: the printed oracles are rounded, so each is checked to half a unit of its last
//! printed digit (plus 1e-12); the exact closed form `ν_K = (2 + Σ_{j≤K} 1/n_(j)) / Σ_{j≤K} n_(j)`
//! (§3.2) with the `K` the table states is checked to 1e-12.

use fedshard_strategies::aggregation::{
    Contribution, Fesc, FescOracle, RoundOutcome, Weighting, validate_weights,
};
use fedshard_strategies::fesc::{fesc_weights, water_filling};
use proptest::prelude::*;

/// Half a unit of the last printed digit of a value printed with `decimals` decimals.
fn printed(decimals: i32) -> f64 {
    0.5 * 10f64.powi(-decimals) + 1e-12
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "entry {i}: got {g}, want {w} ± {tol}");
    }
}

#[test]
fn oracle_fibonacci_like_sizes() {
    // §3.4: n = (1,2,3,5,8,13,40,100) -> K = 3, ν = 0.01380342, w = (0,…,0,.051261,.263568,.685171).
    let r = fesc_weights(&[1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 40.0, 100.0]).unwrap();
    assert_eq!(r.active, 3);
    let exact_nu = (2.0 + 1.0 / 100.0 + 1.0 / 40.0 + 1.0 / 13.0) / 153.0;
    assert!((r.nu - exact_nu).abs() < 1e-12);
    assert!((r.nu - 0.01380342).abs() <= printed(8));
    assert_close(
        &r.weights,
        &[0.0, 0.0, 0.0, 0.0, 0.0, 0.051261, 0.263568, 0.685171],
        printed(6),
    );
}

#[test]
fn oracle_unsorted_sizes() {
    // §3.4: n = (4,9,2,30,7,1) -> K = 3, ν = 0.04972395, w = (0,.16820221,0,.72919255,.10260524,0).
    let r = fesc_weights(&[4.0, 9.0, 2.0, 30.0, 7.0, 1.0]).unwrap();
    assert_eq!(r.active, 3);
    let exact_nu = (2.0 + 1.0 / 30.0 + 1.0 / 9.0 + 1.0 / 7.0) / 46.0;
    assert!((r.nu - exact_nu).abs() < 1e-12);
    assert!((r.nu - 0.04972395).abs() <= printed(8));
    // w_(i) = n_(i) ν / 2 − 1/(2 n_(i)) exactly (§3.2).
    let exact = |n: f64| n * exact_nu / 2.0 - 1.0 / (2.0 * n);
    assert_close(
        &r.weights,
        &[0.0, exact(9.0), 0.0, exact(30.0), exact(7.0), 0.0],
        1e-12,
    );
    assert_close(
        &r.weights,
        &[0.0, 0.16820221, 0.0, 0.72919255, 0.10260524, 0.0],
        printed(8),
    );
}

#[test]
fn oracle_equal_and_dominant_sizes() {
    let r = fesc_weights(&[10.0; 4]).unwrap();
    assert_close(&r.weights, &[0.25; 4], 1e-12);
    assert_eq!(r.active, 4);
    // n = (1,1,1,1000) -> w = (0,0,0,1), ν = (2 + 1/1000)/1000 = 0.002001 exactly.
    let r = fesc_weights(&[1.0, 1.0, 1.0, 1000.0]).unwrap();
    assert_close(&r.weights, &[0.0, 0.0, 0.0, 1.0], 1e-12);
    assert!((r.nu - 0.002001).abs() < 1e-12);
    assert_eq!(r.active, 1);
}

#[test]
fn oracle_generic_water_filling() {
    // §3.4: a = (.5,1,2,.25), b = (.3,.1,.05,.9) -> K = 3, ν = 0.77857143 (= 109/140 exactly:
    // (2 + .6 + .1 + .025) / 3.5), w = (.47857143, .33928571, .18214286, 0).
    let r = water_filling(&[0.5, 1.0, 2.0, 0.25], &[0.3, 0.1, 0.05, 0.9]).unwrap();
    assert_eq!(r.active, 3);
    assert!((r.nu - 109.0 / 140.0).abs() < 1e-12);
    assert!((r.nu - 0.77857143).abs() <= printed(8));
    let nu = 109.0 / 140.0;
    assert_close(
        &r.weights,
        &[(nu - 0.3) / 1.0, (nu - 0.1) / 2.0, (nu - 0.05) / 4.0, 0.0],
        1e-12,
    );
    assert_close(
        &r.weights,
        &[0.47857143, 0.33928571, 0.18214286, 0.0],
        printed(8),
    );
}

#[test]
fn aggregators_use_results_order() {
    let results: Vec<Contribution> = [4.0, 9.0, 2.0, 30.0, 7.0, 1.0]
        .iter()
        .enumerate()
        .map(|(i, &n)| Contribution {
            client: i as u64,
            samples: n,
            inclusion_probability: 1.0,
        })
        .collect();
    let round = RoundOutcome {
        results: &results,
        failures: &[],
        population_samples: 53.0,
    };
    let w = Fesc.weights(&round).unwrap();
    assert_close(
        &w,
        &[0.0, 0.16820221, 0.0, 0.72919255, 0.10260524, 0.0],
        printed(8),
    );
    let oracle = FescOracle {
        a: vec![0.5, 1.0, 2.0, 0.25, 1.0, 1.0],
        b: vec![0.3, 0.1, 0.05, 0.9, 5.0, 5.0],
    };
    let w = oracle.weights(&round).unwrap();
    assert_close(
        &w,
        &[0.47857143, 0.33928571, 0.18214286, 0.0, 0.0, 0.0],
        printed(8),
    );
    let short = FescOracle {
        a: vec![1.0],
        b: vec![0.0],
    };
    assert!(short.weights(&round).is_err());
}

fn objective(a: &[f64], b: &[f64], w: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .zip(w)
        .map(|((a, b), w)| a * w * w + b * w)
        .sum()
}

proptest! {
    /// Proposition 3.4: Σw = 1, w ≥ 0, the KKT conditions, and no random point of the simplex
    /// does better.
    #[test]
    fn water_filling_is_optimal(
        ab in prop::collection::vec((0.01f64..10.0, 0.0f64..10.0), 1..40),
        raw in prop::collection::vec(0.0f64..1.0, 40),
    ) {
        let (a, b): (Vec<f64>, Vec<f64>) = ab.into_iter().unzip();
        let r = water_filling(&a, &b).unwrap();
        let w = &r.weights;
        prop_assert!(validate_weights(w, a.len(), true).is_ok());
        prop_assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        prop_assert_eq!(w.iter().filter(|&&x| x > 0.0).count(), r.active);
        let scale = r.nu.abs().max(1.0);
        for i in 0..a.len() {
            prop_assert!(w[i] >= 0.0);
            if w[i] > 0.0 {
                prop_assert!((2.0 * a[i] * w[i] + b[i] - r.nu).abs() <= 1e-12 * scale);
            } else {
                prop_assert!(b[i] >= r.nu - 1e-12 * scale);
            }
        }
        let total: f64 = raw[..a.len()].iter().sum::<f64>() + 1e-9;
        let other: Vec<f64> = raw[..a.len()].iter().map(|x| (x + 1e-9 / a.len() as f64) / total).collect();
        prop_assert!(objective(&a, &b, w) <= objective(&a, &b, &other) + 1e-12 * scale);
    }

    /// §3.2: the active nodes are exactly the K largest ones, weights sum to 1 and increase
    /// with n, and the KKT conditions hold with a = 1/n, b = 1/n².
    #[test]
    fn fesc_selects_the_largest_nodes(sizes in prop::collection::vec(1u32..5000, 1..60)) {
        let n: Vec<f64> = sizes.iter().map(|&s| f64::from(s)).collect();
        let r = fesc_weights(&n).unwrap();
        prop_assert!(validate_weights(&r.weights, n.len(), true).is_ok());
        let active: Vec<usize> = (0..n.len()).filter(|&i| r.weights[i] > 0.0).collect();
        prop_assert_eq!(active.len(), r.active);
        let smallest_active = active.iter().map(|&i| n[i]).fold(f64::INFINITY, f64::min);
        let largest_inactive = (0..n.len())
            .filter(|&i| r.weights[i] == 0.0)
            .map(|i| n[i])
            .fold(0.0, f64::max);
        prop_assert!(smallest_active >= largest_inactive);
        for i in 0..n.len() {
            for j in 0..n.len() {
                if n[i] < n[j] {
                    prop_assert!(r.weights[i] <= r.weights[j]);
                }
            }
            if r.weights[i] > 0.0 {
                let kkt = 2.0 * r.weights[i] / n[i] + 1.0 / (n[i] * n[i]);
                prop_assert!((kkt - r.nu).abs() <= 1e-12 * r.nu.max(1.0));
            } else {
                prop_assert!(1.0 / (n[i] * n[i]) >= r.nu * (1.0 - 1e-12));
            }
        }
    }
}
