//! A small CNN for 28 × 28 digits (MNIST): three 3×3 convolutions and two linear layers, the
//! digits CNN's shape at MNIST's resolution.
//!
//! `conv0` (first, 1 → 16) and `fc1` (last) stay dense; `conv1` (16 → 32), `conv2` (32 → 64)
//! and `fc0` (64·7·7 → 128) are shardable. The two 2×2 max-poolings come after `conv1` and
//! `conv2` (28 → 14 → 7), so the costly 3×3 convolutions run at 28 × 28 only for 16 and 32
//! channels, about 8 M multiply-adds per image forward. GroupNorm after every convolution and
//! LayerNorm after `fc0`, as in [`DigitsCnn`](super::cnn::DigitsCnn): without them a sub-model
//! with multipliers ω well above 1 blows its activations up layer after layer.

use crate::models::blocks::{GroupNorm, LayerNorm};
use crate::models::builder::Builder;
use crate::models::kernels::{Kernels, Pool, pool};
use crate::models::layers::{Affine, Conv, Weight};
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;

#[derive(Module, Debug)]
pub struct MnistCnn<B: Backend> {
    pub conv0: Conv<B>,
    pub norm0: GroupNorm<B>,
    pub conv1: Conv<B>,
    pub norm1: GroupNorm<B>,
    pub conv2: Conv<B>,
    pub norm2: GroupNorm<B>,
    pub fc0: Affine<B>,
    pub norm3: LayerNorm<B>,
    pub fc1: Affine<B>,
}

/// Groups of the GroupNorm layers.
const GROUPS: usize = 2;
/// Input side of the images.
pub const SIDE: usize = 28;
/// Channels × side² after the second pooling, the width of `fc0`'s input.
const FLAT: usize = 64 * (SIDE / 4) * (SIDE / 4);

impl<B: Kernels> MnistCnn<B> {
    pub fn new(b: &mut Builder<B>, classes: usize) -> Result<Self, String> {
        Ok(Self {
            conv0: b.conv("conv0", 1, 16, 3, 1, 1, true, false)?,
            norm0: GroupNorm::new(b, "norm0", 16, GROUPS)?,
            conv1: b.conv("conv1", 16, 32, 3, 1, 1, true, true)?,
            norm1: GroupNorm::new(b, "norm1", 32, GROUPS)?,
            conv2: b.conv("conv2", 32, 64, 3, 1, 1, true, true)?,
            norm2: GroupNorm::new(b, "norm2", 64, GROUPS)?,
            fc0: b.affine("fc0", FLAT, 128, true, true)?,
            norm3: LayerNorm::new(b, "norm3", 128)?,
            fc1: b.affine("fc1", 128, classes, true, false)?,
        })
    }

    /// `x`: `N × 784` pixel rows.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let n = x.dims()[0];
        let h = x.reshape([n, 1, SIDE, SIDE]);
        let h = self.norm0.forward_relu(self.conv0.forward(h));
        let h = self.norm1.forward_relu(self.conv1.forward(h));
        let h = pool(h, Pool::Max, 2);
        let h = self.norm2.forward_relu(self.conv2.forward(h));
        let h = pool(h, Pool::Max, 2);
        let h = relu(self.norm3.forward(self.fc0.forward(h.reshape([n, FLAT]))));
        self.fc1.forward(h)
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
