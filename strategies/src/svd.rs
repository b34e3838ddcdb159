//! The server's factorisation of a layer (docs/algorithms.md §1.1 step 1, §1.8): thin SVD of the
//! weight matrix with the singular values re-absorbed symmetrically into both factors,
//! `W = Σ_k u'_k v'_kᵀ` with `u'_k = √λ_k u_k`, `v'_k = √λ_k v_k`, and the (sub-)products a
//! client trains, `Ŵ = Σ_j ω_j u'_{I_j} v'_{I_j}ᵀ`.
//!
//! Generic over `f32` and `f64` through [`SvdScalar`]; all matrices are row-major slices so the
//! callers (tensors of any backend) only need a flat buffer.

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, MatMut, MatRef, Par};

use crate::{Result, StrategyError};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A real floating-point type faer can decompose: `f32` or `f64`.
///
/// The square roots of the singular values are taken in `f64` and converted back, so both
/// precisions share one code path.
pub trait SvdScalar: faer::traits::RealField + Copy + sealed::Sealed {
    /// Widens to `f64` (exact).
    fn to_f64(self) -> f64;
    /// Narrows from `f64` (rounds to nearest for `f32`).
    fn from_f64(value: f64) -> Self;
}

impl SvdScalar for f32 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(value: f64) -> Self {
        value as f32
    }
}

impl SvdScalar for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(value: f64) -> Self {
        value
    }
}

/// A layer's weight matrix in the sharded form `W = Σ_{k<N} u'_k v'_kᵀ` (docs/algorithms.md §1.1).
#[derive(Debug, Clone, PartialEq)]
pub struct Factors<T> {
    /// Rows of `W` (`c_out`).
    pub rows: usize,
    /// Columns of `W` (`c_in`, or `c_in·kh·kw` for a convolution, see [`conv_matrix_shape`]).
    pub cols: usize,
    /// `λ_1 ≥ … ≥ λ_N ≥ 0`, `N = min(rows, cols)`.
    pub singular_values: Vec<T>,
    /// `N × rows`, row-major: row k is `u'_k = √λ_k u_k`.
    pub left: Vec<T>,
    /// `N × cols`, row-major: row k is `v'_k = √λ_k v_k`.
    pub right: Vec<T>,
}

impl<T> Factors<T> {
    /// Number of terms `N = min(rows, cols)`.
    pub fn terms(&self) -> usize {
        self.singular_values.len()
    }
}

/// Thin SVD of the row-major `rows × cols` matrix `weights`, with `√λ_k` absorbed into both
/// singular vectors (docs/algorithms.md §1.1 step 1): the symmetric split makes `u'_k` and `v'_k`
/// equally scaled, so a client's SGD step treats both factors alike.
///
/// Errors if the shape is empty, `weights.len() ≠ rows·cols`, a weight is not finite, or faer's
/// SVD does not converge.
pub fn factorize<T: SvdScalar>(weights: &[T], rows: usize, cols: usize) -> Result<Factors<T>> {
    if rows == 0 || cols == 0 {
        return Err(StrategyError::invalid(
            "matrix shape",
            format!("{rows} × {cols}: a weight matrix needs at least one row and one column"),
        ));
    }
    let expected = rows.checked_mul(cols).ok_or_else(|| {
        StrategyError::invalid("matrix shape", format!("{rows} × {cols} overflows usize"))
    })?;
    if weights.len() != expected {
        return Err(StrategyError::invalid(
            "weights",
            format!(
                "{} values for a {rows} × {cols} matrix (expected {expected}, row-major)",
                weights.len()
            ),
        ));
    }
    if let Some(position) = weights.iter().position(|w| !w.to_f64().is_finite()) {
        return Err(StrategyError::invalid(
            "weights",
            format!(
                "value at row {}, column {} is {}; weights must be finite",
                position / cols,
                position % cols,
                weights[position].to_f64()
            ),
        ));
    }
    let matrix = MatRef::from_row_major_slice(weights, rows, cols);
    // Sequential: faer is built without its `rayon` feature (the workspace Cargo.toml), whose
    // parallel SVD splits its reductions by thread count, so the factors, and every run after
    // them, would differ between a 2-core and a 16-core machine.
    let svd = matrix
        .thin_svd()
        .map_err(|e| StrategyError::invalid("weights", format!("thin SVD failed: {e:?}")))?;
    let terms = rows.min(cols);
    let (u, v) = (svd.U(), svd.V());
    let sigma = svd.S().column_vector();
    let mut singular_values = Vec::with_capacity(terms);
    let mut left = Vec::with_capacity(terms * rows);
    let mut right = Vec::with_capacity(terms * cols);
    for k in 0..terms {
        // faer returns non-negative values; clamp -0.0 and rounding noise anyway.
        let lambda = sigma[k].to_f64().max(0.0);
        let root = lambda.sqrt();
        singular_values.push(T::from_f64(lambda));
        left.extend((0..rows).map(|r| T::from_f64(root * u[(r, k)].to_f64())));
        right.extend((0..cols).map(|c| T::from_f64(root * v[(c, k)].to_f64())));
    }
    Ok(Factors {
        rows,
        cols,
        singular_values,
        left,
        right,
    })
}

/// `W = Σ_k u'_k v'_kᵀ`, row-major `rows × cols` (docs/algorithms.md §1.1: the server recomputes `W`
/// from the aggregated factors before the next SVD).
///
/// # Panics
/// If the factor buffers do not have the lengths the struct documents.
pub fn recompose<T: SvdScalar>(f: &Factors<T>) -> Vec<T> {
    let terms = f.terms();
    let left = MatRef::from_row_major_slice(&f.left, terms, f.rows);
    let right = MatRef::from_row_major_slice(&f.right, terms, f.cols);
    product(left, right, f.rows, f.cols)
}

/// Moves `weights` (row-major `rows × cols`, the matrix `before` was computed from) by the
/// change of its factors: `W ← W + Σ_{k changed} (u'_k v'_kᵀ − ū'_k v̄'_kᵀ)`, with `ū', v̄'`
/// the terms of `before` and `u', v'` those of `after`, the sum in f64.
///
/// Why not `W ← recompose(after)` (docs/algorithms.md §1.1 step 5 as written): the two are equal in
/// exact arithmetic, because the thin SVD keeps every term and so `Σ_k ū'_k v̄'_kᵀ = W`; in
/// floating point the recomposition adds the SVD's rounding to every weight every round, even
/// where no client changed anything. Here a term nobody moved contributes exactly nothing, so
/// a round with no change leaves `W` bit-identical, and the rounding of the others is that of
/// their own change, not of the whole matrix.
///
/// # Panics
/// If the shapes of `before`, `after` and `weights` disagree.
pub fn apply_term_changes(weights: &mut [f32], before: &Factors<f32>, after: &Factors<f32>) {
    let (rows, cols) = (before.rows, before.cols);
    assert!(
        after.rows == rows && after.cols == cols && after.terms() == before.terms(),
        "factors of different shapes"
    );
    assert_eq!(weights.len(), rows * cols, "weights are not rows × cols");
    let changed: Vec<usize> = (0..before.terms())
        .filter(|&k| {
            before.left[k * rows..(k + 1) * rows] != after.left[k * rows..(k + 1) * rows]
                || before.right[k * cols..(k + 1) * cols] != after.right[k * cols..(k + 1) * cols]
        })
        .collect();
    if changed.is_empty() {
        return;
    }
    // Stack the changed terms of `after` and the negated ones of `before`: one f64 product
    // `Σ_k u'_k v'_kᵀ − Σ_k ū'_k v̄'_kᵀ`.
    let m = changed.len();
    let left = Mat::<f64>::from_fn(2 * m, rows, |j, r| {
        let k = changed[j % m];
        if j < m {
            f64::from(after.left[k * rows + r])
        } else {
            -f64::from(before.left[k * rows + r])
        }
    });
    let right = Mat::<f64>::from_fn(2 * m, cols, |j, c| {
        let k = changed[j % m];
        let f = if j < m { after } else { before };
        f64::from(f.right[k * cols + c])
    });
    let change = product(left.as_ref(), right.as_ref(), rows, cols);
    for (w, d) in weights.iter_mut().zip(change) {
        *w = (f64::from(*w) + d) as f32;
    }
}

/// `Σ_j c_j l_j r_jᵀ` in f64, row-major `rows × cols`, for `terms` of `(c_j, l_j, r_j)` with
/// `l_j` of length `rows` and `r_j` of length `cols`: one stacked matrix product instead of a
/// rank-one update per term.
pub fn weighted_outer_sum(terms: &[(f64, &[f32], &[f32])], rows: usize, cols: usize) -> Vec<f64> {
    for (_, l, r) in terms {
        assert!(
            l.len() == rows && r.len() == cols,
            "a term of {}×{} values in a {rows}×{cols} sum",
            l.len(),
            r.len()
        );
    }
    if terms.is_empty() {
        return vec![0.0; rows * cols];
    }
    let left = Mat::<f64>::from_fn(terms.len(), rows, |j, i| {
        terms[j].0 * f64::from(terms[j].1[i])
    });
    let right = Mat::<f64>::from_fn(terms.len(), cols, |j, i| f64::from(terms[j].2[i]));
    product(left.as_ref(), right.as_ref(), rows, cols)
}

/// `Ŵ = Σ_j ω_j u'_{I_j} v'_{I_j}ᵀ`, row-major (docs/algorithms.md §1.1 step 4: the sub-layer a
/// client with index set `I` and frozen multipliers `ω` trains).
///
/// # Panics
/// If `indices` and `multipliers` differ in length or an index is `≥ N`.
pub fn recompose_subset<T: SvdScalar>(
    f: &Factors<T>,
    indices: &[usize],
    multipliers: &[T],
) -> Vec<T> {
    assert_eq!(
        indices.len(),
        multipliers.len(),
        "one multiplier per selected term"
    );
    let terms = f.terms();
    let n = indices.len();
    // Scale the selected left factors by ω once: Ŵ = (Diag(ω) U_Iᵀ)ᵀ V_Iᵀ.
    let scaled_left = Mat::from_fn(n, f.rows, |j, r| {
        let k = indices[j];
        assert!(k < terms, "term index {k} out of range for {terms} terms");
        multipliers[j] * f.left[k * f.rows + r]
    });
    let selected_right = Mat::from_fn(n, f.cols, |j, c| f.right[indices[j] * f.cols + c]);
    product(
        scaled_left.as_ref(),
        selected_right.as_ref(),
        f.rows,
        f.cols,
    )
}

/// `Lᵀ R` for `L: k × rows`, `R: k × cols`, written row-major.
fn product<T: SvdScalar>(
    left: MatRef<'_, T>,
    right: MatRef<'_, T>,
    rows: usize,
    cols: usize,
) -> Vec<T> {
    let mut out = vec![T::from_f64(0.0); rows * cols];
    matmul(
        MatMut::from_row_major_slice_mut(&mut out, rows, cols),
        Accum::Replace,
        left.transpose(),
        right,
        T::from_f64(1.0),
        Par::Seq,
    );
    out
}

/// Shape of the matrix a convolution kernel is factorised as (docs/algorithms.md §1.8):
/// `(c_out, c_in·kh·kw)`.
///
/// The kernel `W ∈ R^{c_out × c_in × kh × kw}` is reshaped row-major over `(c_in, kh, kw)`, so a
/// contiguous (PyTorch/burn layout) kernel buffer *is* the row-major matrix and can be passed to
/// [`factorize`] unchanged. The sharded sub-layer is then a convolution with `n` filters (filter
/// j = `v'_{I_j}` reshaped to `(c_in, kh, kw)`, original stride/padding/dilation, no bias), a
/// per-channel multiply by `ω_{I_j}`, and a 1×1 convolution with weight `U^(c)` (`c_out × n`)
/// plus the original bias; `N = min(c_out, c_in·kh·kw)`.
pub fn conv_matrix_shape(
    out_channels: usize,
    in_channels: usize,
    kernel_height: usize,
    kernel_width: usize,
) -> (usize, usize) {
    (out_channels, in_channels * kernel_height * kernel_width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream, uniform};

    fn random_matrix(rows: usize, cols: usize, seed: u64) -> Vec<f64> {
        let mut rng = stream(seed, 0, 0, Purpose::Experiment);
        (0..rows * cols)
            .map(|_| 2.0 * uniform(&mut rng) - 1.0)
            .collect()
    }

    /// faer with its `rayon` feature splits an SVD's reductions by the thread count of the
    /// calling pool; `factorize` must not, or a run's model would depend on the machine's
    /// cores. The matrix is large enough that the parallel path does split it: with the feature
    /// on (as until 2026-11-26) these two pools gave different factors, so this fails if the
    /// feature comes back (directly or through another crate's features).
    #[test]
    fn factors_do_not_depend_on_the_thread_count() {
        let (rows, cols) = (256, 384);
        let weights: Vec<f32> = random_matrix(rows, cols, 11)
            .into_iter()
            .map(|w| w as f32)
            .collect();
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| factorize(&weights, rows, cols).expect("the SVD"))
        };
        let (one, four) = (on(1), on(4));
        let bits = |f: &Factors<f32>| {
            (f.singular_values.iter().chain(&f.left).chain(&f.right))
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        assert!(
            bits(&one) == bits(&four),
            "factors differ between 1 and 4 threads"
        );
    }

    fn relative_error<T: SvdScalar>(a: &[T], b: &[T]) -> f64 {
        let diff: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x.to_f64() - y.to_f64()).powi(2))
            .sum();
        let norm: f64 = b.iter().map(|y| y.to_f64().powi(2)).sum();
        (diff / norm).sqrt()
    }

    /// No changed term: `W` keeps its exact bits. Changed terms: `W` moves to the recomposition
    /// of the new factors (equal in exact arithmetic; here to f32 rounding).
    #[test]
    fn term_changes_move_w_like_the_recomposition_and_leave_it_without_them() {
        let w: Vec<f32> = random_matrix(12, 9, 4).iter().map(|&x| x as f32).collect();
        let before = factorize(&w, 12, 9).unwrap();
        let mut same = w.clone();
        apply_term_changes(&mut same, &before, &before.clone());
        assert_eq!(same, w);

        let mut after = before.clone();
        after.left[2 * 12..3 * 12]
            .iter_mut()
            .for_each(|x| *x += 0.3);
        after.right[5 * 9] -= 0.7;
        let mut moved = w.clone();
        apply_term_changes(&mut moved, &before, &after);
        assert!(relative_error(&moved, &recompose(&after)) < 1e-6);
        // Only terms 2 and 5 moved: W changes by exactly their outer-product difference.
        let expected: Vec<f64> = (0..12 * 9)
            .map(|i| {
                let (r, c) = (i / 9, i % 9);
                let term = |f: &Factors<f32>, k: usize| {
                    f64::from(f.left[k * 12 + r]) * f64::from(f.right[k * 9 + c])
                };
                f64::from(w[i]) + term(&after, 2) - term(&before, 2) + term(&after, 5)
                    - term(&before, 5)
            })
            .collect();
        for (m, e) in moved.iter().zip(&expected) {
            assert!((f64::from(*m) - e).abs() < 1e-6, "{m} vs {e}");
        }
    }

    #[test]
    fn reconstructs_random_f64_matrix() {
        // Input: random 64 × 40; expected: Σ u'_k v'_kᵀ = W to 1e-10 relative (f64 SVD accuracy).
        let w = random_matrix(64, 40, 1);
        let f = factorize(&w, 64, 40).unwrap();
        assert_eq!(f.terms(), 40);
        assert_eq!(f.left.len(), 40 * 64);
        assert_eq!(f.right.len(), 40 * 40);
        assert!(f.singular_values.windows(2).all(|p| p[0] >= p[1]));
        assert!(relative_error(&recompose(&f), &w) < 1e-10);
    }

    #[test]
    fn reconstructs_random_f32_matrix() {
        // Same for f32 (wide matrix this time) to 1e-5 relative.
        let w: Vec<f32> = random_matrix(40, 64, 2).iter().map(|&x| x as f32).collect();
        let f = factorize(&w, 40, 64).unwrap();
        assert_eq!(f.terms(), 40);
        assert!(relative_error(&recompose(&f), &w) < 1e-5);
    }

    #[test]
    fn singular_values_of_a_known_matrix() {
        // [[3,0],[0,-4],[0,0]] has singular values (4, 3); a rank-one 2×3 outer product of
        // (1,2)·(2,0,1)ᵀ has (√5·√5 = 5, 0).
        let f = factorize::<f64>(&[3.0, 0.0, 0.0, -4.0, 0.0, 0.0], 3, 2).unwrap();
        assert!((f.singular_values[0] - 4.0).abs() < 1e-12);
        assert!((f.singular_values[1] - 3.0).abs() < 1e-12);
        let f = factorize::<f64>(&[2.0, 0.0, 1.0, 4.0, 0.0, 2.0], 2, 3).unwrap();
        assert!((f.singular_values[0] - 5.0).abs() < 1e-12);
        assert!(f.singular_values[1].abs() < 1e-12);
        // ‖u'_k‖² = ‖v'_k‖² = λ_k: the split is symmetric.
        let norm_u: f64 = f.left[..2].iter().map(|x| x * x).sum();
        let norm_v: f64 = f.right[..3].iter().map(|x| x * x).sum();
        assert!((norm_u - 5.0).abs() < 1e-12 && (norm_v - 5.0).abs() < 1e-12);
    }

    #[test]
    fn subset_with_all_terms_and_unit_multipliers_reproduces_conv_kernel() {
        // A 6 × 3 × 3 × 3 kernel in contiguous layout is the 6 × 27 row-major matrix of §1.8;
        // n = N terms with ω = 1 reproduce it, and element (o, c, y, x) sits at column c·9+y·3+x.
        let (rows, cols) = conv_matrix_shape(6, 3, 3, 3);
        assert_eq!((rows, cols), (6, 27));
        let kernel = random_matrix(rows, cols, 3);
        let f = factorize(&kernel, rows, cols).unwrap();
        let all: Vec<usize> = (0..f.terms()).collect();
        let w = recompose_subset(&f, &all, &vec![1.0; all.len()]);
        assert!(relative_error(&w, &kernel) < 1e-10);
        let (o, c, y, x) = (4, 2, 1, 0);
        let flat = o * 27 + c * 9 + y * 3 + x;
        assert!((w[o * cols + c * 9 + y * 3 + x] - kernel[flat]).abs() < 1e-10);
    }

    #[test]
    fn subset_applies_multipliers() {
        // Ŵ with I = {0, 2}, ω = (2, 0.5) equals 2 u'_0 v'_0ᵀ + 0.5 u'_2 v'_2ᵀ computed by hand.
        let w = random_matrix(5, 4, 4);
        let f = factorize(&w, 5, 4).unwrap();
        let got = recompose_subset(&f, &[0, 2], &[2.0, 0.5]);
        for r in 0..5 {
            for c in 0..4 {
                let expected =
                    2.0 * f.left[r] * f.right[c] + 0.5 * f.left[2 * 5 + r] * f.right[2 * 4 + c];
                assert!((got[r * 4 + c] - expected).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(factorize(&[1.0_f64, 2.0, 3.0], 2, 2).is_err());
        assert!(factorize(&[1.0_f64, f64::NAN, 3.0, 4.0], 2, 2).is_err());
        assert!(factorize(&[f32::INFINITY], 1, 1).is_err());
        assert!(factorize::<f64>(&[], 0, 3).is_err());
    }
}
