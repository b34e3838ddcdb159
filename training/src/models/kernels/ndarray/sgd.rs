//! One SGD step with momentum in one pass over a parameter, with the f32 products and sums of
//! burn's tensor operations in the same order (bit-exact with them).

use super::{tensor, values};
use burn::tensor::TensorMetadata;
use burn_ndarray::NdArrayTensor;

/// [`Kernels::sgd_step`](crate::models::kernels::Kernels::sgd_step) on the CPU.
pub(super) fn step(
    param: NdArrayTensor,
    grad: NdArrayTensor,
    velocity: Option<NdArrayTensor>,
    lr: f64,
    momentum: f64,
) -> [NdArrayTensor; 2] {
    let shape = param.shape();
    assert_eq!(shape, grad.shape(), "sgd_step: a gradient of another shape");
    // burn converts a scalar to the tensor's element type before it multiplies.
    let (lr, momentum) = (lr as f32, momentum as f32);
    let grad = values(&grad);
    let velocity: Vec<f32> = match velocity {
        Some(v) => {
            assert_eq!(shape, v.shape(), "sgd_step: a velocity of another shape");
            let v = values(&v);
            grad.iter()
                .zip(v.iter())
                .map(|(g, v)| g + v * momentum)
                .collect()
        }
        None => grad.into_owned(),
    };
    let param = values(&param);
    let stepped = param
        .iter()
        .zip(&velocity)
        .map(|(p, v)| p - v * lr)
        .collect();
    [tensor(stepped, shape.clone()), tensor(velocity, shape)]
}

#[cfg(test)]
mod tests {
    use crate::models::kernels::Kernels;
    use crate::models::kernels::composite;
    use burn::backend::NdArray;
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};

    fn t(values: &[f32]) -> Tensor<NdArray, 2> {
        Tensor::from_data(
            TensorData::new(values.to_vec(), [2, 3]),
            &Default::default(),
        )
    }

    fn data(p: burn::tensor::ops::FloatTensor<NdArray>) -> TensorData {
        Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(p)).into_data()
    }

    /// The fused step gives the bits of the same step as burn's tensor operations, with a
    /// velocity and without (the first step), and for a transposed parameter.
    #[test]
    fn a_fused_step_is_burns_step_bit_for_bit() {
        let p = [0.3f32, -1.25, 2.0, 1e-3, 7.5, -0.1];
        let g = [0.7f32, 0.01, -3.3, 0.25, -0.5, 9.0];
        let v = [-0.2f32, 0.4, 1.1, -2.0, 0.05, 0.33];
        let prim = |x: Tensor<NdArray, 2>| x.into_primitive().tensor();
        for velocity in [None, Some(v)] {
            let fused = <NdArray as Kernels>::sgd_step(
                prim(t(&p)),
                prim(t(&g)),
                velocity.map(|v| prim(t(&v))),
                0.05,
                0.5,
            );
            let plain = composite::sgd_step::<NdArray>(
                prim(t(&p)),
                prim(t(&g)),
                velocity.map(|v| prim(t(&v))),
                0.05,
                0.5,
            );
            for (a, b) in fused.into_iter().zip(plain) {
                assert_eq!(data(a), data(b));
            }
        }
        let transposed = |x: &[f32]| prim(t(x).transpose());
        let fused = <NdArray as Kernels>::sgd_step(transposed(&p), transposed(&g), None, 0.05, 0.5);
        let plain = composite::sgd_step::<NdArray>(transposed(&p), transposed(&g), None, 0.05, 0.5);
        for (a, b) in fused.into_iter().zip(plain) {
            assert_eq!(
                Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(a)).into_data(),
                Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(b)).into_data()
            );
        }
    }
}
