//! `GroupNormalization` and `LayerNormalization` resolved to the shipped models' GroupNorm and
//! LayerNorm (`models/blocks.rs`): γ and β are dense trainable vectors under the file's names,
//! and a GroupNorm whose only reader is a `Relu` runs fused with it, as the shipped CNN's
//! `forward_relu` does, so a CNN exported by `fedshard export` trains to the same bytes as
//! the shipped one (docs/onnx.md, "Export").

use super::{Kernel, Operand, Resolver, Value, node_error};
use crate::models::onnx::Problem;
use crate::models::onnx::graph::Node;

/// The opset from which `GroupNormalization`'s scale and bias are per channel (before: per
/// group).
const GROUP_NORM_PER_CHANNEL: i64 = 21;

impl Resolver<'_> {
    pub(super) fn group_norm(&mut self, node: &Node, groups: usize) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let [channels, _, _] = tail[..] else {
            return Err(node_error(node, format!("input [N, {tail:?}] is not NCHW")));
        };
        if !channels.is_multiple_of(groups) {
            return Err(node_error(
                node,
                format!("{channels} channels do not split into {groups} groups"),
            ));
        }
        if self.graph.opset < GROUP_NORM_PER_CHANNEL && groups != channels {
            return Err(node_error(
                node,
                format!(
                    "opset {} scales per group; per-channel scale and bias need opset {}",
                    self.graph.opset, GROUP_NORM_PER_CHANNEL
                ),
            ));
        }
        let inputs = self.scale_and_bias(node, slot, channels)?;
        let kernel = Kernel::GroupNorm {
            groups,
            relu: false,
        };
        self.emit(node, kernel, inputs, tail);
        Ok(())
    }

    pub(super) fn layer_norm(&mut self, node: &Node) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let width = *tail.last().expect("an activation has a tail");
        let inputs = self.scale_and_bias(node, slot, width)?;
        self.emit(node, Kernel::LayerNorm, inputs, tail);
        Ok(())
    }

    /// The activation, then the node's γ and β: dense trainable tensors of `len` values.
    fn scale_and_bias(
        &mut self,
        node: &Node,
        slot: usize,
        len: usize,
    ) -> Result<Vec<Operand>, Problem> {
        let mut inputs = vec![Operand::Act(slot)];
        for (i, what) in [(1, "scale"), (2, "bias")] {
            let name = node.inputs.get(i).filter(|n| !n.is_empty());
            let name = name.ok_or_else(|| node_error(node, format!("no {what} (input {i})")))?;
            match self.value(node, &name.clone())? {
                Value::Tensor { index, shape } if shape == [len] => {
                    inputs.push(Operand::Tensor { index, shape })
                }
                _ => {
                    return Err(node_error(
                        node,
                        format!("{what} `{name}` is not an initializer of shape [{len}]"),
                    ));
                }
            }
        }
        Ok(inputs)
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
