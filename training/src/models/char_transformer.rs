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
use crate::models::kernels::{Cohort, Kernels};
use crate::models::layers::{Affine, Weight, gather_rows};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor, TensorData};

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
    /// `C × vocab × d`, per client.
    pub tokens: Param<Tensor<B, 3>>,
    /// `C × context × d`, per client.
    pub positions: Param<Tensor<B, 3>>,
    pub blocks: Vec<TransformerBlock<B>>,
    pub ln: LayerNorm<B>,
    pub head: Affine<B>,
}

impl<B: Kernels> CharTransformer<B> {
    pub fn new(b: &mut Builder<B>, s: CharShape) -> Result<Self, NetError> {
        // A sample is a window: every layer applies at each of its tokens.
        b.at_positions(s.context);
        let blocks = (0..s.blocks)
            .map(|i| {
                TransformerBlock::new(b, &format!("block{i}"), s.width, s.heads, 4 * s.width, true)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            tokens: b.matrix("tokens", [s.vocab, s.width], Init::Normal(0.02))?,
            positions: b.matrix("positions", [s.context, s.width], Init::Normal(0.02))?,
            blocks,
            ln: LayerNorm::new(b, "ln", s.width)?,
            head: b.affine("head", s.width, s.vocab, true, false)?,
        })
    }

    /// `x`: `N × context` token ids (as floats) → `(N · context) × vocab` logits.
    pub fn forward(&self, x: Tensor<B, 2>, c: &Cohort) -> Tensor<B, 2> {
        let [n, t] = x.dims();
        let [clients, vocab, d] = self.tokens.dims();
        // Client c's tokens are rows c·vocab.. of the clients' tables stacked into one.
        let mut ids = x.int();
        if clients > 1 {
            let offsets: Vec<i64> = c
                .client_of_rows()
                .into_iter()
                .map(|k| k * vocab as i64)
                .collect();
            let offsets = TensorData::new(offsets, [n, 1]);
            let device = ids.device();
            ids = ids + Tensor::<B, 2, Int>::from_data(offsets, &device);
        }
        let tokens = self.tokens.val().reshape([clients * vocab, d]);
        let positions = self
            .positions
            .val()
            .narrow(1, 0, t)
            .reshape([clients, t * d]);
        let h = embedding(tokens, ids) + gather_rows(positions, c).reshape([n, t, d]);
        let h = self.blocks.iter().fold(h, |h, block| block.forward(h, c));
        let logits = self.head.forward(self.ln.forward(h, c), c);
        let vocab = logits.dims()[2];
        logits.reshape([n * t, vocab])
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        let mut w: Vec<&Weight<B>> = self.blocks.iter().flat_map(|b| b.weights()).collect();
        w.push(&self.head.weight);
        w
    }
}
