//! Grouped or dilated convolutions of dense tensors, and pooling of overlapping or padded
//! windows, on burn's module operations.

use super::{Act, OnnxNet};
use crate::models::kernels::{Cohort, Kernels};
use crate::models::onnx::ops::Window;
use crate::models::onnx::plan::{Operand, Step};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::module::{avg_pool2d, conv2d, max_pool2d};
use burn::tensor::ops::ConvOptions;

/// `x` cut into each client's rows (the cohort's layout), `f` applied to client `i`'s, and
/// joined again.
pub(super) fn per_client<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    cohort: &Cohort,
    f: impl Fn(Tensor<B, D>, usize) -> Tensor<B, D>,
) -> Tensor<B, D> {
    if cohort.clients() == 1 {
        return f(x, 0);
    }
    let mut start = 0;
    let parts = cohort
        .rows()
        .iter()
        .enumerate()
        .map(|(i, &rows)| {
            let part = f(x.clone().narrow(0, start, rows), i);
            start += rows;
            part
        })
        .collect();
    Tensor::cat(parts, 0)
}

/// Pooling of `x` (NCHW) by `window`.
pub(super) fn pool<B: Backend>(
    x: Act<B>,
    max: bool,
    w: &Window,
    count_include_pad: bool,
) -> Act<B> {
    let Act::R4(t) = x else {
        unreachable!("the plan checks a pooling's input is NCHW")
    };
    Act::R4(if max {
        max_pool2d(t, w.kernel, w.stride, w.padding, w.dilation, false)
    } else {
        avg_pool2d(t, w.kernel, w.stride, w.padding, count_include_pad, false)
    })
}

impl<B: Kernels> OnnxNet<B> {
    /// Dense tensor `o` as one client's `shape`d value: the shared one, or client `client`'s
    /// row of a cohort's stacked tensor.
    pub(super) fn client_tensor<const D: usize>(&self, o: &Operand, client: usize) -> Tensor<B, D> {
        let Operand::Tensor { index, shape } = o else {
            unreachable!("the plan gives a dense tensor here")
        };
        let p = self.tensors[*index].val();
        let row = if p.dims()[0] == 1 {
            p
        } else {
            p.narrow(0, client, 1)
        };
        let dims: [usize; D] = shape[..].try_into().expect("the plan's shape has rank D");
        row.reshape(dims)
    }

    /// A grouped or dilated convolution, each client's rows with its own weight and bias.
    pub(super) fn grouped_conv(
        &self,
        x: Act<B>,
        step: &Step,
        w: &Window,
        groups: usize,
        cohort: &Cohort,
    ) -> Act<B> {
        let Act::R4(x) = x else {
            unreachable!("the plan checks a convolution's input is NCHW")
        };
        let options = ConvOptions::new(w.stride, w.padding, w.dilation, groups);
        Act::R4(per_client(x, cohort, |x, i| {
            let weight: Tensor<B, 4> = self.client_tensor(&step.inputs[1], i);
            let bias = step.inputs.get(2).map(|b| self.client_tensor::<1>(b, i));
            conv2d(x, weight, bias, options.clone())
        }))
    }
}
