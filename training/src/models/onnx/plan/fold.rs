//! Load-time folding of what a graph computes from shapes: `Shape`, `Gather`, `Unsqueeze`,
//! `Concat` and the shape input of `Reshape` (PyTorch's GroupNorm export computes its reshapes
//! so), with the batch size kept symbolic.

use super::{Kernel, Operand, Resolver, Value, describe, node_error};
use crate::models::onnx::Problem;
use crate::models::onnx::graph::{Constant, Node};

impl Resolver<'_> {
    /// `Shape`, sliced to `[start, end)` (opset 15's attributes; negative counts from the end).
    pub(super) fn shape(
        &mut self,
        node: &Node,
        start: i64,
        end: Option<i64>,
    ) -> Result<(), Problem> {
        let v = self.value(node, &node.inputs[0])?;
        let values: Vec<Option<i64>> = match v {
            Value::Act { tail, .. } => std::iter::once(None)
                .chain(tail.iter().map(|&d| Some(d as i64)))
                .collect(),
            Value::Tensor { shape, .. } | Value::Const(Constant { shape, .. }) => {
                shape.iter().map(|&d| Some(d as i64)).collect()
            }
            Value::Sym { values, scalar } => {
                vec![Some(if scalar { 0 } else { values.len() as i64 })]
            }
        };
        let rank = values.len() as i64;
        let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
        let (from, to) = (clamp(start), clamp(end.unwrap_or(rank)));
        let values = values[from..to.max(from)].to_vec();
        self.set(
            node,
            Value::Sym {
                values,
                scalar: false,
            },
        );
        Ok(())
    }

    pub(super) fn gather(&mut self, node: &Node, axis: i64) -> Result<(), Problem> {
        let data = self.sym(node, 0)?;
        let Some(Value::Const(index)) = self.value(node, &node.inputs[1]).ok() else {
            return Err(node_error(node, "indices must be constant"));
        };
        let (Some(idx), 0) = (index.ints(), axis) else {
            return Err(node_error(
                node,
                "only integer indices along axis 0 of a shape",
            ));
        };
        let n = data.len() as i64;
        let mut values = Vec::new();
        for &i in idx {
            let i = if i < 0 { i + n } else { i };
            let v = data
                .get(i as usize)
                .filter(|_| i >= 0)
                .ok_or_else(|| node_error(node, format!("index {i} outside a shape of {n}")))?;
            values.push(*v);
        }
        let scalar = index.shape.is_empty();
        self.set(node, Value::Sym { values, scalar });
        Ok(())
    }

    pub(super) fn concat(&mut self, node: &Node, axis: i64) -> Result<(), Problem> {
        if axis != 0 && axis != -1 {
            return Err(node_error(node, "only shapes (1-D) are concatenated"));
        }
        let mut values = Vec::new();
        for i in 0..node.inputs.len() {
            values.extend(self.sym(node, i)?);
        }
        self.set(
            node,
            Value::Sym {
                values,
                scalar: false,
            },
        );
        Ok(())
    }

    /// Input `i` as integers (a shape, or an integer constant).
    pub(super) fn sym(&mut self, node: &Node, i: usize) -> Result<Vec<Option<i64>>, Problem> {
        match self.value(node, &node.inputs[i])? {
            Value::Sym { values, .. } => Ok(values),
            Value::Const(c) if c.ints().is_some() => Ok(c
                .ints()
                .unwrap_or_default()
                .iter()
                .map(|&v| Some(v))
                .collect()),
            other => Err(node_error(
                node,
                format!("input {i} is {}, expected integers", describe(Some(&other))),
            )),
        }
    }

    pub(super) fn reshape(&mut self, node: &Node) -> Result<(), Problem> {
        let spec = self.sym(node, 1)?;
        match self.value(node, &node.inputs[0])? {
            Value::Act { slot, tail } => {
                let total: usize = tail.iter().product();
                let mut out = Vec::new();
                let mut infer = None;
                for (i, s) in spec.iter().enumerate() {
                    match s {
                        // The batch first: kept as it is (a 0 copies it, -1 infers it).
                        None | Some(0 | -1) if i == 0 => {}
                        Some(0) => out.push(*tail.get(i - 1).unwrap_or(&0)),
                        Some(-1) => infer = Some(out.len()),
                        Some(d) if *d > 0 && i > 0 => out.push(*d as usize),
                        _ => return Err(node_error(node, format!("shape {spec:?}"))),
                    }
                }
                if let Some(at) = infer {
                    let known: usize = out.iter().product();
                    if known == 0 || !total.is_multiple_of(known) {
                        return Err(node_error(node, format!("shape {spec:?} of [N, {tail:?}]")));
                    }
                    out.insert(at, total / known);
                }
                if out.iter().product::<usize>() != total {
                    return Err(node_error(
                        node,
                        format!("shape {spec:?} keeps the batch first only for [N, {tail:?}]"),
                    ));
                }
                self.emit(
                    node,
                    Kernel::Reshape(out.clone()),
                    vec![Operand::Act(slot)],
                    out,
                );
            }
            Value::Tensor { index, shape } => {
                let shape = reshape_fixed(node, &shape, &spec)?;
                self.set(node, Value::Tensor { index, shape });
            }
            Value::Const(c) => {
                let shape = reshape_fixed(node, &c.shape, &spec)?;
                self.set(node, Value::Const(Constant { shape, ..c }));
            }
            // A shape (or the batch size as a scalar) as a 1-D list of its values: the dynamo
            // exporter's unoptimised graphs reshape `Squeeze(Shape(x)[0:1])` to `[-1]`.
            Value::Sym { values, .. }
                if spec == [Some(-1)] || spec == [Some(values.len() as i64)] =>
            {
                self.set(
                    node,
                    Value::Sym {
                        values,
                        scalar: false,
                    },
                );
            }
            Value::Sym { .. } => return Err(node_error(node, "reshaping a shape")),
        }
        Ok(())
    }

    /// Activation `slot` reshaped to the batch then `tail` (no data moves).
    pub(super) fn emit_reshape(&mut self, node: &Node, slot: usize, tail: Vec<usize>) {
        self.emit(
            node,
            Kernel::Reshape(tail.clone()),
            vec![Operand::Act(slot)],
            tail,
        );
    }

    pub(super) fn unsqueeze(&mut self, node: &Node, axes: Option<Vec<i64>>) -> Result<(), Problem> {
        let axes = match axes {
            Some(a) => a,
            None => self
                .sym(node, 1)?
                .into_iter()
                .map(|a| a.ok_or_else(|| node_error(node, "axes depend on the batch")))
                .collect::<Result<_, _>>()?,
        };
        let insert = |shape: &[usize]| -> Result<Vec<usize>, Problem> {
            let rank = (shape.len() + axes.len()) as i64;
            let mut axes: Vec<i64> = axes
                .iter()
                .map(|&a| if a < 0 { a + rank } else { a })
                .collect();
            axes.sort();
            let mut out = shape.to_vec();
            for a in axes {
                if a < 0 || a as usize > out.len() {
                    return Err(node_error(node, format!("axis {a} of rank {rank}")));
                }
                out.insert(a as usize, 1);
            }
            Ok(out)
        };
        let v = match self.value(node, &node.inputs[0])? {
            Value::Sym {
                values,
                scalar: true,
            } if axes == [0] => Value::Sym {
                values,
                scalar: false,
            },
            Value::Tensor { index, shape } => Value::Tensor {
                index,
                shape: insert(&shape)?,
            },
            Value::Const(c) => Value::Const(Constant {
                shape: insert(&c.shape)?,
                ..c
            }),
            Value::Act { slot, tail } => {
                if axes.contains(&0) {
                    return Err(node_error(node, "an axis before the batch"));
                }
                let full = insert(&[&[0][..], &tail].concat())?;
                self.emit_reshape(node, slot, full[1..].to_vec());
                return Ok(());
            }
            Value::Sym { .. } => return Err(node_error(node, "unsqueezing a 1-D shape")),
        };
        self.set(node, v);
        Ok(())
    }
}

/// A fixed shape reshaped by an ONNX shape spec (0 copies, -1 infers).
fn reshape_fixed(
    node: &Node,
    shape: &[usize],
    spec: &[Option<i64>],
) -> Result<Vec<usize>, Problem> {
    let total: usize = shape.iter().product();
    let mut out = Vec::new();
    let mut infer = None;
    for (i, s) in spec.iter().enumerate() {
        match s {
            Some(0) => out.push(*shape.get(i).unwrap_or(&0)),
            Some(-1) => infer = Some(i),
            Some(d) if *d > 0 => out.push(*d as usize),
            _ => return Err(node_error(node, format!("shape {spec:?} of {shape:?}"))),
        }
    }
    if let Some(at) = infer {
        let known: usize = out.iter().product();
        out.insert(at, total / known.max(1));
    }
    if out.iter().product::<usize>() != total {
        return Err(node_error(node, format!("shape {spec:?} of {shape:?}")));
    }
    Ok(out)
}
