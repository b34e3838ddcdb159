//! Multi-head (causal) attention: per head, two products around a row softmax, and the
//! causal mask's block structure so that the products skip the block it zeroes.

use super::activations::{softmax_backward_rows, softmax_rows};
use super::products::gemm;
use super::{tensor, values};
use burn::tensor::{Shape, TensorMetadata};
use burn_ndarray::NdArrayTensor;

pub(super) fn attention(
    q: NdArrayTensor,
    k: NdArrayTensor,
    v: NdArrayTensor,
    heads: usize,
    causal: bool,
) -> [NdArrayTensor; 2] {
    let shape = q.shape();
    let [n, t, d] = [shape[0], shape[1], shape[2]];
    let (width, scale) = head_width(d, heads);
    let (q, k, v) = (values(&q), values(&k), values(&v));
    let mut out = vec![0.0; n * t * d];
    let mut probs = vec![0.0; n * heads * t * t];
    let rows = QueryBands::of(t, causal);
    for (block, p) in probs.chunks_exact_mut(t * t).enumerate() {
        // Head h of sample b is the column band [h·w, (h+1)·w) of the sample's T × d rows.
        let base = (block / heads) * t * d + (block % heads) * width;
        let d = d as isize;
        for (first, count, keys) in rows.bands() {
            gemm(
                [count, width, keys],
                scale,
                (&q[base + first * d as usize..], d, 1),
                (&k[base..], 1, d),
                &mut p[first * t..],
                t,
            );
        }
        softmax_rows(p, t, causal);
        for (first, count, keys) in rows.bands() {
            gemm(
                [count, keys, width],
                1.0,
                (&p[first * t..], t as isize, 1),
                (&v[base..], d, 1),
                &mut out[base + first * d as usize..],
                d as usize,
            );
        }
    }
    [
        tensor(out, shape),
        tensor(probs, Shape::new([n, heads, t, t])),
    ]
}

pub(super) fn attention_backward(
    [q, k, v]: [NdArrayTensor; 3],
    probs: NdArrayTensor,
    grad: NdArrayTensor,
    causal: bool,
) -> [NdArrayTensor; 3] {
    let shape = q.shape();
    let [t, d] = [shape[1], shape[2]];
    let heads = probs.shape()[1];
    let (width, scale) = head_width(d, heads);
    let (q, k, v) = (values(&q), values(&k), values(&v));
    let (probs, grad) = (values(&probs), values(&grad));
    let [mut d_q, mut d_k, mut d_v] = [(); 3].map(|_| vec![0.0; q.len()]);
    // The masked block of dP is never computed and stays zero (its probabilities are zero,
    // so the softmax backward keeps it zero too).
    let mut d_scores = vec![0.0; t * t];
    let rows = QueryBands::of(t, causal);
    for (block, p) in probs.chunks_exact(t * t).enumerate() {
        let base = (block / heads) * t * d + (block % heads) * width;
        let (du, tt) = (d, t as isize);
        let d = d as isize;
        let g = &grad[base..];
        // dP = dO · Vᵀ, then through the softmax; the score scale goes into dQ and dK.
        for (first, count, keys) in rows.bands() {
            gemm(
                [count, width, keys],
                1.0,
                (&g[first * du..], d, 1),
                (&v[base..], 1, d),
                &mut d_scores[first * t..],
                t,
            );
        }
        softmax_backward_rows(p, &mut d_scores, t);
        let ds = &d_scores;
        // dQ = dS · K, by bands of query rows.
        for (first, count, keys) in rows.bands() {
            gemm(
                [count, keys, width],
                scale,
                (&ds[first * t..], tt, 1),
                (&k[base..], d, 1),
                &mut d_q[base + first * du..],
                du,
            );
        }
        // dK = dSᵀ · Q and dV = Pᵀ · dO, by bands of keys: key j gets queries `from`..T.
        for (first, count, from) in rows.key_bands() {
            let queries = t - from;
            gemm(
                [count, queries, width],
                scale,
                (&ds[from * t + first..], 1, tt),
                (&q[base + from * du..], d, 1),
                &mut d_k[base + first * du..],
                du,
            );
            gemm(
                [count, queries, width],
                1.0,
                (&p[from * t + first..], 1, tt),
                (&g[from * du..], d, 1),
                &mut d_v[base + first * du..],
                du,
            );
        }
    }
    [d_q, d_k, d_v].map(|values| tensor(values, shape.clone()))
}

/// The width of one head and the score scale `1/√width`.
fn head_width(d: usize, heads: usize) -> (usize, f32) {
    assert!(
        heads > 0 && d.is_multiple_of(heads),
        "attention: width {d} does not split into {heads} heads"
    );
    let width = d / heads;
    (width, 1.0 / (width as f32).sqrt())
}

/// The causal mask's block structure, so that the attention products skip the block it zeroes:
/// queries before `half` see only keys before `half`, the others see every key up to their
/// own. (The diagonal blocks are still computed whole and masked; splitting them further
/// makes the products too small to run at speed.) Without the mask, one band of everything.
#[derive(Debug, Clone, Copy)]
struct QueryBands {
    t: usize,
    half: usize,
}

impl QueryBands {
    fn of(t: usize, causal: bool) -> Self {
        let half = if causal { t / 2 } else { 0 };
        Self { t, half }
    }

    /// (first query row, rows, keys they need).
    fn bands(self) -> impl Iterator<Item = (usize, usize, usize)> {
        let Self { t, half } = self;
        [(0, half, half), (half, t - half, t)]
            .into_iter()
            .filter(|&(_, rows, _)| rows > 0)
    }

    /// (first key, keys, first query row that sees them).
    fn key_bands(self) -> impl Iterator<Item = (usize, usize, usize)> {
        let Self { t, half } = self;
        [(0, half, 0), (half, t - half, half)]
            .into_iter()
            .filter(|&(_, keys, _)| keys > 0)
    }
}
