//! ResNet-18 for 32×32 inputs as in the paper: a 3×3 first convolution (no max-pool), GroupNorm
//! instead of BatchNorm (batch statistics make no sense across heterogeneous clients), four
//! stages of two basic blocks, global average pooling and a linear classifier.
//!
//! The first convolution and the classifier stay dense; every other convolution (including the
//! 1×1 shortcuts) is shardable. GPU-scale: on CPU it is built, run and sharded in tests only.

use crate::models::NetError;
use crate::models::blocks::GroupNorm;
use crate::models::builder::Builder;
use crate::models::kernels::{Cohort, Kernels};
use crate::models::layers::{Affine, Conv, Weight};
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::module::adaptive_avg_pool2d;

/// Groups of every GroupNorm layer.
pub const NORM_GROUPS: usize = 2;

/// A shardable, bias-free `kernel × kernel` convolution with "same" padding, and the
/// GroupNorm that follows it.
fn conv_norm<B: Kernels>(
    b: &mut Builder<B>,
    [conv, norm]: [String; 2],
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
) -> Result<(Conv<B>, GroupNorm<B>), NetError> {
    Ok((
        b.conv(&conv, c_in, c_out, kernel, stride, kernel / 2, false, true)?,
        GroupNorm::new(b, &norm, c_out, NORM_GROUPS)?,
    ))
}

#[derive(Module, Debug)]
pub struct BasicBlock<B: Backend> {
    pub conv1: Conv<B>,
    pub norm1: GroupNorm<B>,
    pub conv2: Conv<B>,
    pub norm2: GroupNorm<B>,
    pub shortcut: Option<(Conv<B>, GroupNorm<B>)>,
}

impl<B: Kernels> BasicBlock<B> {
    fn new(
        b: &mut Builder<B>,
        name: &str,
        c_in: usize,
        c_out: usize,
        stride: usize,
    ) -> Result<Self, NetError> {
        let shortcut = if stride != 1 || c_in != c_out {
            let names = [format!("{name}.shortcut"), format!("{name}.shortcut_norm")];
            Some(conv_norm(b, names, c_in, c_out, 1, stride)?)
        } else {
            None
        };
        let names = |i| [format!("{name}.conv{i}"), format!("{name}.norm{i}")];
        let (conv1, norm1) = conv_norm(b, names(1), c_in, c_out, 3, stride)?;
        let (conv2, norm2) = conv_norm(b, names(2), c_out, c_out, 3, 1)?;
        Ok(Self {
            conv1,
            norm1,
            conv2,
            norm2,
            shortcut,
        })
    }

    fn forward(&self, x: Tensor<B, 4>, c: &Cohort) -> Tensor<B, 4> {
        let h = self.norm1.forward_relu(self.conv1.forward(x.clone(), c), c);
        let h = self.norm2.forward(self.conv2.forward(h, c), c);
        let skip = match &self.shortcut {
            Some((conv, norm)) => norm.forward(conv.forward(x, c), c),
            None => x,
        };
        relu(h + skip)
    }

    fn weights(&self) -> Vec<&Weight<B>> {
        let mut w = vec![&self.conv1.weight, &self.conv2.weight];
        if let Some((conv, _)) = &self.shortcut {
            w.push(&conv.weight);
        }
        w
    }
}

#[derive(Module, Debug)]
pub struct ResNet18<B: Backend> {
    pub stem: Conv<B>,
    pub stem_norm: GroupNorm<B>,
    pub blocks: Vec<BasicBlock<B>>,
    pub fc: Affine<B>,
}

impl<B: Kernels> ResNet18<B> {
    pub fn new(b: &mut Builder<B>, classes: usize) -> Result<Self, NetError> {
        let mut side = 32;
        b.at_positions(side * side);
        let stem = b.conv("stem", 3, 64, 3, 1, 1, false, false)?;
        let stem_norm = GroupNorm::new(b, "stem_norm", 64, NORM_GROUPS)?;
        let mut blocks = Vec::with_capacity(8);
        let mut c_in = 64;
        for (stage, c_out) in [64, 128, 256, 512].into_iter().enumerate() {
            for i in 0..2 {
                let stride = if stage > 0 && i == 0 { 2 } else { 1 };
                // Every convolution of a block outputs at the block's stride.
                side /= stride;
                b.at_positions(side * side);
                let name = format!("stage{stage}.block{i}");
                blocks.push(BasicBlock::new(b, &name, c_in, c_out, stride)?);
                c_in = c_out;
            }
        }
        b.at_positions(1);
        let fc = b.affine("fc", 512, classes, true, false)?;
        Ok(Self {
            stem,
            stem_norm,
            blocks,
            fc,
        })
    }

    /// `x`: `N × 3072` rows of 3×32×32 images.
    pub fn forward(&self, x: Tensor<B, 2>, c: &Cohort) -> Tensor<B, 2> {
        let n = x.dims()[0];
        let stem = self.stem.forward(x.reshape([n, 3, 32, 32]), c);
        let h = relu(self.stem_norm.forward(stem, c));
        let h = self.blocks.iter().fold(h, |h, block| block.forward(h, c));
        let pooled = adaptive_avg_pool2d(h, [1, 1]).reshape([n, 512]);
        self.fc.forward(pooled, c)
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        let mut w = vec![&self.stem.weight];
        w.extend(self.blocks.iter().flat_map(BasicBlock::weights));
        w.push(&self.fc.weight);
        w
    }
}
