//! Oracles of docs/algorithms.md §1.11 for the fixed-size designs of §1.6, and the NumPy `choice`
//! algorithm of §1.5 with hand-fed uniforms. Indices in the comments are the 1-based ones of
//! docs/algorithms.md; the code is 0-based.

use fedshard_strategies::StrategyError;
use fedshard_strategies::rng::{Purpose, stream};
use fedshard_strategies::sampling::minimum_support::split;
use fedshard_strategies::sampling::{
    Brewer, ConditionalPoisson, NumpyChoice, PreparedDesign, SamplerName, Systematic, prepare,
};

/// `π = (.9 .7 .5 .4 .3 .2)`, n = 3: the §1.11 example for every design.
const PI: [f64; 6] = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2];

fn assert_close(actual: &[f64], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tol,
            "{what}[{i}]: {a} vs {e} (tol {tol})\n{actual:?}"
        );
    }
}

/// 0/1 indicator of a sorted index set.
fn indicator(set: &[usize], big_n: usize) -> Vec<u8> {
    let mut s = vec![0; big_n];
    set.iter().for_each(|&i| s[i] = 1);
    s
}

#[test]
fn cps_working_probabilities_match_r_upmepiktildefrompik() {
    let cps = ConditionalPoisson::fit(&PI).expect("feasible π");
    let expected = [
        0.86661378, 0.65737158, 0.49197806, 0.41501899, 0.33149108, 0.23752651,
    ];
    assert_close(cps.working_probabilities(), &expected, 1e-7, "p̃");
    assert_close(&cps.inclusion_probabilities(), &PI, 1e-8, "ψ(w) = π");
}

#[test]
fn cps_selection_table_matches_r_upmeqfromw() {
    let cps = ConditionalPoisson::fit(&PI).expect("feasible π");
    // Rows (z = 1, 2, 3); "–" (unreachable, z > N − i + 1) is stored as 0.
    let expected: [[f64; 3]; 6] = [
        [0.596008, 0.804240, 0.9],
        [0.435665, 0.684654, 0.838113],
        [0.389664, 0.668849, 0.865350],
        [0.467719, 0.787602, 1.0],
        [0.614162, 1.0, 0.0],
        [1.0, 0.0, 0.0],
    ];
    for (i, row) in expected.iter().enumerate() {
        assert_close(
            &cps.selection_table_row(i),
            row,
            1e-6,
            &format!("q row {}", i + 1),
        );
    }
}

#[test]
fn cps_sequential_draws_with_given_uniforms() {
    let cps = ConditionalPoisson::fit(&PI).expect("feasible π");
    let mut out = Vec::new();
    cps.draw_with(|| 0.5, &mut out);
    assert_eq!(indicator(&out, 6), [1, 1, 0, 0, 1, 0]);
    let mut u = [0.95, 0.1, 0.99, 0.2, 0.7, 0.3].into_iter();
    cps.draw_with(|| u.next().expect("one uniform per unit"), &mut out);
    assert_eq!(indicator(&out, 6), [0, 1, 0, 1, 0, 1]);
}

#[test]
fn brewer_step_probabilities() {
    let brewer = Brewer::new(&PI).expect("feasible π");
    let mut selected = [false; 6];
    let step1 = brewer.step_probabilities(&selected, 1);
    assert_close(
        &step1,
        &[0.622588, 0.176784, 0.082353, 0.057098, 0.038118, 0.023059],
        1e-6,
        "step 1",
    );
    selected[0] = true;
    let step2 = brewer.step_probabilities(&selected, 2);
    assert_close(
        &step2,
        &[0.0, 0.432917, 0.224892, 0.161749, 0.111321, 0.069121],
        1e-6,
        "step 2",
    );
}

#[test]
fn systematic_with_given_uniforms() {
    let sys = Systematic::new(&PI).expect("feasible π");
    let mut out = Vec::new();
    for (u, expected) in [
        (0.35, [1, 1, 0, 1, 0, 0]),
        (0.05, [1, 1, 1, 0, 0, 0]),
        (0.95, [0, 1, 1, 0, 0, 1]),
    ] {
        sys.draw_with_uniform(u, &mut out);
        assert_eq!(indicator(&out, 6), expected, "U = {u}");
    }
}

#[test]
fn minimum_support_first_split() {
    // D = {1, 2, 3}: α = min(1 − max(.4, .3, .2), min(.9, .7, .5)) = 0.5.
    let s = split(&PI, &[0, 1, 2]);
    assert!((s.alpha - 0.5).abs() < 1e-12, "α = {}", s.alpha);
    assert_eq!(s.selected, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
    assert_close(&s.residual, &[0.8, 0.4, 0.0, 0.8, 0.6, 0.4], 1e-12, "π_b");
}

/// §1.5 step by step with hand-fed uniforms. Dyadic `p = (1/8, 1/4, 0, 1/8, 1/2)`, n = 3, so
/// the cdf `(.125 .375 .375 .5 1)` is exact and ties are real ties.
#[test]
fn numpy_choice_redraws_duplicates_in_a_new_batch() {
    let choice = NumpyChoice::new(&[0.125, 0.25, 0.0, 0.125, 0.5], 3).expect("valid");
    // Batch 1 (m = 3): .65 → 4, .05 → 0, .7 → 4 again (duplicate, discarded).
    // Batch 2 (m = 1): p_work = (0 .25 0 .125 0), cdf = (0 2/3 2/3 1 1); .5 → 1.
    let mut u = [0.65, 0.05, 0.7, 0.5].into_iter();
    let mut found = Vec::new();
    choice.draw_with(|| u.next().expect("4 uniforms"), &mut found);
    assert_eq!(found, [4, 0, 1], "order of discovery");
    assert!(u.next().is_none(), "exactly 4 uniforms consumed");

    // side = right: x equal to a cdf value goes past it, so the zero-weight unit 2 (cdf .375
    // twice) is never returned. Batch 1: .375 → 3, .125 → 1, .375 → 3 (duplicate).
    // Batch 2: p_work = (.125 0 0 0 .5), cdf = (.2 .2 .2 .2 1): .2 → 4.
    let mut u = [0.375, 0.125, 0.375, 0.2].into_iter();
    choice.draw_with(|| u.next().expect("4 uniforms"), &mut found);
    assert_eq!(found, [3, 1, 4]);
}

#[test]
fn numpy_choice_prepared_draw_is_the_sorted_discovery_set() {
    let weights = [5.0, 1.0, 0.0, 3.0, 2.0, 8.0, 0.5];
    let choice = NumpyChoice::new(&weights, 4).expect("valid");
    for seed in 0..20 {
        let mut a = choice.draw_in_discovery_order(&mut stream(seed, 0, 0, Purpose::Sharding));
        let b = choice.draw(&mut stream(seed, 0, 0, Purpose::Sharding));
        a.sort_unstable();
        assert_eq!(a, b);
        assert!(!b.contains(&2), "zero weight drawn");
    }
    assert_close(
        choice.probabilities(),
        &weights.map(|w| w / 19.5),
        1e-15,
        "p",
    );
}

#[test]
fn numpy_choice_validation() {
    let msg = |r: Result<NumpyChoice, StrategyError>| r.unwrap_err().to_string();
    assert!(
        msg(NumpyChoice::new(&[0.5, 0.0, 0.5], 3))
            .contains("Fewer non-zero entries in p than size")
    );
    assert!(msg(NumpyChoice::new(&[0.5, 0.5], 3)).contains("larger sample than population"));
    assert!(msg(NumpyChoice::new(&[0.0, 0.0], 1)).contains("sum to 0"));
    assert!(NumpyChoice::new(&[0.5, -0.1, 0.6], 1).is_err());
    assert!(NumpyChoice::new(&[0.5, f64::NAN], 1).is_err());
    assert!(NumpyChoice::new(&[0.5, 0.5], 0).is_err());
    assert!(
        prepare(SamplerName::NumpyChoice, &[1.0, 2.0], None).is_err(),
        "n is required"
    );
}

#[test]
fn prepare_validation_errors() {
    let err = prepare(SamplerName::ConditionalPoisson, &[0.5, 0.6, 0.7], None).unwrap_err();
    assert!(err.to_string().contains("Σπ = 1.8"), "{err}");
    let err = prepare(SamplerName::Brewer, &PI, Some(2)).unwrap_err();
    assert!(err.to_string().contains("n = 2"), "{err}");
    assert!(prepare(SamplerName::Systematic, &[0.5, 1.2, 0.3], None).is_err());
    assert!(prepare(SamplerName::MinimumSupport, &[0.5, f64::INFINITY], None).is_err());
    assert!(prepare(SamplerName::ConditionalPoisson, &PI, Some(3)).is_ok());
}

/// π = (1, 1/3, 1/3, 1/3): after removing the certainty unit n' = 1, where R's UPmaxentropy
/// fails with "subscript out of bounds".
#[test]
fn n_prime_one_after_certainty_units() {
    let third = 1.0 / 3.0;
    for name in &SamplerName::ALL[..4] {
        let design = prepare(*name, &[1.0, third, third, third], Some(2)).expect("feasible");
        let mut rng = stream(9, 0, 0, Purpose::Sharding);
        let s = design.draw(&mut rng);
        assert_eq!(s.len(), 2, "{name}");
        assert_eq!(s[0], 0, "{name}: certainty unit");
    }
}
