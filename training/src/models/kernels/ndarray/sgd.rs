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
    let step = |param: &[f32], velocity: &[f32]| -> Vec<f32> {
        param
            .iter()
            .zip(velocity)
            .map(|(p, v)| p - v * lr)
            .collect()
    };
    let param = values(&param);
    match velocity {
        Some(v) => {
            assert_eq!(shape, v.shape(), "sgd_step: a velocity of another shape");
            let (grad, v) = (values(&grad), values(&v));
            let velocity: Vec<f32> = grad
                .iter()
                .zip(v.iter())
                .map(|(g, v)| g + v * momentum)
                .collect();
            let stepped = step(&param, &velocity);
            [tensor(stepped, shape.clone()), tensor(velocity, shape)]
        }
        // The first step, or plain SGD: the velocity is the gradient itself, not a copy of it.
        None => {
            let stepped = step(&param, &values(&grad));
            [tensor(stepped, shape), grad]
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::models::kernels::Kernels;
    use crate::models::kernels::composite;
    use burn::backend::NdArray;
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};

    fn t(values: &[f32]) -> Tensor<NdArray, 2> {
        Tensor::from_data(
            TensorData::new(values.to_vec(), [2, 3]),
            &Default::default(),
        )
    }

    /// A tensor's values laid out one way.
    type Layout = dyn Fn(&[f32]) -> FloatTensor<NdArray>;

    fn data(p: FloatTensor<NdArray>) -> TensorData {
        Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(p)).into_data()
    }

    /// The fused step gives the bits of the same step as burn's tensor operations, with a
    /// velocity and without (the first step), for contiguous and transposed tensors.
    #[test]
    fn a_fused_step_is_burns_step_bit_for_bit() {
        let p = [0.3f32, -1.25, 2.0, 1e-3, 7.5, -0.1];
        let g = [0.7f32, 0.01, -3.3, 0.25, -0.5, 9.0];
        let v = [-0.2f32, 0.4, 1.1, -2.0, 0.05, 0.33];
        let contiguous = |x: &[f32]| t(x).into_primitive().tensor();
        let transposed = |x: &[f32]| t(x).transpose().into_primitive().tensor();
        for layout in [&contiguous as &Layout, &transposed] {
            for velocity in [None, Some(v)] {
                let fused = <NdArray as Kernels>::sgd_step(
                    layout(&p),
                    layout(&g),
                    velocity.map(|v| layout(&v)),
                    0.05,
                    0.5,
                );
                let burns = composite::sgd_step::<NdArray>(
                    layout(&p),
                    layout(&g),
                    velocity.map(|v| layout(&v)),
                    0.05,
                    0.5,
                );
                for (a, b) in fused.into_iter().zip(burns) {
                    assert_eq!(data(a), data(b));
                }
            }
        }
    }
}
