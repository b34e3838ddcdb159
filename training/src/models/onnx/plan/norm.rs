//! `BatchNormalization` and `LayerNormalization`: their scale γ and bias β are dense trainable
//! tensors (like any float initializer), the statistics are computed, never stored.

use super::unary::axis_after_batch;
use super::{Kernel, Operand, Resolver, describe, node_error, operand};
use crate::models::onnx::Problem;
use crate::models::onnx::graph::Node;

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
    /// scaled per group (a definition ONNX withdrew), and are refused: PyTorch's exporters
    /// below opset 21 decompose GroupNorm instead (InstanceNormalization, Mul, Add), which
    /// loads.
    pub(super) fn group_norm(
        &mut self,
        node: &Node,
        groups: usize,
        epsilon: f32,
    ) -> Result<(), Problem> {
        if self.graph.opset < 21 {
            return Err(node_error(
                node,
                format!(
                    "opset {} scales per group: supported, opset 21 (scale and bias per channel)",
                    self.graph.opset
                ),
            ));
        }
        let (slot, tail) = self.act(node, 0)?;
        if !(2..=3).contains(&tail.len()) || !tail[0].is_multiple_of(groups) {
            return Err(node_error(
                node,
                format!("input [N, {tail:?}] is not [N, C, …] with C a multiple of {groups}"),
            ));
        }
        let c = tail[0];
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
}
