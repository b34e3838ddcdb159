//! The small CNN of the digits and MNIST runs: three 3×3 convolutions and two linear layers,
//! at the input size a [`CnnShape`] gives.
//!
//! `conv0` (first) and `fc1` (last) stay dense; `conv1`, `conv2` and `fc0` are shardable (with
//! the reference widths, N = 32, 64 and 128 terms). A 2×2 pooling follows `conv1` and `conv2`,
//! so the costly 3×3 convolutions run at full resolution only for the narrow first layers.
//! Every convolution is followed by GroupNorm and `fc0` by LayerNorm, as the paper's ResNet-18
//! uses GroupNorm: a sub-model with multipliers ω = 1/π well above 1 (Unbiased, Collective,
//! PriSM+Wallenius at small keep ratios) otherwise blows its activations up layer after layer,
//! and its local training diverges in the first round.

use crate::models::NetError;
use crate::models::blocks::{GroupNorm, LayerNorm};
use crate::models::builder::Builder;
use crate::models::kernels::{Cohort, Kernels, Pool, pool};
use crate::models::layers::{Affine, Conv, Weight};
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;

/// Input and widths of a [`Cnn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CnnShape {
    /// Channels of the input images.
    pub channels: usize,
    /// Side of the square input images; a multiple of 4 (two 2×2 poolings).
    pub side: usize,
    /// Output channels of `conv0`, `conv1` and `conv2`.
    pub widths: [usize; 3],
    /// Width of `fc0`.
    pub hidden: usize,
    /// How the pooling after `conv2` reduces its blocks (the one after `conv1` takes the max).
    pub last_pool: Pool,
}

impl CnnShape {
    /// The 8×8 digits (4 × 4 → 2 × 2 by averaging after `conv2`).
    pub const DIGITS: Self = Self {
        channels: 1,
        side: 8,
        widths: [16, 32, 64],
        hidden: 128,
        last_pool: Pool::Average,
    };

    /// MNIST's 28 × 28 digits (28 → 14 → 7 by max-pooling), about 8 M multiply-adds per image
    /// forward.
    pub const MNIST: Self = Self {
        channels: 1,
        side: 28,
        widths: [16, 32, 64],
        hidden: 128,
        last_pool: Pool::Max,
    };

    /// Features per input row: channels × side².
    pub fn input_width(&self) -> usize {
        self.channels * self.side * self.side
    }

    /// Channels × side² after the second pooling, the width of `fc0`'s input.
    fn flat(&self) -> usize {
        self.widths[2] * (self.side / 4) * (self.side / 4)
    }
}

#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    pub conv0: Conv<B>,
    pub norm0: GroupNorm<B>,
    pub conv1: Conv<B>,
    pub norm1: GroupNorm<B>,
    pub conv2: Conv<B>,
    pub norm2: GroupNorm<B>,
    pub fc0: Affine<B>,
    pub norm3: LayerNorm<B>,
    pub fc1: Affine<B>,
    #[module(skip)]
    pub shape: CnnShape,
}

/// Groups of the GroupNorm layers.
pub const GROUPS: usize = 2;

impl<B: Kernels> Cnn<B> {
    /// The CNN at `shape`, narrowed to the widths the builder's [`units`](Builder::units)
    /// keeps (`conv0`, `conv1`, `conv2` channels, `fc0` units; the global model's in init
    /// mode). The built model's `shape` holds the kept widths, which its forward reshapes by.
    pub fn new(b: &mut Builder<B>, shape: CnnShape, classes: usize) -> Result<Self, NetError> {
        let mut shape = shape;
        for (i, w) in shape.widths.iter_mut().enumerate() {
            *w = b.units(&format!("conv{i}"), *w);
        }
        shape.hidden = b.units("fc0", shape.hidden);
        let [w0, w1, w2] = shape.widths;
        let side = shape.side;
        b.at_positions(side * side);
        let conv0 = b.conv("conv0", shape.channels, w0, 3, 1, 1, true, false)?;
        let norm0 = GroupNorm::new(b, "norm0", w0, GROUPS)?;
        let conv1 = b.conv("conv1", w0, w1, 3, 1, 1, true, true)?;
        let norm1 = GroupNorm::new(b, "norm1", w1, GROUPS)?;
        // After the first 2×2 pooling.
        b.at_positions((side / 2) * (side / 2));
        let conv2 = b.conv("conv2", w1, w2, 3, 1, 1, true, true)?;
        let norm2 = GroupNorm::new(b, "norm2", w2, GROUPS)?;
        b.at_positions(1);
        Ok(Self {
            conv0,
            norm0,
            conv1,
            norm1,
            conv2,
            norm2,
            fc0: b.affine("fc0", shape.flat(), shape.hidden, true, true)?,
            norm3: LayerNorm::new(b, "norm3", shape.hidden)?,
            fc1: b.affine("fc1", shape.hidden, classes, true, false)?,
            shape,
        })
    }

    /// `x`: `N × (channels · side²)` pixel rows, client after client.
    pub fn forward(&self, x: Tensor<B, 2>, c: &Cohort) -> Tensor<B, 2> {
        let CnnShape { channels, side, .. } = self.shape;
        let n = x.dims()[0];
        let h = x.reshape([n, channels, side, side]);
        let h = self.norm0.forward_relu(self.conv0.forward(h, c), c);
        let h = self.norm1.forward_relu(self.conv1.forward(h, c), c);
        let h = pool(h, Pool::Max, 2);
        let h = self.norm2.forward_relu(self.conv2.forward(h, c), c);
        let h = pool(h, self.shape.last_pool, 2);
        let h = self.fc0.forward(h.reshape([n, self.shape.flat()]), c);
        self.fc1.forward(relu(self.norm3.forward(h, c)), c)
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        vec![
            &self.conv0.weight,
            &self.conv1.weight,
            &self.conv2.weight,
            &self.fc0.weight,
            &self.fc1.weight,
        ]
    }
}
