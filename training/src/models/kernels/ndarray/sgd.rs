//! One SGD step with momentum in one pass over a parameter, with the f32 products and sums of
//! burn's tensor operations in the same order (bit-exact with them).
//!
//! A parameter and its velocity are updated in their own buffers when nothing else holds them
//! (the optimizer's own, as in every training step): ResNet-18's 11 million parameters were two
//! fresh vectors a step, 5–7% of it, the kernel zeroing their pages besides. A buffer that is
//! shared (or borrowed, or strided) gets a fresh one, with the same values.

use super::{contiguous, exclusive, tensor, values};
use burn::tensor::TensorMetadata;
use burn_ndarray::NdArrayTensor;

/// [`Kernels::sgd_step`](crate::models::kernels::Kernels::sgd_step) on the CPU: one pass
/// over parameter, gradient and velocity when the parameter and its velocity are the
/// optimizer's alone (every step but the first), the decay included.
pub(super) fn step(
    param: NdArrayTensor,
    grad: NdArrayTensor,
    velocity: Option<NdArrayTensor>,
    lr: f64,
    momentum: f64,
    decay: f64,
) -> [NdArrayTensor; 2] {
    let shape = param.shape();
    assert_eq!(shape, grad.shape(), "sgd_step: a gradient of another shape");
    // burn converts a scalar to the tensor's element type before it multiplies.
    let (lr, momentum, decay) = (lr as f32, momentum as f32, decay as f32);
    let Some(velocity) = velocity else {
        // The first step, or plain SGD: the velocity is the (decayed) gradient itself.
        let velocity = decayed(grad, &param, decay);
        let stepped = update(param, &values(&velocity), |p, v| p - v * lr);
        return [stepped, velocity];
    };
    assert_eq!(
        shape,
        velocity.shape(),
        "sgd_step: a velocity of another shape"
    );
    match (exclusive(param), exclusive(velocity)) {
        (Ok(mut param), Ok(mut velocity)) => {
            let grad = values(&grad);
            let (p, v) = (contiguous(&mut param), contiguous(&mut velocity));
            if decay == 0.0 {
                one_pass(p, v, &grad, (lr, momentum), |g, _| g);
            } else {
                one_pass(p, v, &grad, (lr, momentum), |g, p| g + p * decay);
            }
            [NdArrayTensor::from(param), NdArrayTensor::from(velocity)]
        }
        // Shared (or strided): fresh buffers, pass by pass.
        (param, velocity) => {
            let param = param.map_or_else(|t| t, NdArrayTensor::from);
            let velocity = velocity.map_or_else(|t| t, NdArrayTensor::from);
            let grad = decayed(grad, &param, decay);
            let velocity = update(velocity, &values(&grad), |v, g| g + v * momentum);
            let stepped = update(param, &values(&velocity), |p, v| p - v * lr);
            [stepped, velocity]
        }
    }
}

/// `grad + decay · param` (in `grad`'s buffer when nothing else holds it), `grad` itself when
/// `decay` is 0 (adding `0 · param` could turn a −0 into a +0, or an infinite parameter into
/// NaN).
fn decayed(grad: NdArrayTensor, param: &NdArrayTensor, decay: f32) -> NdArrayTensor {
    if decay == 0.0 {
        grad
    } else {
        update(grad, &values(param), |g, p| g + p * decay)
    }
}

/// The step in place, each element once: `v ← decayed(g, p) + v · momentum`, `p ← p − v · lr`,
/// the same products and sums as the passes of [`step`]'s other arm, in the same order.
fn one_pass(
    p: &mut [f32],
    v: &mut [f32],
    g: &[f32],
    (lr, momentum): (f32, f32),
    decayed: impl Fn(f32, f32) -> f32,
) {
    for ((p, v), &g) in p.iter_mut().zip(v.iter_mut()).zip(g) {
        *v = decayed(g, *p) + *v * momentum;
        *p -= *v * lr;
    }
}

/// [`Kernels::add_scaled`](crate::models::kernels::Kernels::add_scaled) on the CPU: in `a`'s
/// buffer when nothing else holds it.
pub(super) fn add_scaled(a: NdArrayTensor, b: NdArrayTensor, scale: f64) -> NdArrayTensor {
    assert_eq!(a.shape(), b.shape(), "add_scaled: operands of other shapes");
    // As burn's `mul_scalar`: the scalar in the element type, then the product, then the sum.
    let scale = scale as f32;
    update(a, &values(&b), |a, b| a + b * scale)
}

/// `t` with every element `x` replaced by `f(x, o)`, `o` the element of `other` at the same
/// row-major index: in `t`'s buffer when `t` alone holds it and it is contiguous, else in a
/// fresh one.
fn update(t: NdArrayTensor, other: &[f32], f: impl Fn(f32, f32) -> f32) -> NdArrayTensor {
    assert_eq!(
        t.shape().num_elements(),
        other.len(),
        "an element-wise update of operands of other lengths"
    );
    match exclusive(t) {
        Ok(mut array) => {
            for (x, &o) in contiguous(&mut array).iter_mut().zip(other) {
                *x = f(*x, o);
            }
            NdArrayTensor::from(array)
        }
        Err(t) => {
            let fresh = values(&t)
                .iter()
                .zip(other)
                .map(|(&x, &o)| f(x, o))
                .collect();
            tensor(fresh, t.shape())
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
    /// velocity and without (the first step), with weight decay and without, for contiguous
    /// (one pass in place) and transposed (fresh buffers) tensors.
    #[test]
    fn a_fused_step_is_burns_step_bit_for_bit() {
        let p = [0.3f32, -1.25, 2.0, 1e-3, 7.5, -0.1];
        let g = [0.7f32, 0.01, -3.3, 0.25, -0.5, 9.0];
        let v = [-0.2f32, 0.4, 1.1, -2.0, 0.05, 0.33];
        let contiguous = |x: &[f32]| t(x).into_primitive().tensor();
        let transposed = |x: &[f32]| t(x).transpose().into_primitive().tensor();
        let cases = [None, Some(v)]
            .into_iter()
            .flat_map(|v| [(v, 0.0), (v, 1e-2)]);
        for layout in [&contiguous as &Layout, &transposed] {
            for (velocity, decay) in cases.clone() {
                let fused = <NdArray as Kernels>::sgd_step(
                    layout(&p),
                    layout(&g),
                    velocity.map(|v| layout(&v)),
                    0.05,
                    0.5,
                    decay,
                );
                let burns = composite::sgd_step::<NdArray>(
                    layout(&p),
                    layout(&g),
                    velocity.map(|v| layout(&v)),
                    0.05,
                    0.5,
                    decay,
                );
                for (a, b) in fused.into_iter().zip(burns) {
                    assert_eq!(data(a), data(b));
                }
            }
        }
    }

    /// The step writes a parameter and a velocity in place only when nothing else holds them:
    /// a tensor shared with another keeps its values, and the in-place results are the fresh
    /// ones' bits.
    #[test]
    fn a_shared_parameter_or_velocity_is_left_as_it_was() {
        let (p, g, v) = (
            [0.3f32, -1.25, 2.0, 1e-3, 7.5, -0.1],
            [0.7f32; 6],
            [0.5f32; 6],
        );
        let tensor = |x: &[f32]| t(x).into_primitive().tensor();
        let (param, velocity) = (tensor(&p), tensor(&v));
        let (param_kept, velocity_kept) = (param.clone(), velocity.clone());
        let shared =
            <NdArray as Kernels>::sgd_step(param, tensor(&g), Some(velocity), 0.05, 0.5, 0.0);
        assert_eq!(data(param_kept), data(tensor(&p)));
        assert_eq!(data(velocity_kept), data(tensor(&v)));
        let alone = <NdArray as Kernels>::sgd_step(
            tensor(&p),
            tensor(&g),
            Some(tensor(&v)),
            0.05,
            0.5,
            0.0,
        );
        for (a, b) in shared.into_iter().zip(alone) {
            assert_eq!(data(a), data(b));
        }
    }

    /// The fused `g + μ w` gives the bits of burn's `g + w.mul_scalar(μ)`, for contiguous and
    /// transposed operands (a transposed gradient takes the fresh-buffer path).
    #[test]
    fn a_fused_decay_is_burns_bit_for_bit() {
        let (g, w) = (
            [0.7f32, 0.01, -3.3, 0.25, -0.5, 9.0],
            [0.3f32, -1.25, 2.0, 1e-3, 7.5, -0.1],
        );
        let contiguous = |x: &[f32]| t(x).into_primitive().tensor();
        let transposed = |x: &[f32]| t(x).transpose().into_primitive().tensor();
        for layout in [&contiguous as &Layout, &transposed] {
            let fused = <NdArray as Kernels>::add_scaled(layout(&g), layout(&w), 1e-4);
            let burns = composite::add_scaled::<NdArray>(layout(&g), layout(&w), 1e-4);
            assert_eq!(data(fused), data(burns));
        }
    }
}
