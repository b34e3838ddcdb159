//! The shapes of the pooling kernels' windows.

/// How [`Kernels::fused_pool`](super::Kernels::fused_pool) reduces a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    Max,
    Average,
}

/// The windows of [`Kernels::fused_max_pool`](super::Kernels::fused_max_pool): `size × size`,
/// `stride` apart, over the input bordered by `padding` positions that never hold a maximum
/// (dilation 1, the output's sides rounded down, as burn's `max_pool2d`). CCT's tokenizer pools
/// 3 × 3 windows 2 apart with a border of 1, which the non-overlapping
/// [`Kernels::fused_pool`](super::Kernels::fused_pool) cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxWindow {
    pub size: usize,
    pub stride: usize,
    pub padding: usize,
}

impl MaxWindow {
    /// burn's `max_pool2d` arguments for these windows: kernel size, stride, padding and
    /// dilation.
    pub fn burn(&self) -> [[usize; 2]; 4] {
        [[self.size; 2], [self.stride; 2], [self.padding; 2], [1, 1]]
    }

    /// The output's side for an input side of `side`.
    pub fn output(&self, side: usize) -> usize {
        (side + 2 * self.padding - self.size) / self.stride + 1
    }
}
