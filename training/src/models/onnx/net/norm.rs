//! Batch and layer normalisation: statistics computed from the activation, scale and bias
//! applied as broadcast operands (per client in a cohort).

use super::window::per_client;
use super::{Act, OnnxNet};
use crate::models::NetError;
use crate::models::kernels::{Cohort, Kernels};
use crate::models::onnx::ops::Binary;
use crate::models::onnx::plan::{Kernel, Norm, Plan, Step};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// Batch statistics are each client's, over its real rows: a backend whose cohort kernels pad
/// clients' shorter batches with zero rows ([`Kernels::BATCHED_COHORTS`]) would count the
/// padding in them, so a plan with `BatchNormalization` is refused there.
pub(super) fn check_backend<B: Kernels>(plan: &Plan) -> Result<(), NetError> {
    let batch_norm = plan
        .steps
        .iter()
        .any(|s| matches!(s.kernel, Kernel::Norm(Norm::Batch { .. })));
    if B::BATCHED_COHORTS && batch_norm {
        return Err(NetError::Unsupported(
            "BatchNormalization takes each client's batch statistics, which this backend's \
             padded cohort batches would change: train this ONNX model on the CPU"
                .into(),
        ));
    }
    Ok(())
}

/// `x` (`rows × C × positions`) normalised per channel over its rows and positions, with the
/// biased variance (PyTorch's in training).
fn batch_statistics<B: Backend>(x: Tensor<B, 3>, epsilon: f64) -> Tensor<B, 3> {
    let mean = x.clone().mean_dim(2).mean_dim(0);
    let centred = x - mean;
    let var = centred.clone().powi_scalar(2).mean_dim(2).mean_dim(0);
    centred / (var + epsilon).sqrt()
}

impl<B: Kernels> OnnxNet<B> {
    pub(super) fn norm(
        &self,
        norm: &Norm,
        step: &Step,
        slots: &[Option<Act<B>>],
        n: usize,
        cohort: &Cohort,
    ) -> Act<B> {
        let x = Self::slot(
            slots,
            match &step.inputs[0] {
                crate::models::onnx::plan::Operand::Act(i) => *i,
                _ => unreachable!("the plan normalises an activation"),
            },
        );
        let dims = x.dims();
        let rank = dims.len();
        let operand =
            |i: usize, rank: usize| self.operand(&step.inputs[i], slots, [n, rank], cohort);
        match *norm {
            Norm::Batch { epsilon } => {
                let positions: usize = dims[2..].iter().product();
                let Act::R3(t) = x.reshape(&[n, dims[1], positions]) else {
                    unreachable!("reshaped to rank 3")
                };
                let normed = per_client(t, cohort, |t, _| batch_statistics(t, epsilon as f64));
                // The plan views scale and bias as `C × 1` (per sample: `N × C × 1`).
                Act::R3(normed)
                    .binary(operand(1, 3), Binary::Mul)
                    .binary(operand(2, 3), Binary::Add)
                    .reshape(&dims)
            }
            Norm::Group { groups, epsilon } => {
                let per_group = dims[1..].iter().product::<usize>() / groups;
                let Act::R2(t) = x.reshape(&[n * groups, per_group]) else {
                    unreachable!("reshaped to rank 2")
                };
                let (var, mean) = t.clone().var_mean_bias(1);
                let normed = (t - mean) / (var + epsilon as f64).sqrt();
                let positions = per_group * groups / dims[1];
                Act::R2(normed)
                    .reshape(&[n, dims[1], positions])
                    .binary(operand(1, 3), Binary::Mul)
                    .binary(operand(2, 3), Binary::Add)
                    .reshape(&dims)
            }
            Norm::Layer { axis, epsilon } => {
                let outer: usize = dims[..axis].iter().product();
                let inner: usize = dims[axis..].iter().product();
                let Act::R2(t) = x.reshape(&[outer, inner]) else {
                    unreachable!("reshaped to rank 2")
                };
                let (var, mean) = t.clone().var_mean_bias(1);
                let normed = (t - mean) / (var + epsilon as f64).sqrt();
                let scaled = Act::R2(normed)
                    .reshape(&dims)
                    .binary(operand(1, rank), Binary::Mul);
                match step.inputs.len() {
                    3 => scaled.binary(operand(2, rank), Binary::Add),
                    _ => scaled,
                }
            }
        }
    }
}
