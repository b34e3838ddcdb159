//! Activation functions, softmax and transposition of one activation.

use super::Act;
use crate::models::onnx::plan::Unary;
use burn::tensor::activation::{leaky_relu, log_softmax, sigmoid, softmax, tanh};
use burn::tensor::backend::Backend;

/// `u` of `x`.
pub(super) fn apply<B: Backend>(u: &Unary, x: Act<B>) -> Act<B> {
    match u {
        Unary::LeakyRelu(alpha) => each!(x, t => leaky_relu(t, *alpha as f64)),
        // Written out rather than burn's `gelu` so that the exact form is erf's, as ONNX's
        // and PyTorch's, and the tanh form is theirs too.
        Unary::Gelu { tanh: false } => {
            each!(x, t => t.clone() * (t.div_scalar(std::f64::consts::SQRT_2).erf() + 1.0) * 0.5)
        }
        Unary::Gelu { tanh: true } => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            each!(x, t => {
                let inner = (t.clone() + t.clone().powi_scalar(3) * 0.044715) * c;
                t * (tanh(inner) + 1.0) * 0.5
            })
        }
        Unary::Sigmoid => each!(x, t => sigmoid(t)),
        Unary::Tanh => each!(x, t => tanh(t)),
        Unary::Softmax { axis, log: false } => each!(x, t => softmax(t, *axis)),
        Unary::Softmax { axis, log: true } => each!(x, t => log_softmax(t, *axis)),
        Unary::Transpose(perm) => match x {
            Act::R1(t) => Act::R1(t),
            Act::R2(t) => Act::R2(t.permute([perm[0], perm[1]])),
            Act::R3(t) => Act::R3(t.permute([perm[0], perm[1], perm[2]])),
            Act::R4(t) => Act::R4(t.permute([perm[0], perm[1], perm[2], perm[3]])),
        },
    }
}
