//! Timings of the CUDA kernels the training steps wait for, printed by `fedshard bench
//! kernels` (a build with `--features cuda`): the convolution passes against burn's own
//! kernels, and the cohorts' batched products per matrix-product strategy. Each figure is µs
//! per call over 20 calls between two device synchronisations, after one call that compiles
//! the kernel. They answer which kernel to use; docs/performance.md records what they printed.

use super::{filter_grad, forward, input_grad};
use crate::models::kernels::ConvGeometry;
use burn::backend::Cuda;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, ModuleOps};
use burn::tensor::{Distribution, Tensor};

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

/// µs per call of each convolution pass, burn's direct kernels against the implicit GEMMs of
/// [`super`], on the shapes of the table in docs/performance.md ("Convolutions as implicit
/// GEMMs"): one line per shape to `report`.
pub fn convolution_passes(report: &mut dyn FnMut(String)) {
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
                <Cuda>::conv2d_x_backward(x.clone(), weight.clone(), grad.clone(), options.clone())
            }),
        ];
        let ours = [
            micros(&|| forward(x.clone(), weight.clone(), None, options.clone())),
            micros(&|| filter_grad(x.clone(), weight.clone(), grad.clone(), options.clone())),
            micros(&|| input_grad(x, weight.clone(), grad.clone(), geometry)),
        ];
        report(format!(
            "{name} {shape:?} → {c_out}, {kernel}×{kernel} stride {stride}: forward {:.0} → {:.0}, \
             filter gradient {:.0} → {:.0}, input gradient {:.0} → {:.0} µs",
            burns[0], ours[0], burns[1], ours[1], burns[2], ours[2]
        ));
    }
}

/// The batched products of a cohort's convolutions (the cohort kernels' batched convolution
/// and its backward pass; ResNet-18's 3×3 stride-1 layers at batch 8, a cohort of 10), with
/// their operands' real layouts, through burn's matmul (cubek's `Auto` strategy: no
/// autotuning in this build) and through cubek's strategies named explicitly, and the filter
/// gradient with its k cut into chunks (split-k): µs per call and TFLOP/s, one line per
/// problem to `report`; a strategy that refuses a problem says why. It answers which kernel
/// `Auto` picks for these shapes and how far the best one is from it.
pub fn cohort_products(report: &mut dyn FnMut(String)) {
    use burn::backend::cuda::CudaDevice;
    use burn::tensor::DType;
    use burn_cubecl::kernel::matmul::init_matmul_output;
    use burn_cubecl::tensor::CubeTensor;
    use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
    use cubek::matmul::launch::{Strategy, launch_ref};
    use cubek::std::InputBinding;

    let device = CudaDevice::default();
    let clients = 10;
    let tensor =
        |dims: [usize; 3]| Tensor::<Cuda, 3>::random(dims, Distribution::Normal(0.0, 1.0), &device);
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
                        line += &format!(", {name} {micros:.0} µs ({:.1})", flops / micros / 1e6);
                    }
                    Err(refusal) => line += &format!(", {name} refused ({refusal:?})"),
                }
            }
            report(line);
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
        report(line.trim_end_matches(',').to_string());
    }
}
