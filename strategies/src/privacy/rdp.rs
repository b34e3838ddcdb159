//! Rényi differential privacy of one release of the Gaussian mechanism on a subsample: the
//! RDP `ε(α)` at order `α` of the three ways a fedshard round can pick its clients
//! (docs/algorithms.md §6.3–6.5). Noise multipliers are the standard deviation of the noise over
//! the query's ℓ₂ sensitivity under the relation the sampling is analysed for; every value is an
//! upper bound on the true RDP, and `f64::INFINITY` stands for "no bound at this order".

use super::logspace::{log_add, log_binomial, log_erfc, signed_sub};

/// RDP of the Gaussian mechanism with noise multiplier `sigma`, every record in every release:
/// `ε(α) = α / (2σ²)` (Mironov 2017, Table II; docs/algorithms.md §6.3).
pub fn gaussian(sigma: f64, alpha: f64) -> f64 {
    if sigma <= 0.0 {
        return f64::INFINITY;
    }
    alpha / (2.0 * sigma * sigma)
}

/// RDP of the Poisson-subsampled Gaussian mechanism, each record included independently with
/// probability `q`, under the add-or-remove-one relation: `ε(α) = log(A_α) / (α − 1)` with
/// `A_α` of Mironov, Talwar and Zhang (2019), Sec. 3.3 (docs/algorithms.md §6.4): the exact
/// binomial sum for integer `α` (`log_a_integer`) and the two erfc series for fractional `α`
/// (`log_a_fractional`).
pub fn poisson_subsampled_gaussian(q: f64, sigma: f64, alpha: f64) -> f64 {
    if let Some(rdp) = degenerate(q, sigma, alpha) {
        return rdp;
    }
    let log_a = if alpha.fract() == 0.0 {
        log_a_integer(q, sigma, alpha as u64)
    } else {
        log_a_fractional(q, sigma, alpha)
    };
    log_a / (alpha - 1.0)
}

/// The RDP where a sampled mechanism has no sampling to speak of: nobody sampled (0), no noise
/// or an infinite order (no bound), everybody sampled (the plain Gaussian).
fn degenerate(rate: f64, sigma: f64, alpha: f64) -> Option<f64> {
    if rate <= 0.0 {
        Some(0.0)
    } else if sigma <= 0.0 || alpha.is_infinite() {
        Some(f64::INFINITY)
    } else if rate >= 1.0 {
        Some(gaussian(sigma, alpha))
    } else {
        None
    }
}

/// `log A_α` for integer `α` (Mironov, Talwar, Zhang 2019, Sec. 3.3, the binomial expansion of
/// `E_{z∼μ0}[(μ(z)/μ0(z))^α]` with `μ = (1 − q)μ0 + qμ1`):
/// `A_α = Σ_{i=0}^{α} C(α, i) (1 − q)^{α−i} q^i exp((i² − i) / (2σ²))`. Exact.
fn log_a_integer(q: f64, sigma: f64, alpha: u64) -> f64 {
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    (0..=alpha)
        .map(|i| {
            let i_f = i as f64;
            log_binomial(alpha as f64, i_f)
                + i_f * log_q
                + (alpha - i) as f64 * log_1mq
                + (i_f * i_f - i_f) / (2.0 * sigma * sigma)
        })
        .fold(f64::NEG_INFINITY, log_add)
}

/// The most terms of the fractional-order series before it is given up (and the order
/// skipped): dp-accounting's limit.
const MAX_FRACTIONAL_TERMS: usize = 1000;

/// `log A_α` for fractional `α` (Mironov, Talwar, Zhang 2019, Sec. 3.3): the integral split at
/// `z₀ = σ² log(1/q − 1) + ½` into `A_α = Σ_i C(α, i) [q^i (1 − q)^{α−i} e^{(i²−i)/(2σ²)}
/// ½ erfc((i − z₀)/(√2σ)) + q^{α−i} (1 − q)^i e^{((α−i)²−(α−i))/(2σ²)} ½ erfc((z₀ − (α −
/// i))/(√2σ))]`. For `i > α` the binomial coefficients alternate in sign; their magnitudes are
/// summed, as dp-accounting 0.6 does, which bounds `A_α` from above. The series stops once both
/// halves' terms are decreasing and below `e⁻³⁰` of the total; `∞` if it has not by
/// [`MAX_FRACTIONAL_TERMS`].
fn log_a_fractional(q: f64, sigma: f64, alpha: f64) -> f64 {
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let z0 = sigma * sigma * (1.0 / q - 1.0).ln() + 0.5;
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    let scale = std::f64::consts::SQRT_2 * sigma;
    let (mut last0, mut last1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for i in 0..MAX_FRACTIONAL_TERMS {
        let i = i as f64;
        let j = alpha - i;
        let log_coef = log_binomial(alpha, i);
        let log_t0 = log_coef + i * log_q + j * log_1mq;
        let log_t1 = log_coef + j * log_q + i * log_1mq;
        let log_e0 = 0.5f64.ln() + log_erfc((i - z0) / scale);
        let log_e1 = 0.5f64.ln() + log_erfc((z0 - j) / scale);
        let log_s0 = log_t0 + (i * i - i) / (2.0 * sigma * sigma) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * sigma * sigma) + log_e1;
        log_a0 = log_add(log_a0, log_s0);
        log_a1 = log_add(log_a1, log_s1);
        let total = log_add(log_a0, log_a1);
        if log_s0 < last0 && log_s1 < last1 && log_s0.max(log_s1) < total - 30.0 {
            return total;
        }
        (last0, last1) = (log_s0, log_s1);
    }
    f64::INFINITY
}

/// Above this order the sampling-without-replacement bound drops its forward-difference term,
/// whose cost grows as `α²` (dp-accounting's cut-off too).
const MAX_FORWARD_DIFFERENCE_ORDER: u64 = 256;

/// RDP of the Gaussian mechanism on a uniformly random subset of fixed size `m = γn` of `n`
/// records (sampling without replacement), under the **replace-one (substitution) relation**:
/// neighbouring populations have the same size and differ in one record, and `sigma` is the
/// noise over the sensitivity under substitution. Wang, Balle and Kasiviswanathan (2019),
/// the bound of arXiv:1808.00087, Theorem 27 (as dp-accounting cites it), with the Gaussian's
/// `ε(∞) = ∞` (docs/algorithms.md §6.5):
///
/// `ε(α) ≤ 1/(α−1) log(1 + γ² C(α,2) min{4(e^{ε(2)} − 1), 2e^{ε(2)}}
///        + Σ_{j=3}^{α} γ^j C(α,j) min{4 √(Δ^{2⌊j/2⌋} · Δ^{2⌈j/2⌉}), 2 e^{(j−1)ε(j)}})`
///
/// with `ε(j) = j/(2σ²)` and `Δ^ℓ` the ℓ-th forward difference at 0 of `h(x) = e^{(x−1)ε(x)}`
/// (only for `α ≤ 256`; above, the `2e^{(j−1)ε(j)}` term alone, which is the same theorem's
/// looser bound). Fractional orders interpolate the integer ones through the convexity of
/// `(α − 1)ε(α)` (their Corollary 10).
pub fn without_replacement_gaussian(gamma: f64, sigma: f64, alpha: f64) -> f64 {
    if let Some(rdp) = degenerate(gamma, sigma, alpha) {
        return rdp;
    }
    if alpha.fract() == 0.0 {
        return wor_log_moment(gamma, sigma, alpha as u64) / (alpha - 1.0);
    }
    let (low, high) = (alpha.floor(), alpha.ceil());
    let t = alpha - low;
    let x = wor_log_moment(gamma, sigma, low as u64);
    let y = wor_log_moment(gamma, sigma, high as u64);
    ((1.0 - t) * x + t * y) / (alpha - 1.0)
}

/// `(α − 1) ε(α)` of [`without_replacement_gaussian`] for integer `α` (0 at `α = 1`).
fn wor_log_moment(gamma: f64, sigma: f64, alpha: u64) -> f64 {
    if alpha <= 1 {
        return 0.0;
    }
    let two_var = 2.0 * sigma * sigma;
    // (x − 1)·ε(x) at x = k + 1, the log of h(k + 1).
    let cgf = |k: f64| k * (k + 1.0) / two_var;
    let eps2 = 2.0 / two_var;
    let log_gamma = gamma.ln();
    let second = (4f64.ln() + eps2 + (-(-eps2).exp()).ln_1p()).min(eps2 + 2f64.ln());
    let mut log_a = log_add(
        0.0,
        2.0 * log_gamma + log_binomial(alpha as f64, 2.0) + second,
    );
    let deltas = (alpha <= MAX_FORWARD_DIFFERENCE_ORDER).then(|| forward_differences(cgf, alpha));
    for j in 3..=alpha {
        let simple = 2f64.ln() + cgf((j - 1) as f64);
        let term = match &deltas {
            Some(d) => {
                let low = d[(2 * (j / 2) - 1) as usize];
                let high = d[(2 * j.div_ceil(2) - 1) as usize];
                (4f64.ln() + 0.5 * (low + high)).min(simple)
            }
            None => simple,
        };
        let j_f = j as f64;
        log_a = log_add(
            log_a,
            term + j_f * log_gamma + log_binomial(alpha as f64, j_f),
        );
    }
    log_a
}

/// `log |Δ^{k+1} h(0)|` for `k = 0 ..= n + 1`, where `h(m) = exp(log_h(m − 1))`, computed by
/// differencing in log-magnitude and sign so that nothing overflows.
fn forward_differences(log_h: impl Fn(f64) -> f64, n: u64) -> Vec<f64> {
    let len = (n + 3) as usize;
    let mut values: Vec<(bool, f64)> = (0..len).map(|m| (true, log_h(m as f64 - 1.0))).collect();
    let mut deltas = Vec::with_capacity(len - 1);
    for i in 0..len - 1 {
        for j in 0..len - 1 - i {
            values[j] = signed_sub(values[j + 1], values[j]);
        }
        deltas.push(values[0].1);
    }
    deltas
}
