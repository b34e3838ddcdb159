//! A multilayer perceptron on flat features: dense first and last layers, shardable hidden
//! layers in between (`64 → 128 → 10` is the `digits-mlp` reference point of `bench train`).
//! Without hidden layers it is softmax regression, and its one layer, both first and last, is
//! shardable: it is the whole model, so keeping it dense would leave nothing to shard.

use crate::models::NetError;
use crate::models::builder::Builder;
use crate::models::kernels::{Cohort, Kernels};
use crate::models::layers::{Affine, Weight};
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub layers: Vec<Affine<B>>,
}

impl<B: Kernels> Mlp<B> {
    /// Layers `fc0 … fc{L}` of widths `input → hidden… → classes` (the hidden widths the
    /// builder's [`units`](Builder::units) keeps of them).
    pub fn new(
        b: &mut Builder<B>,
        input: usize,
        hidden: &[usize],
        classes: usize,
    ) -> Result<Self, NetError> {
        // A width slice keeps some units of every hidden layer (`fc{i}`'s outputs).
        let widths: Vec<usize> = std::iter::once(input)
            .chain(
                hidden
                    .iter()
                    .enumerate()
                    .map(|(i, &h)| b.units(&format!("fc{i}"), h)),
            )
            .chain(std::iter::once(classes))
            .collect();
        let last = widths.len() - 2;
        let shardable = |i: usize| last == 0 || (i != 0 && i != last);
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| b.affine(&format!("fc{i}"), w[0], w[1], true, shardable(i)))
            .collect::<Result<_, _>>()?;
        Ok(Self { layers })
    }

    pub fn forward(&self, x: Tensor<B, 2>, cohort: &Cohort) -> Tensor<B, 2> {
        let last = self.layers.len() - 1;
        self.layers.iter().enumerate().fold(x, |h, (i, layer)| {
            let y = layer.forward(h, cohort);
            if i == last { y } else { relu(y) }
        })
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        self.layers.iter().map(|l| &l.weight).collect()
    }
}
