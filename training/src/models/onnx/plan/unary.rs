//! Operators of one activation without parameters: activation functions, `Softmax` and
//! `LogSoftmax` along one axis, `Transpose` and `Squeeze` (which keep the batch first), and
//! `Dropout`, which fedshard runs as an identity (docs/onnx.md, "Rules").

use super::{Kernel, Operand, Resolver, Value, node_error};
use crate::models::onnx::Problem;
use crate::models::onnx::graph::{Constant, Node};

/// A function of one activation.
#[derive(Debug, Clone, PartialEq)]
pub enum Unary {
    /// `max(x, 0) + alpha · min(x, 0)`.
    LeakyRelu(f32),
    /// `x · Φ(x)`, or its tanh approximation.
    Gelu {
        tanh: bool,
    },
    Sigmoid,
    Tanh,
    /// Along `axis` of the activation (0 is the batch, never normalised over).
    Softmax {
        axis: usize,
        log: bool,
    },
    /// The activation's axes in their new order, the batch (0) first.
    Transpose(Vec<usize>),
}

/// `axis` of an activation `[N, tail]` (negative counts from the end) if it is after the
/// batch: normalising or taking a softmax across the batch would mix samples.
pub(super) fn axis_after_batch(node: &Node, axis: i64, tail: &[usize]) -> Result<usize, Problem> {
    let rank = tail.len() as i64 + 1;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(1..rank).contains(&axis) {
        return Err(node_error(
            node,
            format!("axis {axis} of [N, {tail:?}]: supported, an axis after the batch"),
        ));
    }
    Ok(axis as usize)
}

impl Resolver<'_> {
    /// `Softmax`/`LogSoftmax` along `axis`. Before opset 13 the operator flattened the axes from
    /// `axis` on into one; that agrees with opset 13's only when `axis` is the last.
    pub(super) fn softmax(&mut self, node: &Node, axis: i64, log: bool) -> Result<(), Problem> {
        let (slot, tail) = self.act(node, 0)?;
        let axis = axis_after_batch(node, axis, &tail)?;
        if self.graph.opset < 13 && axis != tail.len() {
            return Err(node_error(
                node,
                format!(
                    "opset {} flattens the axes from {axis} on: supported, the last axis",
                    self.graph.opset
                ),
            ));
        }
        let kernel = Kernel::Unary(Unary::Softmax { axis, log });
        self.emit(node, kernel, vec![Operand::Act(slot)], tail);
        Ok(())
    }

    /// The training loss is the cross-entropy of the output taken as logits, which applies
    /// its own log-softmax. A final `LogSoftmax` is harmless (the log-softmax of
    /// log-probabilities is themselves); a final `Softmax` would hand probabilities to it as
    /// if they were logits, a second softmax. So a `Softmax` over the classes that produces
    /// the output (and feeds nothing else) runs as `LogSoftmax`: the loss is then the negative
    /// log-likelihood of the model's probabilities, and the predicted class is unchanged.
    pub(super) fn final_softmax_as_log(&mut self) {
        let Some(Value::Act { slot, .. }) = self.values.get(&self.graph.output) else {
            return;
        };
        let slot = *slot;
        let read_elsewhere = self
            .plan
            .steps
            .iter()
            .any(|s| s.inputs.contains(&Operand::Act(slot)));
        if let Some(step) = self.plan.steps.iter_mut().find(|s| s.output == slot)
            && step.tail.len() == 1
            && !read_elsewhere
            && let Kernel::Unary(Unary::Softmax { log, .. }) = &mut step.kernel
        {
            *log = true;
        }
    }

    /// `Transpose` of an activation whose batch stays first.
    pub(super) fn transpose(&mut self, node: &Node, perm: Option<Vec<i64>>) -> Result<(), Problem> {
        let (slot, tail) = match self.value(node, &node.inputs[0])? {
            Value::Act { slot, tail } => (slot, tail),
            other => {
                return Err(node_error(
                    node,
                    format!(
                        "input is {}: supported, transposing an activation",
                        super::describe(Some(&other))
                    ),
                ));
            }
        };
        let rank = tail.len() + 1;
        let perm: Vec<usize> = match perm {
            None => (0..rank).rev().collect(),
            Some(p) => p
                .iter()
                .map(|&a| usize::try_from(if a < 0 { a + rank as i64 } else { a }))
                .collect::<Result<_, _>>()
                .map_err(|_| node_error(node, format!("perm {p:?}")))?,
        };
        let mut sorted = perm.clone();
        sorted.sort();
        if sorted != (0..rank).collect::<Vec<_>>() || perm[0] != 0 {
            return Err(node_error(
                node,
                format!(
                    "perm {perm:?} of [N, {tail:?}]: supported, a permutation keeping the batch (0) first"
                ),
            ));
        }
        let full: Vec<usize> = std::iter::once(0).chain(tail.iter().copied()).collect();
        let out: Vec<usize> = perm[1..].iter().map(|&a| full[a]).collect();
        self.emit(
            node,
            Kernel::Unary(Unary::Transpose(perm)),
            vec![Operand::Act(slot)],
            out,
        );
        Ok(())
    }

    /// `Squeeze` of named axes of size 1 (an activation's never the batch); a shape of one
    /// value squeezes to a scalar.
    pub(super) fn squeeze(&mut self, node: &Node, axes: Option<Vec<i64>>) -> Result<(), Problem> {
        let axes = match axes {
            Some(a) => Some(a),
            None if node.inputs.get(1).is_some_and(|a| !a.is_empty()) => Some(
                self.sym(node, 1)?
                    .into_iter()
                    .map(|a| a.ok_or_else(|| node_error(node, "axes depend on the batch")))
                    .collect::<Result<_, _>>()?,
            ),
            None => None,
        };
        // The dimensions of `shape` left after removing `axes` (all ones when absent).
        let remove = |shape: &[usize], axes: &Option<Vec<i64>>| -> Result<Vec<usize>, Problem> {
            let rank = shape.len() as i64;
            let mut drop = vec![false; shape.len()];
            match axes {
                None => drop.iter_mut().zip(shape).for_each(|(d, &s)| *d = s == 1),
                Some(axes) => {
                    for &a in axes {
                        let a = if a < 0 { a + rank } else { a };
                        if !(0..rank).contains(&a) || shape[a as usize] != 1 {
                            return Err(node_error(
                                node,
                                format!("axis {a} of {shape:?}: supported, an axis of size 1"),
                            ));
                        }
                        drop[a as usize] = true;
                    }
                }
            }
            Ok(shape
                .iter()
                .zip(&drop)
                .filter(|(_, d)| !**d)
                .map(|(s, _)| *s)
                .collect())
        };
        let v = match self.value(node, &node.inputs[0])? {
            Value::Act { slot, tail } => {
                let Some(axes) = axes else {
                    return Err(node_error(
                        node,
                        "no axes would squeeze a batch of 1: supported, named axes after the batch",
                    ));
                };
                let rank = tail.len() as i64 + 1;
                if axes.iter().any(|&a| a == 0 || a == -rank) {
                    return Err(node_error(node, "an axis of the batch"));
                }
                let full: Vec<usize> = std::iter::once(0).chain(tail.iter().copied()).collect();
                let out = remove(&full, &Some(axes))?[1..].to_vec();
                self.emit_reshape(node, slot, out);
                return Ok(());
            }
            Value::Tensor { index, shape } => Value::Tensor {
                index,
                shape: remove(&shape, &axes)?,
            },
            Value::Const(c) => Value::Const(Constant {
                shape: remove(&c.shape, &axes)?,
                ..c
            }),
            Value::Sym {
                values,
                scalar: false,
            } if values.len() == 1 && axes.as_deref().is_none_or(|a| a == [0] || a == [-1]) => {
                Value::Sym {
                    values,
                    scalar: true,
                }
            }
            Value::Sym { .. } => return Err(node_error(node, "squeezing a shape")),
        };
        self.set(node, v);
        Ok(())
    }

    /// `Dropout` is an identity, in training too (docs/onnx.md); a `training_mode` input
    /// that is a constant true asks for the random mask fedshard does not draw, and is refused.
    pub(super) fn dropout(&mut self, node: &Node) -> Result<(), Problem> {
        if let Some(mode) = node.inputs.get(2).filter(|m| !m.is_empty()) {
            let on = match self.value(node, mode)? {
                Value::Const(c) => match (c.ints(), c.floats()) {
                    (Some(v), _) => v.iter().any(|&x| x != 0),
                    (_, Some(v)) => v.iter().any(|&x| x != 0.0),
                    _ => true,
                },
                // A boolean constant is refused by the decoder; anything computed is unknown.
                _ => true,
            };
            if on {
                return Err(node_error(
                    node,
                    "training_mode is not a constant false: supported, Dropout as an identity",
                ));
            }
        }
        let v = self.value(node, &node.inputs[0])?;
        self.set(node, v);
        Ok(())
    }
}
