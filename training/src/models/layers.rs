//! The two layer kinds spectral sharding needs, as burn modules generic over the backend.
//!
//! An [`Affine`] or [`Conv`] holds its weight either densely (first and last layers, and every
//! layer of a client that trains the whole model) or as a spectral shard (docs/algorithms.md §1.1,
//! §1.8): trainable factors `U` (`n × c_out`, row j = u'_{I_j}) and `V` (`n × c_in_eff`, row j =
//! v'_{I_j}) and the frozen multipliers ω. The factors are stored exactly as the server's
//! [`LayerShard`](fedshard_protocol::task::LayerShard) lays them out (one row per term), so
//! loading a shard into a layer and reading it back are single copies.
//!
//! ω is a plain tensor field, not a `Param`: burn treats such a field as a constant, so it never
//! gets a gradient and no optimizer ever sees it.

use crate::models::kernels::{self, Cohort, ConvGeometry, Kernels};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use fedshard_protocol::work::factors_are_cheaper;
use thiserror::Error;

/// Why a shard's rows do not make factors.
#[derive(Debug, Error)]
pub enum FactorError {
    #[error("a shard must keep at least one term")]
    NoTerms,
    #[error(
        "its factors hold {left} and {right} values, expected {terms}×{rows} and {terms}×{cols}"
    )]
    Lengths {
        left: usize,
        right: usize,
        terms: usize,
        rows: usize,
        cols: usize,
    },
}

/// The frozen-multiplier factorisation of one layer's weight matrix, for each client of a
/// cohort (the leading axis C; one client trains alone as C = 1).
#[derive(Module, Debug)]
pub struct Factors<B: Backend> {
    /// `C × n × c_out`: row j is the left factor u'_{I_j}.
    pub u: Param<Tensor<B, 3>>,
    /// `C × n × c_in_eff`: row j is the right factor v'_{I_j}.
    pub v: Param<Tensor<B, 3>>,
    /// `C × n`: ω_{I_j}, a constant of the local problem.
    pub omega: Tensor<B, 2>,
}

impl<B: Backend> Factors<B> {
    /// Builds the factors of `clients` clients from row-major data (each client's rows after
    /// the previous client's), checking the lengths against the shapes.
    pub fn from_rows(
        left: Vec<f32>,
        right: Vec<f32>,
        multipliers: Vec<f32>,
        [clients, rows, cols]: [usize; 3],
        device: &B::Device,
    ) -> Result<Self, FactorError> {
        let n = multipliers.len() / clients.max(1);
        if n == 0 {
            return Err(FactorError::NoTerms);
        }
        if left.len() != clients * n * rows || right.len() != clients * n * cols {
            return Err(FactorError::Lengths {
                left: left.len() / clients,
                right: right.len() / clients,
                terms: n,
                rows,
                cols,
            });
        }
        Ok(Self {
            u: param(left, [clients, n, rows], device),
            v: param(right, [clients, n, cols], device),
            omega: Tensor::from_data(TensorData::new(multipliers, [clients, n]), device),
        })
    }

    /// Kept terms n.
    pub fn terms(&self) -> usize {
        self.omega.dims()[1]
    }

    /// The ClipLR factor of each term, `min(1, τ/ω_i)`, as a `C × n × 1` column to scale the
    /// rows of the factor gradients (docs/algorithms.md §1.7).
    pub fn clip_scale(&self, tau: f64) -> Tensor<B, 3> {
        let [clients, n] = self.omega.dims();
        self.omega
            .clone()
            .recip()
            .mul_scalar(tau)
            .clamp_max(1.0)
            .reshape([clients, n, 1])
    }
}

/// How a layer's weight is held.
#[derive(Module, Debug)]
pub enum Weight<B: Backend> {
    /// The whole `c_out × c_in_eff` matrix per client, `C × c_out × c_in_eff` (conv:
    /// `c_out × c_in × kh × kw`, flattened).
    Dense(Param<Tensor<B, 3>>),
    /// A spectral shard.
    Factorized(Factors<B>),
}

/// `y = W x + b` for the last dimension of `x` (divided by `scaler` when set).
#[derive(Module, Debug)]
pub struct Affine<B: Backend> {
    pub weight: Weight<B>,
    /// `C × c_out`.
    pub bias: Option<Param<Tensor<B, 2>>>,
    /// HeteroFL's scaler: the keep ratio r this layer's output is divided by, set by the
    /// builder for a layer whose outputs a width slice narrows during local training (so the
    /// sub-model's activations keep the full model's scale); `None` (the global model,
    /// evaluation, whole outputs) leaves the output as it is. A constant, never trained.
    #[module(skip)]
    pub scaler: Option<f64>,
}

/// `y / r` for HeteroFL's scaler `Some(r)`.
fn scaled<B: Backend, const D: usize>(y: Tensor<B, D>, scaler: Option<f64>) -> Tensor<B, D> {
    match scaler {
        Some(r) => y.div_scalar(r),
        None => y,
    }
}

/// `per_client` (`C × k`), the values of row r's client for every row of a cohort's
/// activations (dimension 0), shaped to broadcast over a rank-`D` tensor's other dimensions.
/// A single client's row is broadcast as it is: for constants (ω), whose values alone matter.
pub fn per_row<B: Backend, const D: usize>(
    per_client: Tensor<B, 2>,
    cohort: &Cohort,
) -> Tensor<B, D> {
    let [clients, k] = per_client.dims();
    if clients == 1 {
        let mut shape = [1; D];
        shape[D - 1] = k;
        return per_client.reshape(shape);
    }
    let mut shape = [1; D];
    shape[0] = cohort.total();
    shape[D - 1] = k;
    gather_rows(per_client, cohort).reshape(shape)
}

/// `per_client` (`C × k`) gathered to one row per row of a cohort's activations (`rows × k`),
/// also for a single client. For parameters: the gradient of a gather adds each client's rows
/// in order into its own row, the same sums for one client alone as in a cohort, where a
/// broadcast's reduction might add them in another order.
pub fn gather_rows<B: Backend>(per_client: Tensor<B, 2>, cohort: &Cohort) -> Tensor<B, 2> {
    let index = Tensor::<B, 1, Int>::from_data(
        TensorData::new(cohort.client_of_rows(), [cohort.total()]),
        &per_client.device(),
    );
    per_client.select(0, index)
}

impl<B: Kernels> Affine<B> {
    /// Applies the layer to the last dimension of `x`, client c's rows (dimension 0) with
    /// client c's weights.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, cohort: &Cohort) -> Tensor<B, D> {
        let bias = self.bias.as_ref().map(Param::val);
        let y = match &self.weight {
            Weight::Dense(w) => kernels::cohort_affine(x, w.val(), bias, cohort),
            Weight::Factorized(f) => {
                let projected = kernels::cohort_affine(x, f.v.val(), None, cohort)
                    * per_row(f.omega.clone(), cohort);
                kernels::cohort_affine(projected, f.u.val().swap_dims(1, 2), bias, cohort)
            }
        };
        scaled(y, self.scaler)
    }
}

/// A 2-D convolution whose weight `c_out × c_in × kh × kw` is held as the matrix
/// `c_out × (c_in kh kw)` (row-major over (c_in, kh, kw), docs/algorithms.md §1.8), per client.
///
/// Factorized, it runs in whichever form costs fewer multiply-adds per output position
/// ([`factors_are_cheaper`], which simulated time counts by too): as a
/// convolution with the n filters `Diag(ω)·V` (filter j = ω_j v'_{I_j} reshaped to
/// `(c_in, kh, kw)`) followed by a 1×1 convolution with `Uᵀ`, `n·(c_in kh kw + c_out)`; or as
/// one convolution with the composed `Uᵀ·Diag(ω)·V`, `c_out·c_in kh kw`. Both are the same
/// linear map; the gradients reach U and V through either.
#[derive(Module, Debug)]
pub struct Conv<B: Backend> {
    pub weight: Weight<B>,
    /// `C × c_out`.
    pub bias: Option<Param<Tensor<B, 2>>>,
    /// HeteroFL's scaler, as [`Affine::scaler`].
    #[module(skip)]
    pub scaler: Option<f64>,
    pub in_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl<B: Kernels> Conv<B> {
    fn geometry(&self) -> ConvGeometry {
        ConvGeometry {
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
        }
    }

    /// `x`: `N × C_in × H × W`, client c's images (dimension 0) with client c's filters.
    pub fn forward(&self, x: Tensor<B, 4>, cohort: &Cohort) -> Tensor<B, 4> {
        let bias = self.bias.as_ref().map(Param::val);
        let y = match &self.weight {
            Weight::Dense(w) => kernels::cohort_conv2d(x, w.val(), bias, self.geometry(), cohort),
            Weight::Factorized(f) => {
                let [clients, n, patch] = f.v.dims();
                let c_out = f.u.dims()[2];
                // Diag(ω)·V, C × n × c_in kh kw.
                let scaled_v = f.v.val() * f.omega.clone().reshape([clients, n, 1]);
                let u_t = f.u.val().swap_dims(1, 2);
                if factors_are_cheaper(n, c_out, patch) {
                    let h = kernels::cohort_conv2d(x, scaled_v, None, self.geometry(), cohort);
                    let one_by_one = ConvGeometry {
                        kernel: [1, 1],
                        stride: [1, 1],
                        padding: [0, 0],
                    };
                    kernels::cohort_conv2d(h, u_t, bias, one_by_one, cohort)
                } else {
                    // Uᵀ·(Diag(ω)·V) = linear(Uᵀ, (Diag(ω)·V)ᵀ), per client.
                    let composed = kernels::cohort_affine(
                        u_t,
                        scaled_v.swap_dims(1, 2),
                        None,
                        &Cohort::stacked(clients),
                    );
                    kernels::cohort_conv2d(x, composed, bias, self.geometry(), cohort)
                }
            }
        };
        scaled(y, self.scaler)
    }
}

/// A trainable parameter from row-major data (moved into the tensor, not copied).
pub fn param<B: Backend, const D: usize>(
    data: Vec<f32>,
    shape: [usize; D],
    device: &B::Device,
) -> Param<Tensor<B, D>> {
    Param::from_tensor(Tensor::from_data(TensorData::new(data, shape), device))
}
