//! `BatchNormalization`, `GroupNormalization` and `LayerNormalization`: their scale γ and bias
//! β are dense trainable tensors (like any float initializer), the statistics are computed,
//! never stored.
//!
//! A GroupNorm of `[N, C, H, W]` and a LayerNorm over the last axis with ε = [`NORM_EPS`]
//! (PyTorch's default) and trainable γ and β run on the shipped models' fused kernels
//! (`models/blocks.rs`), and a GroupNorm whose only reader is a `Relu` runs fused with it, as
//! the shipped CNN's `forward_relu` does: a CNN exported by `fedshard export` trains to the
//! same bytes as the shipped one (docs/onnx.md, "Export"). Any other ε, axis or affine runs on
//! the general [`Norm`] step.

use super::unary::axis_after_batch;
use super::{Kernel, Operand, Resolver, Value, describe, node_error, operand};
use crate::models::kernels::NORM_EPS;
use crate::models::onnx::Problem;
use crate::models::onnx::graph::Node;

/// The opset from which `GroupNormalization`'s scale and bias are per channel (before: per
/// group).
const GROUP_NORM_PER_CHANNEL: i64 = 21;

/// A normalisation; its scale is input 1 and its bias (if any) input 2 of the step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Norm {
    /// Per channel (axis 1), over the rows of each client of the batch and every position:
    /// HeteroFL's static batch normalisation, batch statistics in training and evaluation, no
    /// running statistics (docs/onnx.md). Scale and bias are viewed as `C × 1`.
    Batch { epsilon: f32 },
    /// Per sample over each of `groups` groups of consecutive channels and their positions;
    /// scale and bias per channel, viewed as `C × 1`.
    Group { groups: usize, epsilon: f32 },
    /// Over the axes from `axis` (never the batch) to the last, per sample; scale and bias
    /// are shaped as those axes.
    Layer { axis: usize, epsilon: f32 },
}

impl Resolver<'_> {
    /// Input `i` as a trainable tensor or constant of `shape`, viewed as `view`.
    fn affine_operand(
        &mut self,
        node: &Node,
        i: usize,
        shape: &[usize],
        view: Vec<usize>,
    ) -> Result<Operand, Problem> {
        let name = &node.inputs[i];
        let v = self.value(node, name)?;
        let what = describe(Some(&v));
        match operand(v) {
            Some(Operand::Tensor { index, shape: s }) if s == shape => {
                Ok(Operand::Tensor { index, shape: view })
            }
            Some(Operand::Const(c)) if c.shape == shape => {
                Ok(Operand::Const(crate::models::onnx::graph::Constant {
                    shape: view,
                    ..c
                }))
            }
            _ => Err(node_error(
                node,
                format!("input {i} `{name}` is {what}, expected a tensor of shape {shape:?}"),
            )),
        }
    }

    /// `BatchNormalization` of `[N, C, …]`: γ and β trained, the running mean and variance
    /// (inputs 3 and 4) checked to be `[C]` initializers and otherwise unused.
    pub(super) fn batch_norm(&mut self, node: &Node, epsilon: f32) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        if tail.len() > 3 {
            return Err(node_error(
                node,
                format!("input [N, {tail:?}] above rank 4"),
            ));
        }
        let c = tail[0];
        if node.inputs.len() != 5 {
            return Err(node_error(node, "expected 5 inputs"));
        }
        let scale = self.affine_operand(node, 1, &[c], vec![c, 1])?;
        let bias = self.affine_operand(node, 2, &[c], vec![c, 1])?;
        for i in [3, 4] {
            let name = &node.inputs[i];
            match self.graph.initializers.get(name) {
                Some(s) if s.shape == [c] && s.floats().is_some() => {}
                _ => {
                    return Err(node_error(
                        node,
                        format!("running statistic `{name}` is not a [{c}] float initializer"),
                    ));
                }
            }
        }
        self.emit(
            node,
            Kernel::Norm(Norm::Batch { epsilon }),
            vec![Operand::Act(slot), scale, bias],
            tail,
        );
        Ok(())
    }

    /// `GroupNormalization` of `[N, C, …]`. Opset 21 scales per channel; opsets 18 to 20
    /// scaled per group (a definition ONNX withdrew), refused unless each group is one channel
    /// (where the two agree): PyTorch's exporters below opset 21 decompose GroupNorm instead
    /// (InstanceNormalization, Mul, Add), which loads.
    pub(super) fn group_norm(
        &mut self,
        node: &Node,
        groups: usize,
        epsilon: f32,
    ) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        if !(2..=3).contains(&tail.len()) || !tail[0].is_multiple_of(groups) {
            return Err(node_error(
                node,
                format!("input [N, {tail:?}] is not [N, C, …] with C a multiple of {groups}"),
            ));
        }
        let c = tail[0];
        if self.graph.opset < GROUP_NORM_PER_CHANNEL && groups != c {
            return Err(node_error(
                node,
                format!(
                    "opset {} scales per group: supported, opset {GROUP_NORM_PER_CHANNEL} \
                     (scale and bias per channel)",
                    self.graph.opset
                ),
            ));
        }
        if tail.len() == 3
            && epsilon == NORM_EPS
            && let Some(inputs) = self.trained_scale_and_bias(node, slot, c)
        {
            let kernel = Kernel::GroupNorm {
                groups,
                relu: false,
            };
            self.emit(node, kernel, inputs, tail);
            return Ok(());
        }
        let scale = self.affine_operand(node, 1, &[c], vec![c, 1])?;
        let bias = self.affine_operand(node, 2, &[c], vec![c, 1])?;
        self.emit(
            node,
            Kernel::Norm(Norm::Group { groups, epsilon }),
            vec![Operand::Act(slot), scale, bias],
            tail,
        );
        Ok(())
    }

    /// `LayerNormalization` (opset 17) over the axes from `axis` on.
    pub(super) fn layer_norm(
        &mut self,
        node: &Node,
        axis: i64,
        epsilon: f32,
    ) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let axis = axis_after_batch(node, axis, &tail)?;
        let width = *tail.last().expect("an activation has a tail");
        if axis == tail.len()
            && epsilon == NORM_EPS
            && let Some(inputs) = self.trained_scale_and_bias(node, slot, width)
        {
            self.emit(node, Kernel::LayerNorm, inputs, tail);
            return Ok(());
        }
        let normalised = tail[axis - 1..].to_vec();
        let mut inputs = vec![Operand::Act(slot)];
        inputs.push(self.affine_operand(node, 1, &normalised, normalised.clone())?);
        if node.inputs.get(2).is_some_and(|b| !b.is_empty()) {
            inputs.push(self.affine_operand(node, 2, &normalised, normalised.clone())?);
        }
        let kernel = Kernel::Norm(Norm::Layer { axis, epsilon });
        self.emit(node, kernel, inputs, tail);
        Ok(())
    }

    /// The activation, then the node's γ and β when both are dense trainable tensors of `len`
    /// values (what the shipped kernels take); `None` otherwise.
    fn trained_scale_and_bias(
        &mut self,
        node: &Node,
        slot: usize,
        len: usize,
    ) -> Option<Vec<Operand>> {
        let mut inputs = vec![Operand::Act(slot)];
        for i in [1, 2] {
            let name = node.inputs.get(i).filter(|n| !n.is_empty())?.clone();
            match self.value(node, &name).ok()? {
                Value::Tensor { index, shape } if shape == [len] => {
                    inputs.push(Operand::Tensor { index, shape })
                }
                _ => return None,
            }
        }
        Some(inputs)
    }

    pub(super) fn unary(&mut self, node: &Node, kernel: Kernel) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        self.emit(node, kernel, vec![Operand::Act(slot)], tail);
        Ok(())
    }

    /// `Relu`: folded into the GroupNorm just before it when that GroupNorm's output is read
    /// by this node alone (the fused kernel of the shipped models), else its own step.
    pub(super) fn relu(&mut self, node: &Node) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let input = &node.inputs[0];
        let readers = self
            .graph
            .nodes
            .iter()
            .flat_map(|n| &n.inputs)
            .filter(|i| *i == input)
            .count();
        let last = self.plan.steps.last_mut();
        if let Some(step) = last
            && step.output == slot
            && readers == 1
            && self.graph.output != *input
            && let Kernel::GroupNorm { relu, .. } = &mut step.kernel
            && !*relu
        {
            *relu = true;
            self.set(node, Value::Act { slot, tail });
            return Ok(());
        }
        self.unary(node, Kernel::Relu)
    }
}
