//! The linear layer and every matrix product of the kernels: the `gemm` crate's strided
//! product, reading transposes and column bands in place.

use super::{not_f32, row_len, tensor, values};
use crate::models::kernels::with_row_len;
use burn::tensor::{Shape, TensorMetadata};
use burn_ndarray::NdArrayTensor;
use std::borrow::Cow;

pub(super) fn linear(
    x: NdArrayTensor,
    w: NdArrayTensor,
    bias: Option<NdArrayTensor>,
) -> NdArrayTensor {
    let shape = x.shape();
    let inputs = row_len(&shape);
    let x = Rows::of(&x);
    let w = Strided::of(&w);
    assert_eq!(w.cols, inputs, "linear: weight width vs input width");
    let rows = shape.num_elements() / inputs;
    // y = x · wᵀ (wᵀ is w read with its strides swapped), added to the bias laid into
    // every row first, if any.
    let (x, w_t) = ((&x.values[..], x.rs, x.cs), (&w.values[..], w.cs, w.rs));
    let mkn = [rows, inputs, w.rows];
    let y = match &bias {
        Some(bias) => {
            let bias = values(bias);
            assert_eq!(bias.len(), w.rows, "linear: bias length vs output width");
            let mut y = bias.repeat(rows);
            gemm_into(mkn, 1.0, x, w_t, (&mut y, w.rows), true);
            y
        }
        None => gemm_fresh(mkn, 1.0, x, w_t),
    };
    tensor(y, with_row_len(&shape, w.rows))
}

pub(super) fn linear_backward(
    x: NdArrayTensor,
    w: NdArrayTensor,
    grad: NdArrayTensor,
) -> [NdArrayTensor; 2] {
    let shape = x.shape();
    let inputs = row_len(&shape);
    let (x, grad) = (Rows::of(&x), values(&grad));
    let w = Strided::of(&w);
    let rows = shape.num_elements() / inputs;
    let outputs = w.rows;
    let d_x = gemm_fresh(
        [rows, outputs, inputs],
        1.0,
        (&grad, outputs as isize, 1),
        (&w.values, w.rs, w.cs),
    );
    let d_w = gemm_fresh(
        [outputs, rows, inputs],
        1.0,
        (&grad, 1, outputs as isize),
        (&x.values, x.rs, x.cs),
    );
    [
        tensor(d_x, shape),
        tensor(d_w, Shape::new([outputs, inputs])),
    ]
}

pub(super) fn bias_backward(grad: NdArrayTensor) -> NdArrayTensor {
    let outputs = row_len(&grad.shape());
    let grad = values(&grad);
    let mut d_bias = vec![0.0f32; outputs];
    for row in grad.chunks_exact(outputs) {
        d_bias.iter_mut().zip(row).for_each(|(s, g)| *s += g);
    }
    tensor(d_bias, Shape::new([outputs]))
}

/// A CPU matrix with its element strides, borrowed when its memory is one block (a transposed
/// view included), copied to row-major otherwise.
pub(super) struct Strided<'a> {
    pub(super) values: Cow<'a, [f32]>,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) rs: isize,
    pub(super) cs: isize,
}

impl<'a> Strided<'a> {
    pub(super) fn of(t: &'a NdArrayTensor) -> Self {
        let NdArrayTensor::F32(storage) = t else {
            not_f32(t)
        };
        let view = storage.view();
        let &[rows, cols] = view.shape() else {
            panic!(
                "a linear layer's weight is a matrix, got shape {:?}",
                view.shape()
            );
        };
        let strides = view.strides();
        match view.to_slice_memory_order() {
            Some(block) if strides.iter().all(|&s| s >= 0) => Self {
                values: Cow::Borrowed(block),
                rows,
                cols,
                rs: strides[0],
                cs: strides[1],
            },
            _ => Self {
                values: Cow::Owned(view.iter().copied().collect()),
                rows,
                cols,
                rs: cols as isize,
                cs: 1,
            },
        }
    }
}

/// The input of a linear layer as `rows × last dimension`: a matrix keeps its strides (a
/// transposed factor `Uᵀ` is read in place), a higher-rank tensor is taken as contiguous rows.
struct Rows<'a> {
    values: Cow<'a, [f32]>,
    rs: isize,
    cs: isize,
}

impl<'a> Rows<'a> {
    fn of(t: &'a NdArrayTensor) -> Self {
        let shape = t.shape();
        if shape.num_dims() == 2 {
            let m = Strided::of(t);
            return Self {
                values: m.values,
                rs: m.rs,
                cs: m.cs,
            };
        }
        Self {
            values: values(t),
            rs: row_len(&shape) as isize,
            cs: 1,
        }
    }
}

/// `c ← α · a · b` for an `m × k` matrix `a` and a `k × n` matrix `b`, each given as values and
/// (row, column) element strides from the start of the slice, into the first `n` columns of
/// the rows of `c` (row stride `ldc`). Every index is checked against the slices before the
/// kernel reads or writes them.
///
/// Why the `gemm` crate (already built for faer) rather than matrixmultiply: on this project's
/// AMD EPYC VM its AVX2 kernels were 4–8% faster per training step for every shipped model (A/B
/// in one binary, docs/performance.md). Its AVX-512 kernels (feature `x86-v4`, picked at run
/// time) were 13% slower there for the CNN, but on the Intel Xeon VM that replaced it they
/// train the transformer 1.6× and the other models 1.2–1.4× faster, so they are on.
pub(super) fn gemm(
    mkn: [usize; 3],
    alpha: f32,
    a: (&[f32], isize, isize),
    b: (&[f32], isize, isize),
    c: &mut [f32],
    ldc: usize,
) {
    gemm_into(mkn, alpha, a, b, (c, ldc), false);
}

/// [`gemm`] that adds `alpha · a · b` to what `c` holds when `accumulate`, instead of
/// overwriting it (the linear layer's bias is laid into `c` first).
pub(in crate::models::kernels) fn gemm_into(
    mkn: [usize; 3],
    alpha: f32,
    a: (&[f32], isize, isize),
    b: (&[f32], isize, isize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    // SAFETY: `c` is a live, exclusively borrowed slice of `c.len()` initialised floats.
    unsafe { gemm_raw(mkn, alpha, a, b, (c.as_mut_ptr(), c.len(), ldc), accumulate) }
}

/// `alpha · a · b` as a fresh row-major `m × n` matrix. The matrix is not zeroed first: the
/// kernel writes every element (a `vec![0.0; m·n]` cost a `memset` of each product's output,
/// 2% of a char-transformer step).
pub(super) fn gemm_fresh(
    [m, k, n]: [usize; 3],
    alpha: f32,
    a: (&[f32], isize, isize),
    b: (&[f32], isize, isize),
) -> Vec<f32> {
    let mut c = Vec::with_capacity(m * n);
    let spare = c.spare_capacity_mut().as_mut_ptr().cast::<f32>();
    // SAFETY: `spare` points to m·n writable floats owned by `c`; with `accumulate` false the
    // kernel writes each of the m × n elements (row stride n) and reads none, so all m·n are
    // initialised when `set_len` runs.
    unsafe {
        gemm_raw([m, k, n], alpha, a, b, (spare, m * n, n), false);
        c.set_len(m * n);
    }
    c
}

/// How [`gemm_planes`] lays out its `count` results of `m × n`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Layout {
    /// One row-major result after another.
    Stacked,
    /// Row r of every result, then row r + 1: result p's row r at `(r · count + p) · n`.
    Interleaved,
}

/// `count` products `a_p · b_p` in one fresh buffer laid out as `layout` says, operand p read
/// from `p · a_step` and `p · b_step` of `a` and `b`. As [`gemm_fresh`], the results are not
/// zeroed first.
pub(super) fn gemm_planes(
    count: usize,
    [m, k, n]: [usize; 3],
    (a, a_step, rsa, csa): (&[f32], usize, isize, isize),
    (b, b_step, rsb, csb): (&[f32], usize, isize, isize),
    layout: Layout,
) -> Vec<f32> {
    let len = count * m * n;
    let (step, ldc) = match layout {
        Layout::Stacked => (m * n, n),
        Layout::Interleaved => (n, count * n),
    };
    let mut c = Vec::with_capacity(len);
    let out = c.spare_capacity_mut()[..len].as_mut_ptr().cast::<f32>();
    for p in 0..count {
        // SAFETY: `out` points to `len` writable floats owned by `c` (the spare capacity
        // aliases no operand), and result p's rows (`ldc` apart from `p · step`) stay inside
        // them (`gemm_raw` checks); with `accumulate` false the kernel writes and never reads.
        unsafe {
            gemm_raw(
                [m, k, n],
                1.0,
                (&a[p * a_step..], rsa, csa),
                (&b[p * b_step..], rsb, csb),
                (out.add(p * step), len - p * step, ldc),
                false,
            );
        }
    }
    // SAFETY: in either layout the results' rows tile all `len` floats, each written above.
    unsafe { c.set_len(len) };
    c
}

/// The one call into the `gemm` crate, every index checked against the operands first.
///
/// # Safety
/// `c` must point to `c_len` floats writable for the duration of the call that alias neither
/// `a` nor `b`, initialised when `accumulate` (they are read then).
unsafe fn gemm_raw(
    [m, k, n]: [usize; 3],
    alpha: f32,
    (a, rsa, csa): (&[f32], isize, isize),
    (b, rsb, csb): (&[f32], isize, isize),
    (c, c_len, ldc): (*mut f32, usize, usize),
    accumulate: bool,
) {
    assert!(m > 0 && k > 0 && n > 0, "gemm: empty operand {m}×{k}×{n}");
    // The offset of the last element of a positive-sized `rows × cols` operand.
    let last = |rows: usize, cols: usize, rs: isize, cs: isize| {
        assert!(rs >= 0 && cs >= 0, "gemm: negative strides");
        (rows - 1) * rs as usize + (cols - 1) * cs as usize
    };
    assert!(last(m, k, rsa, csa) < a.len(), "gemm: a out of bounds");
    assert!(last(k, n, rsb, csb) < b.len(), "gemm: b out of bounds");
    assert!(
        n <= ldc && last(m, n, ldc as isize, 1) < c_len,
        "gemm: c out of bounds"
    );
    // SAFETY: the asserts above keep every element the kernel touches inside the three
    // buffers, and the caller guarantees `c` is writable and aliases neither `a` nor `b`. With
    // `read_dst` false, c is written, never read. (gemm's convention: dst ← α·dst + β·lhs·rhs,
    // strides given as (column, row); our α is its β, and its α is 1 when accumulating.)
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.as_ptr(),
            csa,
            rsa,
            b.as_ptr(),
            csb,
            rsb,
            if accumulate { 1.0 } else { 0.0 },
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
