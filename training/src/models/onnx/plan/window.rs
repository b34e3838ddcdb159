//! Windows the fused kernels do not cover: grouped (depthwise) or dilated convolutions, whose
//! weight trains as a dense tensor on burn's convolution (not a shardable layer: a spectral
//! shard factorises one `c_out × c_in·k²` matrix, which a grouped weight is not), and pooling
//! of overlapping or padded windows on burn's pooling.

use super::{Kernel, Operand, Resolver, Value, describe, node_error};
use crate::models::onnx::Problem;
use crate::models::onnx::graph::Node;
use crate::models::onnx::ops::Window;

impl Resolver<'_> {
    /// The NCHW input of `node` and its output side lengths under `window`.
    fn windowed(
        &mut self,
        node: &Node,
        window: &Window,
    ) -> Result<(usize, [usize; 3], [usize; 2]), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let [c, h, w] = tail[..] else {
            return Err(node_error(node, format!("input [N, {tail:?}] is not NCHW")));
        };
        let (Some(oh), Some(ow)) = (window.side(h, 0), window.side(w, 1)) else {
            return Err(node_error(
                node,
                format!("the window {window:?} exceeds the {h}×{w} input"),
            ));
        };
        Ok((slot, [c, h, w], [oh, ow]))
    }

    /// A `Conv` of `groups` groups or with a dilation: weight `[c_out, c_in / groups, kh, kw]`
    /// and bias `[c_out]`, dense trainable tensors.
    pub(super) fn grouped_conv(
        &mut self,
        node: &Node,
        window: Window,
        groups: usize,
    ) -> Result<(), Problem> {
        let (slot, [c, _, _], [oh, ow]) = self.windowed(node, &window)?;
        let name = node.inputs[1].clone();
        let (index, shape) = match self.value(node, &name)? {
            Value::Tensor { index, shape } => (index, shape),
            other => {
                return Err(node_error(
                    node,
                    format!(
                        "weight `{name}` is {}: supported, a float initializer",
                        describe(Some(&other))
                    ),
                ));
            }
        };
        let [c_out, per_group, kh, kw] = shape[..] else {
            return Err(node_error(node, format!("weight `{name}` is not 4-D")));
        };
        if !c.is_multiple_of(groups)
            || !c_out.is_multiple_of(groups)
            || per_group * groups != c
            || [kh, kw] != window.kernel
        {
            return Err(node_error(
                node,
                format!(
                    "weight `{name}` {shape:?} does not fit {c} input channels in {groups} groups"
                ),
            ));
        }
        let mut inputs = vec![
            Operand::Act(slot),
            Operand::Tensor {
                index,
                shape: shape.clone(),
            },
        ];
        if let Some(b) = node.inputs.get(2).filter(|b| !b.is_empty()) {
            match self.value(node, b)? {
                Value::Tensor { index, shape } if shape == [c_out] => {
                    inputs.push(Operand::Tensor { index, shape });
                }
                other => {
                    return Err(node_error(
                        node,
                        format!("bias `{b}` is {}, not [{c_out}]", describe(Some(&other))),
                    ));
                }
            }
        }
        self.emit(
            node,
            Kernel::GroupedConv { window, groups },
            inputs,
            vec![c_out, oh, ow],
        );
        Ok(())
    }

    /// `MaxPool` (padding counts as −∞) or `AveragePool` of overlapping or padded windows.
    pub(super) fn pool(
        &mut self,
        node: &Node,
        window: Window,
        max: bool,
        count_include_pad: bool,
    ) -> Result<(), Problem> {
        if window
            .padding
            .iter()
            .zip(&window.kernel)
            .any(|(p, k)| 2 * p > *k)
        {
            return Err(node_error(
                node,
                format!(
                    "padding {:?} above half the kernel {:?}",
                    window.padding, window.kernel
                ),
            ));
        }
        let (slot, [c, _, _], [oh, ow]) = self.windowed(node, &window)?;
        let kernel = Kernel::Pool {
            max,
            window,
            count_include_pad,
        };
        self.emit(node, kernel, vec![Operand::Act(slot)], vec![c, oh, ow]);
        Ok(())
    }
}
