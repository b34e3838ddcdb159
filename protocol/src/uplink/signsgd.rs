//! SignSGD's client distribution `q_j(+1) = σ(v_j / M)` (docs/algorithms.md §4.8) under each
//! temperature rule of `[compression] temperature`.
//!
//! The temperature sets both the bits and the step. KLMS codes a value's sign against the fair
//! coin in about `KL(σ(v/M) ‖ ½)` bits, `(v/M)² / (8 ln 2)` for `|v| ≪ M`, while the mean decoded
//! sign is `tanh(v / 2M) ≈ v / 2M`. The reference's `M = max |v| / 20` over groups of 8 makes
//! `q` nearly deterministic (about 0.7 bits a value, so KLMS saves little); `M = c · rms(v)`
//! over the whole update spends about `1 / (8 c² ln 2)` bits a value (0.045 at `c = 2`) and
//! moves the model by `η_S v / (2M)` on average, so `η_S` must grow with `c`.

use super::Temperature;

/// `q` as `[P(−1), 0, P(+1)]` rows of the update `v` under `rule`; `group` is the group size of
/// [`Temperature::Group`], `scale` the `c` of [`Temperature::Rms`].
pub fn sign_probabilities(
    v: &[f64],
    rule: Temperature,
    group: usize,
    scale: f64,
) -> Result<Vec<[f64; 3]>, String> {
    /// The reference's divisor: arguments of σ stay in `[−20, 20]`.
    const SIGN_RANGE: f64 = 20.0;
    let max_abs = |v: &[f64]| v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let rms = || (v.iter().map(|x| x * x).sum::<f64>() / v.len().max(1) as f64).sqrt();
    let group = match rule {
        Temperature::Group => group.max(1),
        Temperature::Vector | Temperature::Rms => v.len().max(1),
    };
    let mut q = Vec::with_capacity(v.len());
    for chunk in v.chunks(group) {
        let temperature = match rule {
            Temperature::Group | Temperature::Vector => max_abs(chunk) / SIGN_RANGE,
            Temperature::Rms => scale * rms(),
        }
        .max(1e-15);
        if !temperature.is_finite() {
            return Err("SignSGD: the update is not finite".into());
        }
        for &x in chunk {
            let plus = 1.0 / (1.0 + (-x / temperature).exp());
            q.push([1.0 - plus, 0.0, plus]);
        }
    }
    Ok(q)
}
