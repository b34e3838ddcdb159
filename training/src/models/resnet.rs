//! ResNet-18 for 32×32 inputs as in the paper: a 3×3 first convolution (no max-pool), GroupNorm
//! instead of BatchNorm (batch statistics make no sense across heterogeneous clients), four
//! stages of two basic blocks, global average pooling and a linear classifier.
//!
//! The first convolution and the classifier stay dense; every other convolution (including the
//! 1×1 shortcuts) is shardable. GPU-scale: on CPU it is built, run and sharded in tests only.
//!
//! Under a width strategy the constructor builds the channels the builder keeps
//! ([`Builder::units`]): one width per stage's residual stream (`stage{s}.residual`: every
//! tensor that writes or reads the sums `relu(h + skip)`, which must keep the same channels)
//! and one per block's inner channels (`stage{s}.block{i}.conv1`); the tensors each runs along
//! are listed in `models/widths.rs`.

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

/// Channels of the four stages' residual streams (and of their blocks' inner convolutions).
pub const STAGE_WIDTHS: [usize; 4] = [64, 128, 256, 512];

/// Basic blocks per stage.
pub const BLOCKS_PER_STAGE: usize = 2;

/// Whether block `block` of stage `stage` reads the previous stage's stream through a 1×1
/// projection (its `shortcut`): the first block of every stage but the first, which halves
/// the side and widens the stream. Stage 0's first block reads the stem's 64 channels as they
/// are, so the stem writes stage 0's stream.
pub fn projects(stage: usize, block: usize) -> bool {
    stage > 0 && block == 0
}

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
    /// A block reading `c_in` channels and writing `c_out`, its first convolution's output
    /// `inner` channels (`c_out` in the global model, fewer in a narrowed one); `projection`
    /// adds the 1×1 shortcut (given, not derived from the channels: a narrowed model's are not
    /// the global model's).
    fn new(
        b: &mut Builder<B>,
        name: &str,
        [c_in, inner, c_out]: [usize; 3],
        stride: usize,
        projection: bool,
    ) -> Result<Self, NetError> {
        let shortcut = if projection {
            let names = [format!("{name}.shortcut"), format!("{name}.shortcut_norm")];
            Some(conv_norm(b, names, c_in, c_out, 1, stride)?)
        } else {
            None
        };
        let names = |i| [format!("{name}.conv{i}"), format!("{name}.norm{i}")];
        let (conv1, norm1) = conv_norm(b, names(1), c_in, inner, 3, stride)?;
        let (conv2, norm2) = conv_norm(b, names(2), inner, c_out, 3, 1)?;
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
    /// ResNet-18 at the widths the builder keeps ([`Builder::units`] of every
    /// `stage{s}.residual` and `stage{s}.block{i}.conv1`; all of them in init mode).
    pub fn new(b: &mut Builder<B>, classes: usize) -> Result<Self, NetError> {
        let streams: Vec<usize> = STAGE_WIDTHS
            .iter()
            .enumerate()
            .map(|(s, &full)| b.units(&format!("stage{s}.residual"), full))
            .collect();
        let mut side = 32;
        b.at_positions(side * side);
        let stem = b.conv("stem", 3, streams[0], 3, 1, 1, false, false)?;
        let stem_norm = GroupNorm::new(b, "stem_norm", streams[0], NORM_GROUPS)?;
        let mut blocks = Vec::with_capacity(STAGE_WIDTHS.len() * BLOCKS_PER_STAGE);
        let mut c_in = streams[0];
        for (stage, &c_out) in streams.iter().enumerate() {
            for i in 0..BLOCKS_PER_STAGE {
                let projection = projects(stage, i);
                let stride = if projection { 2 } else { 1 };
                // Every convolution of a block outputs at the block's stride.
                side /= stride;
                b.at_positions(side * side);
                let name = format!("stage{stage}.block{i}");
                let inner = b.units(&format!("{name}.conv1"), STAGE_WIDTHS[stage]);
                let channels = [c_in, inner, c_out];
                blocks.push(BasicBlock::new(b, &name, channels, stride, projection)?);
                c_in = c_out;
            }
        }
        b.at_positions(1);
        let fc = b.affine("fc", c_in, classes, true, false)?;
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
        // The last stream's channels: 512, or those a narrowed model keeps.
        let channels = h.dims()[1];
        let pooled = adaptive_avg_pool2d(h, [1, 1]).reshape([n, channels]);
        self.fc.forward(pooled, c)
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        let mut w = vec![&self.stem.weight];
        w.extend(self.blocks.iter().flat_map(BasicBlock::weights));
        w.push(&self.fc.weight);
        w
    }
}
