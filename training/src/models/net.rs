//! The neural models by name, and the one interface local training needs from them.

use crate::models::NetError;
use crate::models::builder::{Builder, Layout, Task, export};
use crate::models::cct::Cct;
use crate::models::char_transformer::{CharShape, CharTransformer};
use crate::models::cnn::{Cnn, CnnShape};
use crate::models::kernels::{Cohort, Kernels};
use crate::models::layers::Weight;
use crate::models::mlp::Mlp;
use crate::models::network::Network;
use crate::models::onnx::{OnnxFile, OnnxNet};
use crate::models::resnet::ResNet18;
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use fedshard_protocol::model::ModelState;
use fedshard_protocol::task::LayerShard;
use fedshard_protocol::work::Arithmetic;
use serde::{Deserialize, Serialize};

/// A neural architecture and its sizes, as the `[model]` section names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "architecture", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Architecture {
    /// Flat features → hidden widths → classes.
    Mlp {
        inputs: usize,
        hidden: Vec<usize>,
        classes: usize,
    },
    /// The small CNN at the 8×8 digits' size ([`CnnShape::DIGITS`]).
    DigitsCnn { classes: usize },
    /// The small CNN at MNIST's 28×28 ([`CnnShape::MNIST`]).
    MnistCnn { classes: usize },
    /// The 3-block GPT-2-style character model.
    CharTransformer(CharShape),
    /// ResNet-18 (GroupNorm, 3×3 first conv) for 3×32×32 inputs.
    Resnet18 { classes: usize },
    /// CCT-6/3x2 for 3×32×32 inputs.
    Cct { classes: usize },
    /// A model read from an ONNX file (docs/onnx.md): every Gemm/MatMul and Conv weight
    /// shardable, its initial values the file's initializers.
    Onnx { path: OnnxFile },
}

impl Architecture {
    /// The `digits-mlp` reference: 64 → 128 → 10.
    pub fn digits_mlp() -> Self {
        Architecture::Mlp {
            inputs: 64,
            hidden: vec![128],
            classes: 10,
        }
    }

    /// Features per input row.
    pub fn input_width(&self) -> usize {
        match self {
            Architecture::Mlp { inputs, .. } => *inputs,
            Architecture::DigitsCnn { .. } => CnnShape::DIGITS.input_width(),
            Architecture::MnistCnn { .. } => CnnShape::MNIST.input_width(),
            Architecture::CharTransformer(s) => s.context,
            Architecture::Resnet18 { .. } | Architecture::Cct { .. } => 3 * 32 * 32,
            Architecture::Onnx { path } => path.model.input_width(),
        }
    }

    /// Builds the model through `builder` (init or load mode).
    pub fn build<B: Kernels>(&self, builder: &mut Builder<B>) -> Result<Net<B>, NetError> {
        Ok(match self {
            Architecture::Mlp {
                inputs,
                hidden,
                classes,
            } => Net::Mlp(Mlp::new(builder, *inputs, hidden, *classes)?),
            Architecture::DigitsCnn { classes } => {
                Net::Cnn(Cnn::new(builder, CnnShape::DIGITS, *classes)?)
            }
            Architecture::MnistCnn { classes } => {
                Net::Cnn(Cnn::new(builder, CnnShape::MNIST, *classes)?)
            }
            Architecture::CharTransformer(s) => {
                Net::CharTransformer(CharTransformer::new(builder, *s)?)
            }
            Architecture::Resnet18 { classes } => Net::Resnet18(ResNet18::new(builder, *classes)?),
            Architecture::Cct { classes } => Net::Cct(Cct::new(builder, *classes)?),
            Architecture::Onnx { path } => {
                Net::Onnx(OnnxNet::new(builder, path.model.plan_for(builder))?)
            }
        })
    }

    /// The initial global model drawn from `seed`, and the names of the weights spectral
    /// sharding may factorise (everything affine or convolutional but the first and last layer).
    pub fn initial_state(&self, seed: u64) -> Result<(ModelState, Vec<String>), NetError> {
        let device = Default::default();
        let mut builder = match self {
            Architecture::Onnx { path } => Builder::given(path.model.initial_state(), &device),
            _ => Builder::<burn::backend::NdArray>::init(seed, &device),
        };
        self.build(&mut builder)?;
        let (_, init) = builder.finish()?;
        Ok(init.expect("an init-mode builder always records its state"))
    }

    /// Where one sample's forward pass multiplies: what simulated time counts a task's
    /// multiply-adds by ([`fedshard_protocol::work`]). Builds the model once.
    pub fn arithmetic(&self) -> Result<Arithmetic, NetError> {
        let device = Default::default();
        let mut builder = match self {
            Architecture::Onnx { path } => Builder::given(path.model.initial_state(), &device),
            _ => Builder::<burn::backend::NdArray>::init(0, &device),
        };
        self.build(&mut builder)?;
        Ok(builder.arithmetic().clone())
    }

    /// A client's sub-model from a task's dense tensors and shards.
    pub fn load<B: Kernels>(
        &self,
        dense: &ModelState,
        shards: &[LayerShard],
        device: &B::Device,
    ) -> Result<(Net<B>, Layout), NetError> {
        self.load_cohort(&[(dense, shards, None)], device)
    }

    /// The sub-models of a cohort's clients (one sub-model shape) as one stacked model
    /// (narrowed when the tasks carry a width slice: [`Network::load_cohort`]).
    pub fn load_cohort<B: Kernels>(
        &self,
        tasks: &[Task<'_>],
        device: &B::Device,
    ) -> Result<(Net<B>, Layout), NetError> {
        <Self as Network>::load_cohort(self, tasks, device)
    }
}

/// A built model of any architecture (built once per task, so the variants' sizes do not matter).
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Net<B: Backend> {
    Mlp(Mlp<B>),
    Cnn(Cnn<B>),
    CharTransformer(CharTransformer<B>),
    Resnet18(ResNet18<B>),
    Cct(Cct<B>),
    Onnx(OnnxNet<B>),
}

impl<B: Kernels> Net<B> {
    /// Logits, one row per prediction: per sample for classifiers, per sample and position for
    /// the character model. `cohort` says which rows of `x` are whose (one client: all).
    pub fn forward(&self, x: Tensor<B, 2>, cohort: &Cohort) -> Tensor<B, 2> {
        match self {
            Net::Mlp(m) => m.forward(x, cohort),
            Net::Cnn(m) => m.forward(x, cohort),
            Net::CharTransformer(m) => m.forward(x, cohort),
            Net::Resnet18(m) => m.forward(x, cohort),
            Net::Cct(m) => m.forward(x, cohort),
            Net::Onnx(m) => m.forward(x, cohort),
        }
    }

    /// Every affine and convolutional weight: the Frobenius-decay terms and the ClipLR targets.
    pub fn weights(&self) -> Vec<&Weight<B>> {
        match self {
            Net::Mlp(m) => m.weights(),
            Net::Cnn(m) => m.weights(),
            Net::CharTransformer(m) => m.weights(),
            Net::Resnet18(m) => m.weights(),
            Net::Cct(m) => m.weights(),
            Net::Onnx(m) => m.weights(),
        }
    }

    /// The trained tensors in the server's form, one result per task the model was loaded
    /// from (see [`export`]).
    pub fn export(
        &self,
        layout: &Layout,
        tasks: &[Task<'_>],
    ) -> Result<Vec<(ModelState, Vec<LayerShard>)>, NetError> {
        export(self, layout, tasks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::work::ModelWork;

    /// Multiply-adds of one sample's forward pass through the full model.
    fn count(arch: Architecture) -> u64 {
        let (state, _) = arch.initial_state(0).expect("builds");
        ModelWork::new(arch.arithmetic().expect("builds"), &state).full()
    }

    /// Each weight counted at its layer's output positions and the products between
    /// activations at their width, against counts by hand for every shipped model: the CNNs (a
    /// 2×2 pooling after conv1 and after conv2), ResNet-18 on 32×32 (0.56 G multiply-adds an
    /// image, the figure usually quoted for it), CCT and the character transformer.
    #[test]
    fn the_multiply_add_count_matches_a_hand_count_of_every_model() {
        assert_eq!(count(Architecture::digits_mlp()), 64 * 128 + 128 * 10);
        let cnn = |side: u64| {
            let flat = 64 * (side / 4) * (side / 4);
            16 * 9 * side * side
                + 32 * 144 * side * side
                + 64 * 288 * (side / 2) * (side / 2)
                + 128 * flat
                + 10 * 128
        };
        assert_eq!(count(Architecture::DigitsCnn { classes: 10 }), cnn(8));
        assert_eq!(count(Architecture::MnistCnn { classes: 10 }), cnn(28));
        // The stem at 32², then per stage (side 32, 16, 8, 4) four 3×3 convolutions of c
        // channels and, from the second stage, a 1×1 shortcut from c/2 channels.
        let stage = |c: u64, side: u64, first: bool| {
            let positions = side * side;
            let convs = if first {
                4 * c * c * 9
            } else {
                c * (c / 2) * 9 + 3 * c * c * 9 + c * (c / 2)
            };
            convs * positions
        };
        let resnet = 64 * 27 * 1024
            + stage(64, 32, true)
            + stage(128, 16, false)
            + stage(256, 8, false)
            + stage(512, 4, false)
            + 512 * 10;
        assert_eq!(resnet, 555_422_720);
        assert_eq!(count(Architecture::Resnet18 { classes: 10 }), resnet);
        // A transformer block of width d and MLP width h applies its four d × d projections and
        // its two MLP layers at every token.
        let block = |d: u64, h: u64| 4 * d * d + 2 * d * h;
        // Its attention over t tokens: t² scores of d multiply-adds and their weighted sum of
        // the values, t² · d again; under a causal mask t(t + 1)/2 pairs in each.
        let attention = |t: u64, d: u64| 2 * t * t * d;
        let causal = |t: u64, d: u64| t * (t + 1) * d;
        // CCT: the tokenizer at 32² and 16², six blocks and the pooling's scores at 64 tokens,
        // then the pooling's weighted sum of the 64 tokens, the classifier once.
        let cct = 64 * 27 * 1024
            + 256 * 576 * 256
            + 64 * (6 * block(256, 512) + 256)
            + 6 * attention(64, 256)
            + 64 * 256
            + 256 * 10;
        assert_eq!(count(Architecture::Cct { classes: 10 }), cct);
        // The character model: its blocks and its head at each of a window's tokens, its causal
        // attention in each block.
        let s = CharShape::default();
        let (d, context, vocab) = (s.width as u64, s.context as u64, s.vocab as u64);
        let chars = context * (s.blocks as u64 * block(d, 4 * d) + d * vocab)
            + s.blocks as u64 * causal(context, d);
        assert_eq!(count(Architecture::CharTransformer(s)), chars);
    }
}
