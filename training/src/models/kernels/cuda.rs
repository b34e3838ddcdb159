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

    /// µs per call of `pass`: one call to warm up (compile), then 20 between device
    /// synchronisations.
    fn micros_per_call(pass: &dyn Fn()) -> f64 {
        let device = Default::default();
        pass();
        <Cuda>::sync(&device).expect("the device synchronises");
        let started = std::time::Instant::now();
        for _ in 0..20 {
            pass();
        }
        <Cuda>::sync(&device).expect("the device synchronises");
        started.elapsed().as_secs_f64() * 1e6 / 20.0
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

    /// A benchmark, not a check: µs per call of each pass, burn's direct kernels against this
    /// module's, 20 calls between device synchronisations, on the shapes of the table in
    /// docs/performance.md ("Convolutions as implicit GEMMs"): `cargo test --release --features
    /// cuda -p fedshard-training convolution_pass_timings -- --ignored --nocapture`.
    #[test]
    #[ignore = "a benchmark that needs an NVIDIA GPU (see its doc comment)"]
    fn convolution_pass_timings() {
        let device = Default::default();
        let cases = [
            ("ResNet", [8, 64, 32, 32], 64, 3, 1, 1),
            ("ResNet", [8, 128, 16, 16], 128, 3, 1, 1),
            ("ResNet", [8, 512, 4, 4], 512, 3, 1, 1),
            ("ResNet", [8, 64, 32, 32], 128, 3, 2, 1),
            ("ResNet shortcut", [8, 64, 32, 32], 128, 1, 2, 0),
            ("CCT tokenizer", [8, 64, 16, 16], 128, 3, 1, 1),
            ("digits CNN", [32, 16, 8, 8], 32, 3, 1, 1),
            ("digits CNN", [8, 16, 8, 8], 32, 3, 1, 1),
        ];
        let micros = |pass: &dyn Fn() -> FloatTensor<Cuda>| {
            micros_per_call(&|| {
                pass();
            })
        };
        for (name, shape, c_out, kernel, stride, padding) in cases {
            let geometry = ConvGeometry {
                kernel: [kernel, kernel],
                stride: [stride, stride],
                padding: [padding, padding],
            };
            let tensor = |shape: [usize; 4]| {
                Tensor::<Cuda, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device)
                    .into_primitive()
                    .tensor()
            };
            let (x, weight) = (tensor(shape), tensor([c_out, shape[1], kernel, kernel]));
            let [h, w] = geometry.output([shape[2], shape[3]]);
            let grad = tensor([shape[0], c_out, h, w]);
            let options = geometry.options();
            let (x, weight, grad, options) = (&x, &weight, &grad, &options);
            let burns = [
                micros(&|| <Cuda>::conv2d(x.clone(), weight.clone(), None, options.clone())),
                micros(&|| {
                    <Cuda>::conv2d_weight_backward(
                        x.clone(),
                        weight.clone(),
                        grad.clone(),
                        options.clone(),
                    )
                }),
                micros(&|| {
                    <Cuda>::conv2d_x_backward(
                        x.clone(),
                        weight.clone(),
                        grad.clone(),
                        options.clone(),
                    )
                }),
            ];
            let ours = [
                micros(&|| forward(x.clone(), weight.clone(), None, options.clone())),
                micros(&|| filter_grad(x.clone(), weight.clone(), grad.clone(), options.clone())),
                micros(&|| input_grad(x, weight.clone(), grad.clone(), geometry)),
            ];
            println!(
                "{name} {shape:?} → {c_out}, {kernel}×{kernel} stride {stride}: forward {:.0} → {:.0}, \
                 filter gradient {:.0} → {:.0}, input gradient {:.0} → {:.0} µs",
                burns[0], ours[0], burns[1], ours[1], burns[2], ours[2]
            );
        }
    }

    /// A benchmark, not a check: the batched products of a cohort's convolutions
    /// (`cohort::batched_conv2d` and its backward pass; ResNet-18's 3×3 stride-1 layers at
    /// batch 8, a cohort of 10), with their operands' real layouts, through burn's matmul
    /// (cubek's `Auto` strategy: no autotuning in this build) and through cubek's strategies
    /// named explicitly, and the filter gradient with its k cut into chunks (split-k). µs per
    /// call over 20 calls between device synchronisations and TFLOP/s; a strategy that refuses
    /// a problem says why. It answers which kernel `Auto` picks for these shapes and how far
    /// the best one is from it: `cargo test --release --features cuda
    /// -p fedshard-training cohort_product_timings -- --ignored --nocapture`.
    #[test]
    #[ignore = "a benchmark that needs an NVIDIA GPU (see its doc comment)"]
    fn cohort_product_timings() {
        use burn::backend::cuda::CudaDevice;
        use burn::tensor::DType;
        use burn_cubecl::kernel::matmul::init_matmul_output;
        use burn_cubecl::tensor::CubeTensor;
        use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
        use cubek::matmul::launch::{Strategy, launch_ref};
        use cubek::std::InputBinding;

        let device = CudaDevice::default();
        let clients = 10;
        let tensor = |dims: [usize; 3]| {
            Tensor::<Cuda, 3>::random(dims, Distribution::Normal(0.0, 1.0), &device)
        };
        // (layer, channels, side): the input of each stride-1 3×3 convolution.
        let layers = [
            ("layer1", 64, 32),
            ("layer2", 128, 16),
            ("layer3", 256, 8),
            ("layer4", 512, 4),
        ];
        let named = || {
            [
                (
                    "SimpleCyclicCmma",
                    Strategy::SimpleCyclicCmma(Default::default()),
                ),
                (
                    "DoubleCyclicCmma",
                    Strategy::DoubleCyclicCmma(Default::default()),
                ),
                ("SimpleTmaCmma", Strategy::SimpleTmaCmma(Default::default())),
                (
                    "SimpleCyclicMma",
                    Strategy::SimpleCyclicMma(Default::default()),
                ),
                ("SimpleUnit", Strategy::SimpleUnit(Default::default())),
                ("DoubleUnit", Strategy::DoubleUnit(Default::default())),
            ]
        };
        for (layer, channels, side) in layers {
            let (rows, patch) = (8 * side * side, channels * 9);
            // (pass, lhs, rhs) as cohort.rs builds them: the patch matrix is contiguous, the
            // filters and the output gradient enter transposed (strided views).
            let problems = [
                (
                    "forward",
                    tensor([clients, rows, patch]),
                    tensor([clients, channels, patch]).swap_dims(1, 2),
                ),
                (
                    "filter gradient",
                    tensor([clients, rows, channels]).swap_dims(1, 2),
                    tensor([clients, rows, patch]),
                ),
                (
                    "input gradient",
                    tensor([clients, rows, patch]),
                    tensor([clients, channels, patch]).swap_dims(1, 2),
                ),
            ];
            for (pass, lhs, rhs) in problems {
                let [_, m, k] = lhs.dims();
                let n = rhs.dims()[2];
                let flops = 2.0 * (clients * m * k * n) as f64;
                let mut line = format!("{layer} {pass} {clients}×({m}×{k} · {k}×{n}):");
                let auto = micros_per_call(&|| {
                    let _ = lhs.clone().matmul(rhs.clone());
                });
                line += &format!(" burn {auto:.0} µs ({:.1} TFLOP/s)", flops / auto / 1e6);
                let lhs: CubeTensor<_> = lhs.clone().into_primitive().tensor();
                let rhs: CubeTensor<_> = rhs.clone().into_primitive().tensor();
                for (name, strategy) in named() {
                    let launch = || {
                        let out = init_matmul_output(&lhs, &rhs, DType::F32);
                        let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
                            lhs: DType::F32.into(),
                            rhs: DType::F32.into(),
                            out: DType::F32.into(),
                        });
                        launch_ref(
                            &strategy,
                            &out.client.clone(),
                            InputBinding::new(lhs.clone().binding(), DType::F32.into()),
                            InputBinding::new(rhs.clone().binding(), DType::F32.into()),
                            out.binding(),
                            &mut dtypes,
                        )
                    };
                    match launch() {
                        Ok(()) => {
                            let micros = micros_per_call(&|| {
                                launch().expect("launched once already");
                            });
                            line +=
                                &format!(", {name} {micros:.0} µs ({:.1})", flops / micros / 1e6);
                        }
                        Err(refusal) => line += &format!(", {name} refused ({refusal:?})"),
                    }
                }
                println!("{line}");
            }
            // The filter gradient's k (the cohort's rows, 8·H·W) dwarfs its m × n: cubek 0.2
            // has no split-k strategy, but cutting k into s chunks as extra batch entries is
            // free here (both operands are row-major along k) and costs one reduction after.
            let (g_rows, patches) = (
                tensor([clients, rows, channels]),
                tensor([clients, rows, patch]),
            );
            let mut line = format!("{layer} filter gradient, k cut into s chunks:");
            for chunks in [2, 4, 8, 16, 32].into_iter().filter(|s| rows % s == 0) {
                let micros = micros_per_call(&|| {
                    let parts = clients * chunks;
                    let g = g_rows.clone().reshape([parts, rows / chunks, channels]);
                    let p = patches.clone().reshape([parts, rows / chunks, patch]);
                    let _ = g
                        .swap_dims(1, 2)
                        .matmul(p)
                        .reshape([clients, chunks, channels, patch])
                        .sum_dim(1);
                });
                line += &format!(" s = {chunks} {micros:.0} µs,");
            }
            println!("{}", line.trim_end_matches(','));
        }
    }
}
