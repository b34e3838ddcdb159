//! QSGD-KLMS's global distribution `p` (docs/algorithms.md §4.7) from side information both ends
//! really have.
//!
//! The paper's `p` is the previous round's per-value frequency of the decoded symbols. With
//! `C = 10` clients a count is a multiple of 1/10, while a client's `q_j(±1) = |v_j| / ‖v‖` is
//! about `1/√d`; any smoothing of the counts towards uniform (`(n + 1)/(C + 3)`) floors
//! `p(±1)` at 1/13, and a block's KL is then spent on zeros (about 0.24 bits a value). Here a
//! count is smoothed towards its tensor's symbol frequency `f_t` in that round instead:
//!
//! `p_j(s) = (n_j(s) + β f_t(s)) / (n_j + β)`, `f_t(s) = (N_t(s) + 1) / (N_t + 3)`,
//!
//! with `N_t(s)` the number of decoded `s` in tensor `t` (over its values and the clients) and
//! `n_j = Σ_s n_j(s)` (the clients that held value `j`; `p_j = f_t` where none did). Both come from
//! last round's decoded symbols, which the server holds and broadcasts: nothing is sent for
//! them. Before any round decoded a symbol, the client sends its own tensor means of `q`,
//! `(mean_j q_j(−1), mean_j q_j(+1))` as two f32 per tensor, counted in its bits, and both ends use
//! `p_j = (m₋, 1 − m₋ − m₊, m₊)`. The reference code does this every round without counting
//! the floats (docs/algorithms.md §4.12).

use std::ops::Range;

/// Each tensor's symbol frequency from per-value counts in the global layout, Laplace-smoothed
/// at the tensor level: `(N_t(s) + 1) / (N_t + 3)`.
pub fn tensor_frequencies(counts: &[[u16; 3]], tensors: &[Range<usize>]) -> Vec<[f64; 3]> {
    tensors
        .iter()
        .map(|range| {
            let mut n = [0.0f64; 3];
            for c in counts.get(range.clone()).unwrap_or_default() {
                for (total, &x) in n.iter_mut().zip(c) {
                    *total += f64::from(x);
                }
            }
            let total = n.iter().sum::<f64>() + 3.0;
            n.map(|x| (x + 1.0) / total)
        })
        .collect()
}

/// `p` over a message of `len` values whose tensors have the lengths `tensors`:
/// `(n_j(s) + β f_t(s)) / (n_j + β)` with `counts`, `f_t` alone without. Every `means` row must
/// be a distribution (it may come over the wire).
pub fn global_distribution(
    tensors: &[usize],
    means: &[[f64; 3]],
    counts: Option<&[[u16; 3]]>,
    weight: f64,
    len: usize,
) -> Result<Vec<[f64; 3]>, String> {
    if tensors.len() != means.len() {
        return Err(format!(
            "QSGD prior: {} tensor frequencies for {} tensors",
            means.len(),
            tensors.len()
        ));
    }
    if tensors.iter().sum::<usize>() != len {
        return Err(format!(
            "QSGD prior: tensors of {} values for a message of {len}",
            tensors.iter().sum::<usize>()
        ));
    }
    if let Some(c) = counts
        && c.len() != len
    {
        return Err(format!(
            "QSGD prior: {} counts for a message of {len}",
            c.len()
        ));
    }
    if !(weight > 0.0 && weight.is_finite()) {
        return Err(format!("QSGD prior: weight β = {weight}"));
    }
    for (t, row) in means.iter().enumerate() {
        let sum: f64 = row.iter().sum();
        if row.iter().any(|x| !(0.0..=1.0).contains(x)) || (sum - 1.0).abs() > 1e-9 {
            return Err(format!(
                "QSGD prior: tensor {t} frequencies {row:?} are not a distribution"
            ));
        }
    }
    let mut p = Vec::with_capacity(len);
    let mut at = 0;
    for (&size, f) in tensors.iter().zip(means) {
        for j in at..at + size {
            p.push(match counts {
                Some(c) => {
                    let n = c[j].map(f64::from);
                    let total = n.iter().sum::<f64>() + weight;
                    [0, 1, 2].map(|s| (n[s] + weight * f[s]) / total)
                }
                None => *f,
            });
        }
        at += size;
    }
    Ok(p)
}

/// The client's tensor means of `q`, `(m₋, m₊)` per tensor, as the f32 it sends; a positive
/// mean never rounds to zero (then `p` would miss a symbol `q` can draw).
pub fn own_tensor_means(q: &[[f64; 3]], tensors: &[usize]) -> Vec<[f32; 2]> {
    let up = |x: f64| match x as f32 {
        0.0 if x > 0.0 => f32::MIN_POSITIVE,
        f => f,
    };
    let mut at = 0;
    tensors
        .iter()
        .map(|&size| {
            let rows = q.get(at..at + size).unwrap_or_default();
            at += size;
            let n = rows.len().max(1) as f64;
            let minus = rows.iter().map(|r| r[0]).sum::<f64>() / n;
            let plus = rows.iter().map(|r| r[2]).sum::<f64>() / n;
            [up(minus), up(plus)]
        })
        .collect()
}

/// Tensor means as read from a payload, checked (`m₋, m₊ ≥ 0`, `m₋ + m₊ ≤ 1` up to f32
/// rounding), as distributions `(m₋, 1 − m₋ − m₊, m₊)`.
pub fn means_from_wire(means: &[[f32; 2]]) -> Result<Vec<[f64; 3]>, String> {
    means
        .iter()
        .enumerate()
        .map(|(t, &[minus, plus])| {
            let (minus, plus) = (f64::from(minus), f64::from(plus));
            let zero = 1.0 - minus - plus;
            if !(minus >= 0.0 && plus >= 0.0 && zero > -1e-6) {
                return Err(format!(
                    "QSGD tensor {t} means ({minus}, {plus}) are not probabilities"
                ));
            }
            if zero < 0.0 {
                let sum = minus + plus;
                return Ok([minus / sum, 0.0, plus / sum]);
            }
            Ok([minus, zero, plus])
        })
        .collect()
}

/// QSGD's bits as the KLMS paper counts them for its baselines: not a code's length but the bound of
/// the QSGD paper (Alistarh et al. 2017, Theorem 3.2) on the expected length of its Elias code
/// for one vector of `values` values at `levels` levels,
/// `(3 + 1.5 log₂(2(s² + n) / (s(s + √n)))) · s(s + √n) + 32`, which assumes `s(s + √n)`
/// non-zero symbols. The reference code (FrancescoPase/Federated-KLMS,
/// `compressors/qsgd.py`) reports this formula per tensor as QSGD's bitrate, and the paper's
/// "×10 lower than QSGD" is against it. An update whose non-zeros are far fewer than `√n` (as
/// QSGD with one level on a softmax regression's update is) takes far fewer bits in the real
/// code (`qsgd-elias`), so both figures are reported.
pub fn reference_bound_bits(values: usize, levels: u32) -> f64 {
    let (n, s) = (values as f64, f64::from(levels));
    let nonzeros = s * (s + n.sqrt());
    (3.0 + 1.5 * (2.0 * (s * s + n) / nonzeros).log2()) * nonzeros + 32.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_bound_is_the_qsgd_papers_formula() {
        // By hand for the MNIST softmax update (n = 7 850, s = 1): s(s + √n) = 89.600,
        // 2(1 + 7 850)/89.600 = 175.25, log₂ = 7.4533, (3 + 11.180) · 89.600 + 32 = 1 302.5.
        let bits = reference_bound_bits(7850, 1);
        assert!((bits - 1302.517).abs() < 1e-2, "{bits}");
        // n = 100, s = 2: s(s + √n) = 24, 2(4 + 100)/24 = 8.6667, log₂ = 3.1155,
        // (3 + 4.6732) · 24 + 32 = 216.16.
        let bits = reference_bound_bits(100, 2);
        assert!((bits - 216.157).abs() < 1e-2, "{bits}");
    }
}
