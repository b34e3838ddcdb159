//! The paper's character-level model: token and position embeddings, three pre-norm GPT-2
//! blocks, a final layer norm and a linear head.
//!
//! Every affine layer inside the blocks (q, k, v, o and both MLP layers) is shardable; the
//! embedding (first) and the head (last) stay dense. A batch row holds `context` token ids as
//! floats; the model predicts the next character at every position (the targets are the row
//! shifted by one), so the logits are `(N · context) × vocab`.

use crate::models::NetError;
use crate::models::blocks::{LayerNorm, TransformerBlock};
use crate::models::builder::{Builder, Init};
use crate::models::kernels::Kernels;
use crate::models::layers::{Affine, Weight};
use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::module::embedding;

/// Width, heads and depth of the character transformer.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CharShape {
    pub vocab: usize,
    pub context: usize,
    pub width: usize,
    pub heads: usize,
    pub blocks: usize,
}

impl Default for CharShape {
    /// The paper's model: d_model 128, 4 heads, 3 blocks, 80 characters of context.
    fn default() -> Self {
        Self {
            vocab: crate::data::shakespeare::VOCAB_SIZE,
            context: 80,
            width: 128,
            heads: 4,
            blocks: 3,
        }
    }
}

#[derive(Module, Debug)]
pub struct CharTransformer<B: Backend> {
    pub tokens: Param<Tensor<B, 2>>,
    pub positions: Param<Tensor<B, 2>>,
    pub blocks: Vec<TransformerBlock<B>>,
    pub ln: LayerNorm<B>,
    pub head: Affine<B>,
}

impl<B: Kernels> CharTransformer<B> {
    pub fn new(b: &mut Builder<B>, s: CharShape) -> Result<Self, NetError> {
        let blocks = (0..s.blocks)
            .map(|i| TransformerBlock::new(b, &format!("block{i}"), s.width, s.heads, 4 * s.width))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            tokens: b.tensor("tokens", [s.vocab, s.width], Init::Normal(0.02))?,
            positions: b.tensor("positions", [s.context, s.width], Init::Normal(0.02))?,
            blocks,
            ln: LayerNorm::new(b, "ln", s.width)?,
            head: b.affine("head", s.width, s.vocab, true, false)?,
        })
    }

    /// `x`: `N × context` token ids (as floats) → `(N · context) × vocab` logits.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [n, t] = x.dims();
        let d = self.positions.dims()[1];
        let h = embedding(self.tokens.val(), x.int())
            + self.positions.val().narrow(0, 0, t).reshape([1, t, d]);
        let h = self
            .blocks
            .iter()
            .fold(h, |h, block| block.forward(h, true));
        let logits = self.head.forward(self.ln.forward(h));
        let vocab = logits.dims()[2];
        logits.reshape([n * t, vocab])
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        let mut w: Vec<&Weight<B>> = self.blocks.iter().flat_map(|b| b.weights()).collect();
        w.push(&self.head.weight);
        w
    }
}
