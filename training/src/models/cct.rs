//! CCT-6/3x2, the Compact Convolutional Transformer for 32×32 inputs: a tokenizer of two 3×3
//! convolutions (each ReLU + 3×3 max-pool with stride 2), a learned positional embedding,
//! six pre-norm transformer blocks (width 256, 4 heads, MLP ratio 2), sequence pooling (an
//! attention-weighted mean of the tokens) and a linear classifier.
//!
//! The first tokenizer convolution and the classifier stay dense; the second tokenizer
//! convolution and every affine layer in the blocks are shardable. GPU-scale: on CPU it is
//! built, run and sharded in tests only.
//!
//! Under a width strategy the constructor builds the widths the builder keeps
//! ([`Builder::units`]): the first tokenizer convolution's channels (`tokenizer0`, read only by
//! the second), and each block's heads and MLP units as in the character transformer. The
//! embedding width (the second tokenizer convolution's output, the positions, every layer
//! norm, the pooling and the classifier) stays whole: every block adds into it.

use crate::models::NetError;
use crate::models::blocks::{LayerNorm, TransformerBlock};
use crate::models::builder::{Builder, Init};
use crate::models::kernels::{Cohort, Kernels, MaxWindow, max_pool};
use crate::models::layers::{Affine, Conv, Weight, gather_rows};
use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::activation::{relu, softmax};
use burn::tensor::backend::Backend;

/// The embedding (residual) width.
pub const WIDTH: usize = 256;
/// Attention heads of every block.
pub const HEADS: usize = 4;
/// Transformer blocks.
pub const BLOCKS: usize = 6;
/// A block's MLP width over the embedding width.
pub const MLP_RATIO: usize = 2;
/// Output channels of the first tokenizer convolution.
pub const TOKENIZER_CHANNELS: usize = 64;
/// 32×32 → 16×16 → 8×8 after the two pooled tokenizer stages.
const TOKENS: usize = 64;

#[derive(Module, Debug)]
pub struct Cct<B: Backend> {
    pub tokenizer0: Conv<B>,
    pub tokenizer1: Conv<B>,
    /// `C × tokens × width`, per client.
    pub positions: Param<Tensor<B, 3>>,
    pub blocks: Vec<TransformerBlock<B>>,
    pub ln: LayerNorm<B>,
    pub pool: Affine<B>,
    pub fc: Affine<B>,
}

impl<B: Kernels> Cct<B> {
    /// The layers in the order their initial values are drawn (blocks first), at the widths
    /// the builder keeps.
    pub fn new(b: &mut Builder<B>, classes: usize) -> Result<Self, NetError> {
        b.at_positions(TOKENS);
        let blocks = (0..BLOCKS)
            .map(|i| {
                TransformerBlock::new(
                    b,
                    &format!("block{i}"),
                    WIDTH,
                    HEADS,
                    MLP_RATIO * WIDTH,
                    false,
                )
            })
            .collect::<Result<_, _>>()?;
        let channels = b.units("tokenizer0", TOKENIZER_CHANNELS);
        b.at_positions(32 * 32);
        let tokenizer0 = b.conv("tokenizer0", 3, channels, 3, 1, 1, false, false)?;
        b.at_positions(16 * 16);
        let tokenizer1 = b.conv("tokenizer1", channels, WIDTH, 3, 1, 1, false, true)?;
        let positions = b.matrix("positions", [TOKENS, WIDTH], Init::Normal(0.02))?;
        let ln = LayerNorm::new(b, "ln", WIDTH)?;
        b.at_positions(TOKENS);
        let pool = b.affine("pool", WIDTH, 1, true, false)?;
        // The pooling's weighted sum of the tokens.
        b.between_activations(WIDTH);
        b.at_positions(1);
        let fc = b.affine("fc", WIDTH, classes, true, false)?;
        Ok(Self {
            tokenizer0,
            tokenizer1,
            positions,
            blocks,
            ln,
            pool,
            fc,
        })
    }

    /// `x`: `N × 3072` rows of 3×32×32 images.
    pub fn forward(&self, x: Tensor<B, 2>, c: &Cohort) -> Tensor<B, 2> {
        let n = x.dims()[0];
        let window = MaxWindow {
            size: 3,
            stride: 2,
            padding: 1,
        };
        let pool = |h| max_pool(h, window);
        let h = pool(relu(self.tokenizer0.forward(x.reshape([n, 3, 32, 32]), c)));
        let h = pool(relu(self.tokenizer1.forward(h, c)));
        let tokens = h.reshape([n, WIDTH, TOKENS]).swap_dims(1, 2);
        let clients = self.positions.dims()[0];
        let positions = self.positions.val().reshape([clients, TOKENS * WIDTH]);
        let h = tokens + gather_rows(positions, c).reshape([n, TOKENS, WIDTH]);
        let h = self.blocks.iter().fold(h, |h, block| block.forward(h, c));
        let h = self.ln.forward(h, c);
        let attention = softmax(self.pool.forward(h.clone(), c), 1);
        let pooled = attention.swap_dims(1, 2).matmul(h).reshape([n, WIDTH]);
        self.fc.forward(pooled, c)
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        let mut w = vec![&self.tokenizer0.weight, &self.tokenizer1.weight];
        w.extend(self.blocks.iter().flat_map(TransformerBlock::weights));
        w.extend([&self.pool.weight, &self.fc.weight]);
        w
    }
}
