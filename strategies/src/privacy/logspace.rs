//! Arithmetic on logarithms of magnitudes, so that the moments of the accountant (which reach
//! `e^{α²/σ²}`) neither overflow nor lose their small terms.

/// `log(eˣ + eʸ)`.
pub(crate) fn log_add(x: f64, y: f64) -> f64 {
    let (hi, lo) = if x >= y { (x, y) } else { (y, x) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// `a − b` for numbers held as (sign is positive, log of the magnitude).
pub(crate) fn signed_sub(a: (bool, f64), b: (bool, f64)) -> (bool, f64) {
    let ((sa, la), (sb, lb)) = (a, b);
    if sa != sb {
        return (sa, log_add(la, lb));
    }
    // Same sign: the magnitude is | |a| − |b| |, the sign flips when |b| > |a|.
    if la > lb {
        (sa, la + (-(lb - la).exp()).ln_1p())
    } else if la < lb {
        (!sa, lb + (-(la - lb).exp()).ln_1p())
    } else {
        (true, f64::NEG_INFINITY)
    }
}

/// `log |C(n, k)|` for real `n` and integer-valued `k ≥ 0`, as the running product
/// `C(n, k) = Π_{i=1}^{k} (n − i + 1)/i` (no gamma function needed; exact to rounding).
pub(crate) fn log_binomial(n: f64, k: f64) -> f64 {
    let k = k as u64;
    (1..=k)
        .map(|i| {
            let i = i as f64;
            (n - i + 1.0).abs().ln() - i.ln()
        })
        .sum()
}

/// `log erfc(x)`, accurate where `erfc` underflows (`x ≳ 26`) through its asymptotic series
/// `erfc(x) ∼ e^{−x² − ½x⁻² + ⅝x⁻⁴ − 37/24 x⁻⁶ + 353/64 x⁻⁸} / (x√π)`.
pub(crate) fn log_erfc(x: f64) -> f64 {
    let r = statrs::function::erf::erfc(x);
    if r > 0.0 {
        return r.ln();
    }
    let x2 = x * x;
    -0.5 * std::f64::consts::PI.ln() - x.ln() - x2 - 0.5 / x2 + 0.625 / (x2 * x2)
        - 37.0 / 24.0 / (x2 * x2 * x2)
        + 353.0 / 64.0 / (x2 * x2 * x2 * x2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_binomial_matches_small_integers_and_real_orders() {
        // C(10, 3) = 120; C(2.5, 3) = 2.5·1.5·0.5/6 = 0.3125; C(2.5, 4) = −0.0390625.
        assert!((log_binomial(10.0, 3.0) - 120f64.ln()).abs() < 1e-12);
        assert!((log_binomial(2.5, 3.0) - 0.3125f64.ln()).abs() < 1e-12);
        assert!((log_binomial(2.5, 4.0) - 0.0390625f64.ln()).abs() < 1e-12);
        assert_eq!(log_binomial(7.0, 0.0), 0.0);
    }

    #[test]
    fn log_erfc_is_continuous_where_erfc_underflows() {
        // erfc(1) = 0.157299207050285… (Abramowitz & Stegun, Table 7.1).
        assert!((log_erfc(1.0) - 0.157_299_207_050_285_f64.ln()).abs() < 1e-9);
        // Around x = 26.5 erfc(x) underflows; the series must join it smoothly.
        let (a, b) = (log_erfc(26.0), log_erfc(27.0));
        assert!(a.is_finite() && b.is_finite() && b < a);
        // erfc(26) ≈ 1e-296 is still a normal double: the series must agree with it to the
        // size of its first omitted term, 37/24 x⁻⁶ ≈ 5e-9.
        let x2 = 26.0 * 26.0;
        let series =
            -0.5 * std::f64::consts::PI.ln() - 26f64.ln() - x2 - 0.5 / x2 + 0.625 / (x2 * x2);
        assert!((a - series).abs() < 1e-8, "{a} vs {series}");
    }

    #[test]
    fn signed_subtraction_keeps_signs() {
        let (s, l) = signed_sub((true, 3f64.ln()), (true, 5f64.ln()));
        assert!(!s && (l - 2f64.ln()).abs() < 1e-12);
        let (s, l) = signed_sub((false, 3f64.ln()), (true, 5f64.ln()));
        assert!(!s && (l - 8f64.ln()).abs() < 1e-12);
    }
}
