//! The initial values of a plan's trainable tensors: the file's initializers in the
//! builder's layout.

use super::{Layer, Resolver};
use crate::models::onnx::Problem;
use fedshard_protocol::model::{ModelState, NamedTensor};

impl Resolver<'_> {
    /// The trainable tensors' initial values, in the builder's layout (a transposed weight
    /// `c_out × c_in`).
    pub(super) fn initial(&self) -> Result<ModelState, Problem> {
        let inits = &self.graph.initializers;
        let floats = |name: &str| -> Vec<f32> {
            inits[name]
                .floats()
                .map(<[f32]>::to_vec)
                .unwrap_or_default()
        };
        let mut tensors = Vec::new();
        for layer in &self.plan.layers {
            let (weight, bias, shape) = match layer {
                Layer::Affine {
                    weight,
                    bias,
                    c_in,
                    c_out,
                    transposed,
                } => {
                    let mut data = floats(weight);
                    if *transposed {
                        data = transpose(&data, *c_in, *c_out);
                    }
                    let w = NamedTensor {
                        name: weight.clone(),
                        shape: vec![*c_out, *c_in],
                        data,
                    };
                    (w, bias, *c_out)
                }
                Layer::Conv {
                    weight,
                    bias,
                    c_out,
                    ..
                } => {
                    let w = NamedTensor {
                        name: weight.clone(),
                        shape: inits[weight].shape.clone(),
                        data: floats(weight),
                    };
                    (w, bias, *c_out)
                }
            };
            tensors.push(weight);
            if let Some(b) = bias {
                tensors.push(NamedTensor {
                    name: b.clone(),
                    shape: vec![shape],
                    data: floats(b),
                });
            }
        }
        for (name, shape) in &self.plan.tensors {
            tensors.push(NamedTensor {
                name: name.clone(),
                shape: shape.clone(),
                data: floats(name),
            });
        }
        ModelState::new(tensors).map_err(|e| Problem::Graph(e.to_string()))
    }
}

/// `rows × cols` row-major transposed.
pub(crate) fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}
