//! Fused kernels for the hot spots of transformer training: GPT-2's GELU, layer normalisation,
//! the linear layer and multi-head (causal) attention, each with a hand-written backward pass.
//!
//! Why: written with burn's tensor operations, each of these is a chain of 5–10 element-wise
//! passes forward and as many again backward, every pass allocating a fresh tensor. On the CPU
//! backend that chain, not the matrix products, dominated a char-transformer step, and
//! burn-ndarray's matmul copied every transposed operand first. Here each element-wise kernel is
//! one pass forward and one backward over contiguous rows, and the products read transposes and
//! per-head column bands in place.
//!
//! [`Kernels`] is a backend extension: the CPU backend ([`NdArray`](burn::backend::NdArray))
//! runs the fused loops (`ndarray/`, one file per kind of kernel), and
//! [`Autodiff`](burn::backend::autodiff::Autodiff) records one graph node per kernel whose
//! backward pass calls the inner backend's backward kernel (`autodiff.rs`). Any other backend gets the [`composite`] versions, which are the same
//! functions written with burn's tensor operations; the tests check that both agree, values and
//! gradients. CUDA (`cuda/`) runs the composite versions except for the convolution, which
//! it runs as an implicit GEMM.

pub mod cohort;
pub mod composite;

mod autodiff;
#[cfg(feature = "cuda")]
pub mod cuda;
mod ndarray;
mod windows;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DataError, Shape, Tensor, TensorPrimitive};
pub use cohort::Cohort;
pub use windows::{MaxWindow, Pool};

/// √(2/π), GPT-2's GELU constant.
const GELU_C: f32 = 0.797_884_6;
/// The cubic coefficient of GPT-2's GELU.
const GELU_A: f32 = 0.044_715;
/// Variance floor of the layer norm.
pub const NORM_EPS: f32 = 1e-5;

/// A backend with the fused kernels. Every function works on the last dimension of a
/// contiguous tensor of any rank (its "rows").
pub trait Kernels: Backend {
    /// Whether the cohort kernels batch clients of equal rows (every backend but the CPU's,
    /// whose cohort kernels run one client at a time to stay bit-exact): the training loop then
    /// pads a cohort's shorter batches to equal rows.
    const BATCHED_COHORTS: bool = true;

    /// A tensor's values in row-major order (a trained model read out for the server).
    /// Separate because burn-ndarray's `into_data` walks a tensor it does not own (a
    /// parameter is always shared with its module) element by element through a dynamic
    /// index: reading the trained clients out was 7% of the main job on the CPU.
    fn read_values<const D: usize>(t: Tensor<Self, D>) -> Result<Vec<f32>, DataError> {
        t.into_data().into_vec::<f32>()
    }

    /// `x · scale` with `scale` constant along the last dimension: `x` is `… × c`, `scale`
    /// `… × 1` with the same leading dimensions (a factor's rows scaled by its terms' ω, a
    /// gradient's by ClipLR's factors). Separate because burn-ndarray's broadcasting product
    /// walks the tensor element by element through a generic closure: the Frobenius decay's
    /// four and ClipLR's two were 7% of a sharded digits-CNN step.
    fn scale_rows(x: FloatTensor<Self>, scale: FloatTensor<Self>) -> FloatTensor<Self> {
        composite::scale_rows::<Self>(x, scale)
    }

    /// One step of SGD with momentum (no dampening, no Nesterov, as burn's `Sgd` with
    /// `Momentum`) and weight decay: `d = grad + decay · param` (`grad` itself when `decay` is
    /// 0), `velocity' = d + momentum · velocity` (`d` alone without a velocity), `param' =
    /// param − lr · velocity'`; returns `[param', velocity']`. Separate because as tensor
    /// operations it is six allocating passes over every parameter (5% of a sharded digits-CNN
    /// step on the CPU, and the decay 6% of a ResNet-18 step); on the CPU it is one.
    fn sgd_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        velocity: Option<FloatTensor<Self>>,
        lr: f64,
        momentum: f64,
        decay: f64,
    ) -> [FloatTensor<Self>; 2] {
        composite::sgd_step::<Self>(param, grad, velocity, lr, momentum, decay)
    }

    /// `a + scale · b` of two tensors of one shape: the weight decay `μ w` added to a gradient.
    /// Separate for the same reason as [`Kernels::sgd_step`]: as tensor operations it is two
    /// allocating passes over every parameter (6% of a ResNet-18 step on the CPU).
    fn add_scaled(a: FloatTensor<Self>, b: FloatTensor<Self>, scale: f64) -> FloatTensor<Self> {
        composite::add_scaled::<Self>(a, b, scale)
    }

    /// GPT-2's GELU, `x · ½(1 + tanh(√(2/π)(x + 0.044715 x³)))`.
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        composite::gelu::<Self>(x)
    }

    /// The gradient of [`Kernels::fused_gelu`] at `x`, times `grad`.
    fn fused_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        composite::gelu_backward::<Self>(x, grad)
    }

    /// Layer normalisation of each row, scaled by `gamma` and shifted by `beta` (both of the
    /// row's length).
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        composite::layer_norm::<Self>(x, gamma, beta)
    }

    /// The gradients of [`Kernels::fused_layer_norm`] with respect to `x`, `gamma` and `beta`.
    fn fused_layer_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        composite::layer_norm_backward::<Self>(x, gamma, grad)
    }

    /// `x · wᵀ (+ bias)` over the last dimension of `x` (`… × in`), with `w` an `out × in`
    /// matrix (any strides: a transposed factor is not copied) and `bias` (`out`) added to
    /// every row. The bias is part of the kernel because, as a separate broadcast addition, it
    /// was one more allocating pass over the output forward and a reduction backward.
    fn fused_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        composite::linear::<Self>(x, w, bias)
    }

    /// The gradients of [`Kernels::fused_linear`] with respect to `x` and `w`.
    fn fused_linear_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        composite::linear_backward::<Self>(x, w, grad)
    }

    /// The gradient of [`Kernels::fused_linear`] with respect to its bias: the column sums of
    /// `grad` over every row. Separate from [`Kernels::fused_linear_backward`] so that a layer
    /// without a bias does not pay for it.
    fn fused_bias_backward(grad: FloatTensor<Self>) -> FloatTensor<Self> {
        composite::bias_backward::<Self>(grad)
    }

    /// Multi-head scaled dot-product attention of `N × T × d` queries, keys and values split
    /// into `heads` heads of width `d / heads`, with the heads merged back into `N × T × d`.
    /// Returns the output and the attention probabilities (`N × heads × T × T`, kept for the
    /// backward pass).
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        causal: bool,
    ) -> [FloatTensor<Self>; 2] {
        composite::attention::<Self>(q, k, v, heads, causal)
    }

    /// The gradients of [`Kernels::fused_attention`] with respect to `q`, `k` and `v`;
    /// `causal` as given to the forward pass (the CPU kernels skip the products of the masked
    /// block).
    fn fused_attention_backward(
        [q, k, v]: [FloatTensor<Self>; 3],
        probs: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        causal: bool,
    ) -> [FloatTensor<Self>; 3] {
        let _ = causal; // the masked probabilities are zero: the composite gradient needs no flag
        composite::attention_backward::<Self>([q, k, v], probs, grad)
    }
    /// A 2-D convolution with zero padding of `N × C × H × W` images by `filters`, the
    /// `c_out × (C·kh·kw)` matrix of the weight (row-major over (C, kh, kw), any strides):
    /// `N × c_out × H' × W'`.
    /// With `bias` (`c_out`), it is added to every output position of its channel.
    ///
    /// Returns the output and what the backward pass keeps of the input: the input itself
    /// here; the CPU kernels keep the patch matrix they built instead, so that the backward
    /// pass does not build it a second time.
    fn fused_conv2d(
        x: FloatTensor<Self>,
        filters: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        geometry: ConvGeometry,
    ) -> [FloatTensor<Self>; 2] {
        [
            composite::conv2d::<Self>(x.clone(), filters, bias, geometry),
            x,
        ]
    }

    /// The gradients of [`Kernels::fused_conv2d`] with respect to its input (of shape
    /// `input`), `filters` and, where `with_bias`, the bias (the same for any bias, so the
    /// bias itself is not needed), from `saved`, the second output of the forward pass. A
    /// convolution without a bias (ResNet-18's, before a norm) does not pay for its gradient.
    fn fused_conv2d_backward(
        saved: FloatTensor<Self>,
        _input: Shape,
        filters: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geometry: ConvGeometry,
        with_bias: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        composite::conv2d_backward::<Self>(saved, filters, grad, geometry, with_bias)
    }

    /// Group normalisation of `N × C × H × W` activations (`groups` groups of consecutive
    /// channels), scaled by `gamma` and shifted by `beta` per channel; then a ReLU where
    /// `relu` (the CNNs' norm–activation pair in one pass).
    fn fused_group_norm(
        x: FloatTensor<Self>,
        [gamma, beta]: [FloatTensor<Self>; 2],
        groups: usize,
        relu: bool,
    ) -> FloatTensor<Self> {
        composite::group_norm::<Self>(x, [gamma, beta], groups, relu)
    }

    /// The gradients of [`Kernels::fused_group_norm`] with respect to `x`, `gamma` and `beta`.
    fn fused_group_norm_backward(
        x: FloatTensor<Self>,
        [gamma, beta]: [FloatTensor<Self>; 2],
        grad: FloatTensor<Self>,
        groups: usize,
        relu: bool,
    ) -> [FloatTensor<Self>; 3] {
        composite::group_norm_backward::<Self>(x, [gamma, beta], grad, groups, relu)
    }

    /// Client c's parameter of a stacked one (`C × …` → `…`). The CPU backend keeps the
    /// strides (a transposed factor stays a transposed view, read in place by the products).
    fn cohort_client(stacked: FloatTensor<Self>, c: usize) -> FloatTensor<Self> {
        cohort::slice_client::<Self>(stacked, c)
    }

    /// Per-client tensors stacked along a new leading client axis (`…` → `C × …`): the
    /// cohort's parameter gradients. The CPU backend gives a lone client's tensor its axis in
    /// place, where burn-ndarray's reshape copies it (ResNet-18's filter gradients, 2.7% of a
    /// step).
    fn cohort_stack(parts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        cohort::stack::<Self>(parts)
    }

    /// [`Kernels::fused_linear`] for a cohort (the `cohort` module): `w` is `C × out × in`
    /// (any strides), `bias` `C × out`, and client c's rows of `x` use client c's weight.
    fn cohort_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        cohort: &Cohort,
    ) -> FloatTensor<Self> {
        if Self::BATCHED_COHORTS && cohort::batches(cohort) {
            cohort::batched_linear::<Self>(x, w, bias, cohort)
        } else {
            cohort::linear::<Self>(x, w, bias, cohort)
        }
    }

    /// The gradients of [`Kernels::cohort_linear`] with respect to `x`, `w` and, where
    /// `with_bias`, the bias.
    fn cohort_linear_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        with_bias: bool,
        cohort: &Cohort,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        if Self::BATCHED_COHORTS && cohort::batches(cohort) {
            cohort::batched_linear_backward::<Self>(x, w, grad, with_bias, cohort)
        } else {
            cohort::linear_backward::<Self>(x, w, grad, with_bias, cohort)
        }
    }

    /// [`Kernels::fused_layer_norm`] for a cohort: `gamma` and `beta` are `C × d`.
    fn cohort_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        cohort: &Cohort,
    ) -> FloatTensor<Self> {
        if Self::BATCHED_COHORTS && cohort::batches(cohort) {
            cohort::batched_layer_norm::<Self>(x, gamma, beta, cohort)
        } else {
            cohort::layer_norm::<Self>(x, gamma, beta, cohort)
        }
    }

    /// The gradients of [`Kernels::cohort_layer_norm`] with respect to `x`, `gamma` and `beta`.
    fn cohort_layer_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        cohort: &Cohort,
    ) -> [FloatTensor<Self>; 3] {
        if Self::BATCHED_COHORTS && cohort::batches(cohort) {
            cohort::batched_layer_norm_backward::<Self>(x, gamma, grad, cohort)
        } else {
            cohort::layer_norm_backward::<Self>(x, gamma, grad, cohort)
        }
    }

    /// [`Kernels::fused_conv2d`] for a cohort: `filters` is `C × c_out × (C_in·kh·kw)`, `bias`
    /// `C × c_out`. Returns the output and what the backward pass keeps: per client, or the
    /// whole input where the cohort runs batched.
    fn cohort_conv2d(
        x: FloatTensor<Self>,
        filters: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        geometry: ConvGeometry,
        cohort: &Cohort,
    ) -> (FloatTensor<Self>, Vec<FloatTensor<Self>>) {
        if Self::BATCHED_COHORTS && cohort::batches_conv(cohort, geometry) {
            cohort::batched_conv2d::<Self>(x, filters, bias, geometry)
        } else {
            cohort::conv2d::<Self>(x, filters, bias, geometry, cohort)
        }
    }

    /// The gradients of [`Kernels::cohort_conv2d`] with respect to its input (of shape
    /// `input`), the filters and, where `with_bias`, the bias.
    fn cohort_conv2d_backward(
        saved: Vec<FloatTensor<Self>>,
        input: Shape,
        filters: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geometry: ConvGeometry,
        with_bias: bool,
        cohort: &Cohort,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        if Self::BATCHED_COHORTS && cohort::batches_conv(cohort, geometry) {
            cohort::batched_conv2d_backward::<Self>(
                saved, input, filters, grad, geometry, with_bias,
            )
        } else {
            cohort::conv2d_backward::<Self>(
                saved, input, filters, grad, geometry, with_bias, cohort,
            )
        }
    }

    /// [`Kernels::fused_group_norm`] for a cohort: `gamma` and `beta` are `C × channels`.
    fn cohort_group_norm(
        x: FloatTensor<Self>,
        gamma_beta: [FloatTensor<Self>; 2],
        groups: usize,
        relu: bool,
        cohort: &Cohort,
    ) -> FloatTensor<Self> {
        if Self::BATCHED_COHORTS && cohort::batches(cohort) {
            cohort::batched_group_norm::<Self>(x, gamma_beta, groups, relu, cohort)
        } else {
            cohort::group_norm::<Self>(x, gamma_beta, groups, relu, cohort)
        }
    }

    /// The gradients of [`Kernels::cohort_group_norm`] with respect to `x`, `gamma` and `beta`.
    fn cohort_group_norm_backward(
        x: FloatTensor<Self>,
        gamma_beta: [FloatTensor<Self>; 2],
        grad: FloatTensor<Self>,
        groups: usize,
        relu: bool,
        cohort: &Cohort,
    ) -> [FloatTensor<Self>; 3] {
        if Self::BATCHED_COHORTS && cohort::batches(cohort) {
            cohort::batched_group_norm_backward::<Self>(x, gamma_beta, grad, groups, relu, cohort)
        } else {
            cohort::group_norm_backward::<Self>(x, gamma_beta, grad, groups, relu, cohort)
        }
    }

    /// Non-overlapping `k × k` pooling of `N × C × H × W` activations (sides divisible by k).
    fn fused_pool(x: FloatTensor<Self>, kind: Pool, k: usize) -> FloatTensor<Self> {
        composite::pool::<Self>(x, kind, k)
    }

    /// The gradient of [`Kernels::fused_pool`] with respect to `x`.
    fn fused_pool_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: Pool,
        k: usize,
    ) -> FloatTensor<Self> {
        composite::pool_backward::<Self>(x, grad, kind, k)
    }

    /// Max pooling of `N × C × H × W` activations over windows that may overlap and cross
    /// the border ([`MaxWindow`]): burn's `max_pool2d`, to the bit.
    fn fused_max_pool(x: FloatTensor<Self>, window: MaxWindow) -> FloatTensor<Self> {
        composite::max_pool::<Self>(x, window)
    }

    /// The gradient of [`Kernels::fused_max_pool`] with respect to `x`: each output's gradient
    /// goes to the first position of its window that holds the window's maximum, summed where
    /// windows share it (burn's, to the bit).
    fn fused_max_pool_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        window: MaxWindow,
    ) -> FloatTensor<Self> {
        composite::max_pool_backward::<Self>(x, grad, window)
    }
}

/// Kernel size, stride and zero padding of a 2-D convolution (dilation 1, one group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl ConvGeometry {
    /// The output side lengths for input sides `[h, w]`.
    pub fn output(&self, [h, w]: [usize; 2]) -> [usize; 2] {
        let side = |len: usize, i: usize| {
            (len + 2 * self.padding[i] - self.kernel[i]) / self.stride[i] + 1
        };
        [side(h, 0), side(w, 1)]
    }

    /// burn's options for the same convolution.
    pub fn options(&self) -> burn::tensor::ops::ConvOptions<2> {
        burn::tensor::ops::ConvOptions::new(self.stride, self.padding, [1, 1], 1)
    }
}

/// A training backend: autodiff over a backend that has the kernels too (for evaluation on
/// the inner backend).
pub trait TrainingBackend: AutodiffBackend<InnerBackend: Kernels> + Kernels {}

impl<B> TrainingBackend for B where B: AutodiffBackend<InnerBackend: Kernels> + Kernels {}

/// `shape` with its last dimension set to `len`.
fn with_row_len(shape: &Shape, len: usize) -> Shape {
    let mut dims: Vec<usize> = (0..shape.num_dims()).map(|i| shape[i]).collect();
    dims[shape.num_dims() - 1] = len;
    Shape::from(dims)
}

/// A float primitive as a tensor of rank `D`.
fn float<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `c ← a · b` for row-major `a` (`m × k`), `b` (`k × n`) and `c` (`m × n`): the product every
/// fused CPU kernel runs, on this thread. Public for the sgemm benchmark
/// (`training/benches/sgemm.rs`), which measures the machine's limit through it. Panics when a
/// slice is shorter than its shape.
pub fn sgemm([m, k, n]: [usize; 3], a: &[f32], b: &[f32], c: &mut [f32]) {
    ndarray::gemm_into(
        [m, k, n],
        1.0,
        (a, k as isize, 1),
        (b, n as isize, 1),
        (c, n),
        false,
    );
}

/// The micro-kernels [`sgemm`] and every CPU product of training run on in this process:
/// `gemm`'s AVX-512 kernels when the build has the `avx512` feature (the `fedshard` binary's
/// default) and the CPU has AVX-512F, else its AVX2 kernels (every x86-64 build targets
/// x86-64-v3). The two round differently, so a seed's model bytes are the same only on the
/// same path: benchmarks and runs name it beside their figures.
pub fn product_kernels() -> &'static str {
    #[cfg(all(target_arch = "x86_64", feature = "avx512"))]
    if std::arch::is_x86_feature_detected!("avx512f") {
        return "AVX-512";
    }
    if cfg!(target_arch = "x86_64") {
        "AVX2"
    } else {
        "the target's own"
    }
}

/// GPT-2's GELU through [`Kernels::fused_gelu`].
pub fn gelu<B: Kernels, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    float(B::fused_gelu(x.into_primitive().tensor()))
}

/// Layer normalisation of the last dimension through [`Kernels::fused_layer_norm`].
pub fn layer_norm<B: Kernels, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
) -> Tensor<B, D> {
    float(B::fused_layer_norm(
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
    ))
}

/// `x · wᵀ` through [`Kernels::fused_linear`].
pub fn linear<B: Kernels, const D: usize>(x: Tensor<B, D>, w: Tensor<B, 2>) -> Tensor<B, D> {
    affine(x, w, None)
}

/// `x · wᵀ + bias` (the bias added to every row) through [`Kernels::fused_linear`].
pub fn affine<B: Kernels, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    float(B::fused_linear(
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
    ))
}

/// Multi-head attention of `N × T × d` projections through [`Kernels::fused_attention`].
pub fn attention<B: Kernels>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
    causal: bool,
) -> Tensor<B, 3> {
    let [out, _] = B::fused_attention(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
        heads,
        causal,
    );
    float(out)
}

/// A 2-D convolution, with a per-channel bias if given, through [`Kernels::fused_conv2d`].
pub fn conv2d<B: Kernels>(
    x: Tensor<B, 4>,
    filters: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    geometry: ConvGeometry,
) -> Tensor<B, 4> {
    let [y, _saved] = B::fused_conv2d(
        x.into_primitive().tensor(),
        filters.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
        geometry,
    );
    float(y)
}

/// Group normalisation, then a ReLU where `relu`, through [`Kernels::fused_group_norm`].
pub fn group_norm<B: Kernels>(
    x: Tensor<B, 4>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    groups: usize,
    relu: bool,
) -> Tensor<B, 4> {
    float(B::fused_group_norm(
        x.into_primitive().tensor(),
        [
            gamma.into_primitive().tensor(),
            beta.into_primitive().tensor(),
        ],
        groups,
        relu,
    ))
}

/// Non-overlapping `k × k` pooling through [`Kernels::fused_pool`].
pub fn pool<B: Kernels>(x: Tensor<B, 4>, kind: Pool, k: usize) -> Tensor<B, 4> {
    float(B::fused_pool(x.into_primitive().tensor(), kind, k))
}

/// Max pooling over overlapping windows through [`Kernels::fused_max_pool`].
pub fn max_pool<B: Kernels>(x: Tensor<B, 4>, window: MaxWindow) -> Tensor<B, 4> {
    float(B::fused_max_pool(x.into_primitive().tensor(), window))
}

/// `x · wᵀ + bias` for a cohort through [`Kernels::cohort_linear`]: client c's rows of `x`
/// (dimension 0) with `w[c]` (`C × out × in`) and `bias[c]` (`C × out`).
pub fn cohort_affine<B: Kernels, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 3>,
    bias: Option<Tensor<B, 2>>,
    cohort: &Cohort,
) -> Tensor<B, D> {
    float(B::cohort_linear(
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
        cohort,
    ))
}

/// `x` (`C × n × c`) with each row times its number in `scale` (`C × n × 1`), through
/// [`Kernels::scale_rows`].
/// `a + scale · b` through [`Kernels::add_scaled`].
pub fn add_scaled<B: Kernels, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
    scale: f64,
) -> Tensor<B, D> {
    float(B::add_scaled(
        a.into_primitive().tensor(),
        b.into_primitive().tensor(),
        scale,
    ))
}

pub fn scale_rows<B: Kernels>(x: Tensor<B, 3>, scale: Tensor<B, 3>) -> Tensor<B, 3> {
    float(B::scale_rows(
        x.into_primitive().tensor(),
        scale.into_primitive().tensor(),
    ))
}

/// Layer normalisation for a cohort through [`Kernels::cohort_layer_norm`].
pub fn cohort_layer_norm<B: Kernels, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 2>,
    beta: Tensor<B, 2>,
    cohort: &Cohort,
) -> Tensor<B, D> {
    float(B::cohort_layer_norm(
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
        cohort,
    ))
}

/// A 2-D convolution for a cohort through [`Kernels::cohort_conv2d`].
pub fn cohort_conv2d<B: Kernels>(
    x: Tensor<B, 4>,
    filters: Tensor<B, 3>,
    bias: Option<Tensor<B, 2>>,
    geometry: ConvGeometry,
    cohort: &Cohort,
) -> Tensor<B, 4> {
    let (y, _saved) = B::cohort_conv2d(
        x.into_primitive().tensor(),
        filters.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
        geometry,
        cohort,
    );
    float(y)
}

/// Group normalisation (and a ReLU where `relu`) for a cohort through
/// [`Kernels::cohort_group_norm`].
pub fn cohort_group_norm<B: Kernels>(
    x: Tensor<B, 4>,
    gamma: Tensor<B, 2>,
    beta: Tensor<B, 2>,
    groups: usize,
    relu: bool,
    cohort: &Cohort,
) -> Tensor<B, 4> {
    float(B::cohort_group_norm(
        x.into_primitive().tensor(),
        [
            gamma.into_primitive().tensor(),
            beta.into_primitive().tensor(),
        ],
        groups,
        relu,
        cohort,
    ))
}

#[cfg(test)]
mod tests;
