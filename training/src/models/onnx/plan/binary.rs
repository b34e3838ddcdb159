//! Elementwise `Add`/`Sub`/`Mul`/`Div` with numpy broadcasting: between activations
//! (residual connections), or an activation and a parameter or constant that never spans the
//! batch.

use super::{Kernel, Operand, Resolver, Value, node_error};
use crate::models::onnx::Problem;
use crate::models::onnx::graph::Node;
use crate::models::onnx::ops::Binary;

impl Resolver<'_> {
    pub(super) fn binary(&mut self, node: &Node, op: Binary) -> Result<(), Problem> {
        let a = self.value(node, &node.inputs[0])?;
        let b = self.value(node, &node.inputs[1])?;
        let tail = match (&a, &b) {
            (Value::Act { tail, .. }, other) | (other, Value::Act { tail, .. }) => {
                let other_shape = match other {
                    Value::Act { tail, .. } => {
                        if let Value::Act { tail: t, .. } = &a
                            && let Value::Act { tail: u, .. } = &b
                        {
                            broadcast(t, u).ok_or_else(|| {
                                node_error(node, format!("[N, {t:?}] and [N, {u:?}] differ"))
                            })?
                        } else {
                            tail.clone()
                        }
                    }
                    other => {
                        let s = operand(other.clone())
                            .and_then(|o| shape_of(&o))
                            .ok_or_else(|| node_error(node, "an operand is no tensor"))?;
                        // A non-activation broadcasts over the batch: its dimension aligned
                        // with the batch (if any) must be 1.
                        let skip = (s.len() + 1).saturating_sub(tail.len() + 1);
                        if s.len() > tail.len() && s[..skip].iter().any(|&d| d != 1) {
                            return Err(node_error(node, format!("{s:?} spans the batch")));
                        }
                        s[skip.min(s.len())..].to_vec()
                    }
                };
                broadcast(tail, &other_shape).ok_or_else(|| {
                    node_error(
                        node,
                        format!("[N, {tail:?}] and {other_shape:?} do not broadcast"),
                    )
                })?
            }
            _ => {
                return Err(node_error(node, "neither input is an activation"));
            }
        };
        let inputs = [a, b]
            .into_iter()
            .map(|v| match v {
                Value::Act { slot, .. } => Ok(Operand::Act(slot)),
                other => operand(other).ok_or_else(|| node_error(node, "an operand is no tensor")),
            })
            .collect::<Result<_, _>>()?;
        self.emit(node, Kernel::Binary(op), inputs, tail);
        Ok(())
    }
}

/// A non-activation value as an operand.
pub(super) fn operand(v: Value) -> Option<Operand> {
    match v {
        Value::Tensor { index, shape } => Some(Operand::Tensor { index, shape }),
        Value::Const(c) if c.floats().is_some() => Some(Operand::Const(c)),
        _ => None,
    }
}

fn shape_of(o: &Operand) -> Option<Vec<usize>> {
    match o {
        Operand::Tensor { shape, .. } => Some(shape.clone()),
        Operand::Const(c) => Some(c.shape.clone()),
        Operand::Act(_) => None,
    }
}

/// Numpy broadcasting of two shapes aligned at the right.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        let pad = rank - s.len();
        if i < pad { 1 } else { s[i - pad] }
    };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}
