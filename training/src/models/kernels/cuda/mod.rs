//! CUDA's convolutions as implicit GEMMs on the tensor cores; every other kernel is the
//! [`composite`] one.
//!
//! Why: burn's CUDA backend, built without autotuning (docs/performance.md says why), runs each
//! convolution pass with a direct kernel: the filter gradient as a direct convolution whose
//! kernel is the whole output map, the input gradient as a direct transposed convolution,
//! which returns zeros when the kernel is smaller than the stride (ResNet-18's 1×1 stride-2
//! shortcuts). cubek's implicit GEMM (the algorithm behind most of cuDNN's convolutions) runs
//! the forward pass and both gradients as matrix products on the tensor cores, rounding its f32
//! operands to TF32 as PyTorch's cuDNN convolutions do by default
//! (`torch.backends.cudnn.allow_tf32`); a strided input gradient is the stride-1 gradient of
//! the zero-spread output gradient ([`composite::strided_input_grad`]). Measured per shape and
//! end to end on an H200 in docs/performance.md.
//!
//! A shape the implicit GEMM cannot take is refused when the kernel is set up, before anything
//! runs, and that pass takes burn's direct kernel: a choice per shape, as an autotuner's.

pub mod timings;

use super::{ConvGeometry, Kernels, composite};
use burn::backend::Cuda;
use burn::tensor::ops::{ConvOptions, FloatTensor, FloatTensorOps, ModuleOps};
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::kernel::conv::{
    ConvStrategy, conv_data_backward, conv_forward, conv_weight_backward,
};

/// The convolution of `x` by `weight` (`c_out × C × kh × kw`).
fn forward(
    x: FloatTensor<Cuda>,
    weight: FloatTensor<Cuda>,
    bias: Option<FloatTensor<Cuda>>,
    options: ConvOptions<2>,
) -> FloatTensor<Cuda> {
    let gemm = ConvStrategy::ImplicitGemm;
    conv_forward::<_, 2>(
        x.clone(),
        weight.clone(),
        bias.clone(),
        options.clone(),
        gemm,
    )
    .unwrap_or_else(|_| <Cuda>::conv2d(x, weight, bias, options))
}

/// The gradient with respect to `weight` of the convolution of `x`, from the output's `grad`.
fn filter_grad(
    x: FloatTensor<Cuda>,
    weight: FloatTensor<Cuda>,
    grad: FloatTensor<Cuda>,
    options: ConvOptions<2>,
) -> FloatTensor<Cuda> {
    let shape = weight.shape();
    let gemm = ConvStrategy::ImplicitGemm;
    conv_weight_backward::<_, 2>(x.clone(), grad.clone(), shape, options.clone(), gemm)
        .unwrap_or_else(|_| <Cuda>::conv2d_weight_backward(x, weight, grad, options))
}

/// The gradient with respect to `x` of the convolution of `x` by `weight`, from the output's
/// `grad`.
fn input_grad(
    x: &FloatTensor<Cuda>,
    weight: FloatTensor<Cuda>,
    grad: FloatTensor<Cuda>,
    geometry: ConvGeometry,
) -> FloatTensor<Cuda> {
    let input = x.shape();
    let stride_one = |grad: FloatTensor<Cuda>, options: ConvOptions<2>| {
        let gemm = ConvStrategy::ImplicitGemm;
        let shape = input.clone();
        conv_data_backward::<_, 2>(grad.clone(), weight.clone(), shape, options.clone(), gemm)
            .unwrap_or_else(|_| <Cuda>::conv2d_x_backward(x.clone(), weight.clone(), grad, options))
    };
    if geometry.stride == [1, 1] {
        stride_one(grad, geometry.options())
    } else {
        composite::strided_input_grad::<Cuda>(grad, &input, geometry, stride_one)
    }
}

impl Kernels for Cuda {
    fn fused_conv2d(
        x: FloatTensor<Self>,
        filters: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        geometry: ConvGeometry,
    ) -> [FloatTensor<Self>; 2] {
        let (weight, options) = composite::conv_weight::<Self>(&x, filters, geometry);
        [forward(x.clone(), weight, bias, options), x]
    }

    fn fused_conv2d_backward(
        saved: FloatTensor<Self>,
        _input: Shape,
        filters: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        geometry: ConvGeometry,
        with_bias: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        let filters_shape = filters.shape();
        let (weight, options) = composite::conv_weight::<Self>(&saved, filters, geometry);
        let d_x = input_grad(&saved, weight.clone(), grad.clone(), geometry);
        let d_weight = filter_grad(saved, weight, grad.clone(), options);
        (
            d_x,
            Self::float_reshape(d_weight, filters_shape),
            with_bias.then(|| composite::conv_bias_backward::<Self>(grad)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Distribution, Tensor, TensorData, TensorPrimitive};

    /// The same values on `B`.
    fn on<B: Backend>(data: &TensorData) -> FloatTensor<B> {
        Tensor::<B, 4>::from_data(data.clone(), &Default::default())
            .into_primitive()
            .tensor()
    }

    /// `t` with the dimensions `dims`.
    fn reshaped<B: Backend, const D: usize>(t: FloatTensor<B>, dims: [usize; D]) -> FloatTensor<B> {
        B::float_reshape(t, Shape::new(dims))
    }

    /// ‖a − b‖ / ‖b‖ over all values.
    fn relative_error(a: FloatTensor<Cuda>, b: FloatTensor<NdArray>) -> f64 {
        let values = |data: TensorData| data.into_vec::<f32>().expect("f32");
        let a = values(Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(a)).into_data());
        let b = values(Tensor::<NdArray, 4>::from_primitive(TensorPrimitive::Float(b)).into_data());
        assert_eq!(a.len(), b.len());
        let diff: f64 = a
            .iter()
            .zip(&b)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let norm: f64 = b.iter().map(|b| f64::from(*b).powi(2)).sum();
        (diff / norm).sqrt()
    }

    /// On ResNet-18's shapes, the implicit GEMM sets up, and CUDA's convolution agrees with the
    /// CPU's (burn-ndarray, f32) in the output and every gradient within TF32's rounding (10
    /// mantissa bits: about 5e-4 a product, less over sums of hundreds; measured 3e-4 on an
    /// H200). The bound, 2e-3, is four times TF32's unit roundoff; a lost or misplaced gradient
    /// gives errors of order one (burn's own CUDA input gradient of the 1×1 stride-2 shortcut
    /// is all zeros: error 1).
    #[test]
    #[ignore = "needs an NVIDIA GPU: cargo test --release --features cuda -p fedshard-training cuda_convolutions -- --ignored"]
    fn cuda_convolutions_match_the_cpus_within_tf32_rounding() {
        let cases = [
            ([8, 64, 32, 32], 64, 3, 1, 1),
            ([8, 64, 32, 32], 128, 3, 2, 1),
            ([8, 128, 16, 16], 256, 1, 2, 0),
            ([8, 512, 4, 4], 512, 3, 1, 1),
        ];
        for (shape, c_out, kernel, stride, padding) in cases {
            let geometry = ConvGeometry {
                kernel: [kernel, kernel],
                stride: [stride, stride],
                padding: [padding, padding],
            };
            let what = format!("{shape:?} → {c_out}, {kernel}×{kernel} stride {stride}");
            let random = |shape: [usize; 4]| {
                Tensor::<NdArray, 4>::random(
                    shape,
                    Distribution::Normal(0.0, 1.0),
                    &Default::default(),
                )
                .into_data()
            };
            let [n, _, h, w] = shape;
            let [h_out, w_out] = geometry.output([h, w]);
            let x = random(shape);
            let filters = random([c_out, shape[1] * kernel * kernel, 1, 1]);
            let grad = random([n, c_out, h_out, w_out]);
            // The filters as the kernels take them (a matrix) and as the tests draw them.
            let (matrix, drawn) = (
                [c_out, shape[1] * kernel * kernel],
                [c_out, shape[1] * kernel * kernel, 1, 1],
            );
            let gpu = |data: &TensorData| on::<Cuda>(data);
            let cpu = |data: &TensorData| on::<NdArray>(data);
            let filters_gpu = reshaped::<Cuda, 2>(gpu(&filters), matrix);
            let filters_cpu = reshaped::<NdArray, 2>(cpu(&filters), matrix);
            let (weight, options) =
                composite::conv_weight::<Cuda>(&gpu(&x), filters_gpu.clone(), geometry);
            let gemm = ConvStrategy::ImplicitGemm;
            assert!(
                conv_forward::<_, 2>(gpu(&x), weight.clone(), None, options.clone(), gemm).is_ok(),
                "{what}: the implicit GEMM refused the forward pass"
            );
            let [y, saved] = <Cuda>::fused_conv2d(gpu(&x), filters_gpu.clone(), None, geometry);
            let y_cpu = composite::conv2d::<NdArray>(cpu(&x), filters_cpu.clone(), None, geometry);
            let error = relative_error(y, y_cpu);
            println!("{what}: output relative error {error:.1e}");
            assert!(error < 2e-3, "{what}: output off by {error}");
            let (d_x, d_filters, _) = <Cuda>::fused_conv2d_backward(
                saved,
                Shape::new(shape),
                filters_gpu.clone(),
                gpu(&grad),
                geometry,
                false,
            );
            let (cpu_x, cpu_filters, _) = composite::conv2d_backward::<NdArray>(
                cpu(&x),
                filters_cpu.clone(),
                cpu(&grad),
                geometry,
                false,
            );
            for (name, error) in [
                ("input", relative_error(d_x, cpu_x)),
                (
                    "filter",
                    relative_error(
                        reshaped::<Cuda, 4>(d_filters, drawn),
                        reshaped::<NdArray, 4>(cpu_filters, drawn),
                    ),
                ),
            ] {
                println!("{what}: {name} gradient relative error {error:.1e}");
                assert!(error < 2e-3, "{what}: {name} gradient off by {error}");
            }
        }
    }
}
