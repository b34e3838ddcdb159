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

use crate::models::kernels::{self, ConvGeometry, Kernels};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
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

/// The frozen-multiplier factorisation of one layer's weight matrix.
#[derive(Module, Debug)]
pub struct Factors<B: Backend> {
    /// `n × c_out`: row j is the left factor u'_{I_j}.
    pub u: Param<Tensor<B, 2>>,
    /// `n × c_in_eff`: row j is the right factor v'_{I_j}.
    pub v: Param<Tensor<B, 2>>,
    /// ω_{I_j}, a constant of the local problem.
    pub omega: Tensor<B, 1>,
}

impl<B: Backend> Factors<B> {
    /// Builds the factors from row-major data, checking the lengths against the shapes.
    pub fn from_rows(
        left: &[f32],
        right: &[f32],
        multipliers: &[f32],
        rows: usize,
        cols: usize,
        device: &B::Device,
    ) -> Result<Self, FactorError> {
        let n = multipliers.len();
        if n == 0 {
            return Err(FactorError::NoTerms);
        }
        if left.len() != n * rows || right.len() != n * cols {
            return Err(FactorError::Lengths {
                left: left.len(),
                right: right.len(),
                terms: n,
                rows,
                cols,
            });
        }
        Ok(Self {
            u: param(left.to_vec(), [n, rows], device),
            v: param(right.to_vec(), [n, cols], device),
            omega: Tensor::from_data(TensorData::new(multipliers.to_vec(), [n]), device),
        })
    }

    /// Kept terms n.
    pub fn terms(&self) -> usize {
        self.omega.dims()[0]
    }

    /// The ClipLR factor of each term, `min(1, τ/ω_i)`, as an `n × 1` column to scale the rows
    /// of the factor gradients (docs/algorithms.md §1.7).
    pub fn clip_scale(&self, tau: f64) -> Tensor<B, 2> {
        let n = self.terms();
        self.omega
            .clone()
            .recip()
            .mul_scalar(tau)
            .clamp_max(1.0)
            .reshape([n, 1])
    }
}

/// How a layer's weight is held.
#[derive(Module, Debug)]
pub enum Weight<B: Backend> {
    /// The whole `c_out × c_in_eff` matrix (conv: `c_out × c_in × kh × kw`, flattened).
    Dense(Param<Tensor<B, 2>>),
    /// A spectral shard.
    Factorized(Factors<B>),
}

/// `y = W x + b` for the last dimension of `x`.
#[derive(Module, Debug)]
pub struct Affine<B: Backend> {
    pub weight: Weight<B>,
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Kernels> Affine<B> {
    /// Applies the layer to the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        // A shape of ones but the last dimension, to broadcast a vector over the rows.
        let along_rows = |v: Tensor<B, 1>| {
            let mut shape = [1; D];
            shape[D - 1] = v.dims()[0];
            v.reshape(shape)
        };
        let bias = self.bias.as_ref().map(Param::val);
        match &self.weight {
            Weight::Dense(w) => kernels::affine(x, w.val(), bias),
            Weight::Factorized(f) => {
                let projected = kernels::linear(x, f.v.val()) * along_rows(f.omega.clone());
                kernels::affine(projected, f.u.val().transpose(), bias)
            }
        }
    }
}

/// A 2-D convolution whose weight `c_out × c_in × kh × kw` is held as the matrix
/// `c_out × (c_in kh kw)` (row-major over (c_in, kh, kw), docs/algorithms.md §1.8).
///
/// Factorized, it runs in whichever order costs fewer multiply-adds per output position: as a
/// convolution with the n filters `Diag(ω)·V` (filter j = ω_j v'_{I_j} reshaped to
/// `(c_in, kh, kw)`) followed by a 1×1 convolution with `Uᵀ`, `n·(c_in kh kw + c_out)`; or as
/// one convolution with the composed `Uᵀ·Diag(ω)·V`, `c_out·c_in kh kw`. Both are the same
/// linear map; the gradients reach U and V through either.
#[derive(Module, Debug)]
pub struct Conv<B: Backend> {
    pub weight: Weight<B>,
    pub bias: Option<Param<Tensor<B, 1>>>,
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

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let bias = self.bias.as_ref().map(Param::val);
        match &self.weight {
            Weight::Dense(w) => kernels::conv2d(x, w.val(), bias, self.geometry()),
            Weight::Factorized(f) => {
                let [n, patch] = f.v.dims();
                let c_out = f.u.dims()[1];
                // Diag(ω)·V, n × c_in kh kw.
                let scaled_v = f.v.val() * f.omega.clone().reshape([n, 1]);
                if n * (patch + c_out) < c_out * patch {
                    let h = kernels::conv2d(x, scaled_v, None, self.geometry());
                    let one_by_one = ConvGeometry {
                        kernel: [1, 1],
                        stride: [1, 1],
                        padding: [0, 0],
                    };
                    kernels::conv2d(h, f.u.val().transpose(), bias, one_by_one)
                } else {
                    // Uᵀ·(Diag(ω)·V) = linear(Uᵀ, (Diag(ω)·V)ᵀ).
                    let composed = kernels::linear(f.u.val().transpose(), scaled_v.transpose());
                    kernels::conv2d(x, composed, bias, self.geometry())
                }
            }
        }
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
