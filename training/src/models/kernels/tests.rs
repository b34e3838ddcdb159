use super::ndarray::{softmax_backward_rows, softmax_rows};
use super::*;
use burn::backend::{Autodiff, NdArray};
use burn::tensor::ops::ModuleOps;
use burn::tensor::{Distribution, TensorData};
use std::sync::{Mutex, PoisonError};

type B = Autodiff<NdArray>;

/// Normal(0, 2) values drawn right after seeding burn-ndarray's process-wide generator.
/// The lock keeps seeding and drawing together: without it a test on another thread could
/// reseed or draw in between, and the fused and composite runs would get different inputs.
fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<B, D> {
    static SEEDED: Mutex<()> = Mutex::new(());
    let _seeded = SEEDED.lock().unwrap_or_else(PoisonError::into_inner);
    B::seed(&Default::default(), seed);
    Tensor::random(shape, Distribution::Normal(0.0, 2.0), &Default::default())
}

fn vec<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().into_vec().expect("f32")
}

/// Within 2e-5 relative to an element or to the composite's root mean square, whichever is
/// larger: a sum's rounding scales with its terms, and an element where they cancel (a
/// convolution's output near zero among outputs near 100) keeps the rounding of its terms.
fn assert_close(fused: &[f32], composite: &[f32], what: &str) {
    assert_within(2e-5, fused, composite, what);
}

/// [`assert_close`] within `bound` instead of 2e-5.
fn assert_within(bound: f32, fused: &[f32], composite: &[f32], what: &str) {
    assert_eq!(fused.len(), composite.len(), "{what}: lengths");
    let rms = (composite.iter().map(|b| b * b).sum::<f32>() / composite.len().max(1) as f32).sqrt();
    for (i, (a, b)) in fused.iter().zip(composite).enumerate() {
        assert!(
            (a - b).abs() <= bound * (1.0 + b.abs().max(rms)),
            "{what}[{i}]: fused {a}, composite {b}"
        );
    }
}

fn as_autodiff(t: FloatTensor<B>) -> Tensor<B, 3> {
    float(t)
}

/// Runs `fused` and `composite` on the same inputs, then backpropagates the same random
/// cotangent through both and compares outputs and every input's gradient.
fn check(
    inputs: Vec<Tensor<B, 3>>,
    fused: impl Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>,
    composite: impl Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>,
    what: &str,
) {
    check_within(2e-5, inputs, fused, composite, what);
}

/// [`check`] within `bound` ([`assert_within`]).
fn check_within(
    bound: f32,
    inputs: Vec<Tensor<B, 3>>,
    fused: impl Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>,
    composite: impl Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>,
    what: &str,
) {
    let run = |f: &dyn Fn(&[Tensor<B, 3>]) -> Tensor<B, 3>| {
        let xs: Vec<_> = inputs
            .iter()
            .map(|x| x.clone().detach().require_grad())
            .collect();
        let y = f(&xs);
        let cotangent = random(y.dims(), 99);
        let grads = (y.clone() * cotangent).sum().backward();
        let dxs: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| x.grad(&grads).expect("every input gets a gradient"))
            .map(|g| g.into_data().into_vec().expect("f32"))
            .collect();
        (vec(y), dxs)
    };
    let (y_fused, d_fused) = run(&fused);
    let (y_comp, d_comp) = run(&composite);
    assert_within(bound, &y_fused, &y_comp, &format!("{what} output"));
    for (i, (a, b)) in d_fused.iter().zip(&d_comp).enumerate() {
        assert_within(bound, a, b, &format!("{what} gradient of input {i}"));
    }
}

#[test]
fn fused_gelu_matches_the_composite_one() {
    check(
        vec![random([2, 5, 7], 1)],
        |x| gelu(x[0].clone()),
        |x| as_autodiff(composite::gelu::<B>(x[0].clone().into_primitive().tensor())),
        "gelu",
    );
}

#[test]
fn attention_softmax_rows_match_the_composite_softmax_forward_and_backward() {
    let primitive = |t: &Tensor<B, 3>| t.clone().into_primitive().tensor();
    for causal in [false, true] {
        let (x, grad) = (random([3, 6, 6], 2), random([3, 6, 6], 3));
        let y = composite::softmax::<B>(primitive(&x), causal);
        let dx = composite::softmax_backward::<B>(y.clone(), primitive(&grad));
        let mut rows = vec(x);
        softmax_rows(&mut rows, 6, causal);
        assert_close(
            &rows,
            &vec(as_autodiff(y)),
            &format!("softmax (causal {causal})"),
        );
        let mut d_rows = vec(grad);
        softmax_backward_rows(&rows, &mut d_rows, 6);
        assert_close(
            &d_rows,
            &vec(as_autodiff(dx)),
            &format!("softmax backward (causal {causal})"),
        );
    }
    // Causal: row i puts exactly zero mass on positions after i, and each row sums to 1.
    let mut y = vec(random([1, 4, 4], 3));
    softmax_rows(&mut y, 4, true);
    for (i, row) in y.chunks(4).enumerate() {
        assert!(row[i + 1..].iter().all(|&p| p == 0.0), "row {i}: {row:?}");
        assert!(
            (row.iter().sum::<f32>() - 1.0).abs() < 1e-6,
            "row {i}: {row:?}"
        );
    }
}

#[test]
fn fused_layer_norm_matches_the_composite_one_in_all_three_gradients() {
    let gamma = random([1, 1, 9], 5);
    let beta = random([1, 1, 9], 6);
    let flat = |t: &Tensor<B, 3>| t.clone().reshape([9]);
    check(
        vec![random([2, 4, 9], 4), gamma, beta],
        |x| layer_norm(x[0].clone(), flat(&x[1]), flat(&x[2])),
        |x| {
            as_autodiff(composite::layer_norm::<B>(
                x[0].clone().into_primitive().tensor(),
                flat(&x[1]).into_primitive().tensor(),
                flat(&x[2]).into_primitive().tensor(),
            ))
        },
        "layer norm",
    );
}

#[test]
fn fused_linear_matches_the_composite_one_for_plain_and_transposed_weights_and_a_bias() {
    // A factor U (n × out) enters as Uᵀ: a strided view the kernel reads without a copy.
    let plain: fn(&Tensor<B, 3>) -> Tensor<B, 2> = |w| w.clone().reshape([5, 7]);
    let transposed: fn(&Tensor<B, 3>) -> Tensor<B, 2> = |w| w.clone().reshape([7, 5]).transpose();
    let bias = |x: &[Tensor<B, 3>]| x.get(2).map(|b| b.clone().reshape([5]));
    for (weight, stored, with_bias, what) in [
        (plain, [1, 5, 7], false, "linear"),
        (
            transposed,
            [1, 7, 5],
            false,
            "linear with a transposed weight",
        ),
        (plain, [1, 5, 7], true, "linear with a bias"),
        (
            transposed,
            [1, 7, 5],
            true,
            "linear with a transposed weight and a bias",
        ),
    ] {
        let mut inputs = vec![random([2, 3, 7], 7), random(stored, 8)];
        if with_bias {
            inputs.push(random([1, 1, 5], 9));
        }
        check(
            inputs,
            |x| affine(x[0].clone(), weight(&x[1]), bias(x)),
            |x| {
                as_autodiff(composite::linear::<B>(
                    x[0].clone().into_primitive().tensor(),
                    weight(&x[1]).into_primitive().tensor(),
                    bias(x).map(|b| b.into_primitive().tensor()),
                ))
            },
            what,
        );
    }
}

#[test]
fn fused_attention_matches_the_composite_one_in_q_k_and_v() {
    // Sequence lengths 1 (one band), 5 (causal bands of 2 and 3 queries) and 8 (4 and 4).
    for (causal, t) in [(false, 5), (true, 1), (true, 5), (true, 8)] {
        check(
            vec![
                random([2, t, 12], 11),
                random([2, t, 12], 12),
                random([2, t, 12], 13),
            ],
            |x| attention(x[0].clone(), x[1].clone(), x[2].clone(), 3, causal),
            |x| {
                let [out, _] = composite::attention::<B>(
                    x[0].clone().into_primitive().tensor(),
                    x[1].clone().into_primitive().tensor(),
                    x[2].clone().into_primitive().tensor(),
                    3,
                    causal,
                );
                as_autodiff(out)
            },
            &format!("attention (causal {causal}, T {t})"),
        );
    }
    // Causal: the first position attends to itself only, so its output is its own value.
    let (q, k, v) = (
        random([1, 4, 6], 14),
        random([1, 4, 6], 15),
        random([1, 4, 6], 16),
    );
    let out = vec(attention(q, k, v.clone(), 2, true));
    assert_close(&out[..6], &vec(v)[..6], "first causal position");
}

/// `[n, c, side²]` test inputs as `n × c × side × side` images, and back.
fn image(x: &Tensor<B, 3>, side: usize) -> Tensor<B, 4> {
    let [n, c, _] = x.dims();
    x.clone().reshape([n, c, side, side])
}

fn flat(y: Tensor<B, 4>) -> Tensor<B, 3> {
    let [n, c, h, w] = y.dims();
    y.reshape([n, c, h * w])
}

#[test]
fn fused_conv_matches_burns_conv_in_input_and_filter_gradients() {
    for (stride, padding, kernel) in [(1, 1, 3), (2, 1, 3), (1, 0, 1), (2, 0, 3), (1, 2, 5)] {
        let geometry = ConvGeometry {
            kernel: [kernel, kernel],
            stride: [stride, stride],
            padding: [padding, padding],
        };
        let patch = 3 * kernel * kernel;
        let filters = |x: &Tensor<B, 3>| x.clone().reshape([4, patch]);
        let bias = |x: &Tensor<B, 3>| x.clone().reshape([4]);
        check(
            vec![
                random([2, 3, 36], 21),
                random([1, 4, patch], 22),
                random([1, 1, 4], 25),
            ],
            |x| {
                flat(conv2d(
                    image(&x[0], 6),
                    filters(&x[1]),
                    Some(bias(&x[2])),
                    geometry,
                ))
            },
            |x| {
                flat(float(composite::conv2d::<B>(
                    image(&x[0], 6).into_primitive().tensor(),
                    filters(&x[1]).into_primitive().tensor(),
                    Some(bias(&x[2]).into_primitive().tensor()),
                    geometry,
                )))
            },
            &format!("conv {kernel}×{kernel}, stride {stride}, padding {padding}"),
        );
    }
    // A transposed filter matrix (the factorised 1×1 convolution's Uᵀ) is read in place.
    let one_by_one = ConvGeometry {
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0, 0],
    };
    check(
        vec![random([2, 3, 16], 23), random([1, 3, 5], 24)],
        |x| {
            let filters = x[1].clone().reshape([3, 5]).transpose();
            flat(conv2d(image(&x[0], 4), filters, None, one_by_one))
        },
        |x| {
            let filters = x[1].clone().reshape([3, 5]).transpose();
            flat(float(composite::conv2d::<B>(
                image(&x[0], 4).into_primitive().tensor(),
                filters.into_primitive().tensor(),
                None,
                one_by_one,
            )))
        },
        "1×1 conv with transposed filters",
    );
}

/// 3 × 3 stride-1 convolutions over at least 64 channels and 64 tiles take Winograd's tiles on
/// the CPU (`winograd::tests` checks that these shapes do): the same output and gradients as
/// burn's convolution, for even and odd sides (a last tile part outside the output) and three
/// paddings, on 2 × 2 blocks (sides 12 and 13) and 4 × 4 ones (sides 24 to 26). With 72 input
/// and 5 output channels, the last 16 lanes over channels are part filled. F(4 × 4, 3 × 3)'s
/// transforms scale by up to 8 and 1/24 and round more: its worst element here is 2.9e-5
/// off where F(2 × 2)'s is 2.7e-6, so its bound is 1e-4.
#[test]
fn winograd_conv_matches_burns_conv_in_input_and_filter_gradients() {
    let two = [(12, 1), (13, 1), (13, 0), (12, 2)].map(|(side, padding)| (side, padding, 2e-5));
    let four = [(24, 1), (25, 1), (26, 0), (25, 2)].map(|(side, padding)| (side, padding, 1e-4));
    for (side, padding, bound) in two.into_iter().chain(four) {
        let geometry = ConvGeometry {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [padding, padding],
        };
        let filters = |x: &Tensor<B, 3>| x.clone().reshape([5, 72 * 9]);
        let bias = |x: &Tensor<B, 3>| x.clone().reshape([5]);
        let conv = |x: &[Tensor<B, 3>], fused: bool| {
            let (x, f, b) = (image(&x[0], side), filters(&x[1]), Some(bias(&x[2])));
            if fused {
                return flat(conv2d(x, f, b, geometry));
            }
            let [x, f, b] = [
                x.into_primitive().tensor(),
                f.into_primitive().tensor(),
                b.unwrap().into_primitive().tensor(),
            ];
            flat(float(composite::conv2d::<B>(x, f, Some(b), geometry)))
        };
        check_within(
            bound,
            vec![
                random([2, 72, side * side], 31),
                random([1, 5, 72 * 9], 32),
                random([1, 1, 5], 33),
            ],
            |x| conv(x, true),
            |x| conv(x, false),
            &format!("winograd conv, side {side}, padding {padding}"),
        );
    }
}

/// The input gradient built from the stride-1 one (what CUDA runs for strided
/// convolutions) is the adjoint of the strided convolution, `⟨conv(x), g⟩ = ⟨x, ∇ₓ(g)⟩`
/// for random `x` and `g` (the forward convolution is the oracle), and equals burn's own
/// gradient on the CPU; the cases include a kernel smaller than its stride (ResNet-18's
/// 1×1 stride-2 shortcut), odd sides and unequal strides.
#[test]
fn strided_input_gradient_from_the_stride_one_one_is_the_adjoint_of_the_convolution() {
    type C = NdArray;
    let cases = [
        ([1, 1], [2, 2], [0, 0], 16),
        ([3, 3], [2, 2], [1, 1], 7),
        ([2, 2], [3, 3], [0, 0], 8),
        ([3, 3], [2, 1], [1, 1], 9),
    ];
    for (kernel, stride, padding, side) in cases {
        let geometry = ConvGeometry {
            kernel,
            stride,
            padding,
        };
        let what = format!("{kernel:?} kernel, stride {stride:?}, side {side}");
        let x: Tensor<C, 4> = random([2, 3, side, side], 41).inner();
        let weight: Tensor<C, 4> = random([4, 3, kernel[0], kernel[1]], 42).inner();
        let [h, w] = geometry.output([side, side]);
        let g: Tensor<C, 4> = random([2, 4, h, w], 43).inner();
        let prim = |t: &Tensor<C, 4>| t.clone().into_primitive().tensor();
        let input_grad = composite::strided_input_grad::<C>(
            prim(&g),
            &x.shape(),
            geometry,
            |spread, options| C::conv2d_x_backward(prim(&x), prim(&weight), spread, options),
        );
        let input_grad: Tensor<C, 4> = float(input_grad);
        assert_eq!(input_grad.dims(), x.dims(), "{what}: shape");
        let y: Tensor<C, 4> = float(C::conv2d(prim(&x), prim(&weight), None, geometry.options()));
        let lhs: f32 = (y * g.clone()).sum().into_scalar();
        let rhs: f32 = (x.clone() * input_grad.clone()).sum().into_scalar();
        assert!(
            (lhs - rhs).abs() <= 1e-4 * lhs.abs().max(1.0),
            "{what}: ⟨conv(x), g⟩ = {lhs}, ⟨x, ∇ₓ⟩ = {rhs}"
        );
        let burns: Tensor<C, 4> = float(C::conv2d_x_backward(
            prim(&x),
            prim(&weight),
            prim(&g),
            geometry.options(),
        ));
        let values = |t: Tensor<C, 4>| t.into_data().into_vec::<f32>().expect("f32");
        assert_close(&values(input_grad), &values(burns), &what);
    }
}

#[test]
fn fused_group_norm_matches_the_composite_one_in_all_three_gradients() {
    let per_channel = |t: &Tensor<B, 3>| t.clone().reshape([6]);
    for relu in [false, true] {
        check(
            vec![
                random([2, 6, 9], 31),
                random([1, 1, 6], 32),
                random([1, 1, 6], 33),
            ],
            |x| {
                flat(group_norm(
                    image(&x[0], 3),
                    per_channel(&x[1]),
                    per_channel(&x[2]),
                    3,
                    relu,
                ))
            },
            |x| {
                flat(float(composite::group_norm::<B>(
                    image(&x[0], 3).into_primitive().tensor(),
                    [
                        per_channel(&x[1]).into_primitive().tensor(),
                        per_channel(&x[2]).into_primitive().tensor(),
                    ],
                    3,
                    relu,
                )))
            },
            &format!("group norm (relu {relu})"),
        );
    }
}

/// The composite group norm's hand-written backward pass (CUDA's) against the CPU's fused
/// kernel, through the ReLU and without (the test above differentiates the composite forward
/// pass instead).
#[test]
fn composite_group_norm_backward_matches_the_cpu_kernel() {
    use burn::tensor::TensorMetadata;
    use burn::tensor::ops::FloatTensorOps;
    type C = NdArray;
    fn prim<const D: usize>(shape: [usize; D], seed: u64) -> FloatTensor<C> {
        random(shape, seed).inner().into_primitive().tensor()
    }
    fn values(t: FloatTensor<C>) -> Vec<f32> {
        let n = t.shape().num_elements();
        let t: Tensor<C, 1> = float(C::float_reshape(t, Shape::new([n])));
        t.into_data().into_vec().expect("f32")
    }
    for relu in [false, true] {
        let (x, g) = (prim([2, 6, 3, 3], 34), prim([2, 6, 3, 3], 35));
        let params = [prim([6], 36), prim([6], 37)];
        let composite =
            composite::group_norm_backward::<C>(x.clone(), params.clone(), g.clone(), 3, relu);
        let fused = C::fused_group_norm_backward(x, params, g, 3, relu);
        for ((f, c), what) in fused
            .into_iter()
            .zip(composite)
            .zip(["d_x", "d_gamma", "d_beta"])
        {
            assert_close(&values(f), &values(c), &format!("{what} (relu {relu})"));
        }
    }
}

#[test]
fn fused_pooling_matches_the_composite_one_forward_and_backward() {
    for kind in [Pool::Max, Pool::Average] {
        check(
            vec![random([2, 3, 36], 41)],
            |x| flat(pool(image(&x[0], 6), kind, 2)),
            |x| {
                flat(float(composite::pool::<B>(
                    image(&x[0], 6).into_primitive().tensor(),
                    kind,
                    2,
                )))
            },
            &format!("{kind:?} pooling"),
        );
    }
    // Max pooling routes each block's gradient to its maximum only.
    let x = Tensor::<B, 4>::from_data(
        TensorData::new(vec![1.0, 5.0, 2.0, 3.0], [1, 1, 2, 2]),
        &Default::default(),
    )
    .require_grad();
    let grads = pool(x.clone(), Pool::Max, 2).sum().backward();
    let dx: Vec<f32> = x
        .grad(&grads)
        .expect("grad")
        .into_data()
        .into_vec()
        .expect("f32");
    assert_eq!(dx, [0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn gelu_is_gpt2s_tanh_form_with_finite_gradients_everywhere() {
    let xs: Vec<f32> = vec![-200.0, -50.0, -8.0, -1.5, -0.3, 0.0, 0.4, 1.0, 3.0, 60.0];
    for fused in [true, false] {
        let x =
            Tensor::<B, 1>::from_data(TensorData::new(xs.clone(), [xs.len()]), &Default::default())
                .require_grad();
        let y: Tensor<B, 1> = if fused {
            gelu(x.clone())
        } else {
            float(composite::gelu::<B>(x.clone().into_primitive().tensor()))
        };
        let grads = y.clone().sum().backward();
        let dy: Vec<f32> = x
            .grad(&grads)
            .expect("grad")
            .into_data()
            .into_vec()
            .expect("f32");
        let y = vec(y);
        let c = (2.0 / std::f64::consts::PI).sqrt();
        for ((&xi, &yi), &gi) in xs.iter().zip(&y).zip(&dy) {
            let x = f64::from(xi);
            let t = (c * (x + 0.044715 * x.powi(3))).tanh();
            let expected = 0.5 * x * (1.0 + t);
            let slope =
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
            assert!(
                (f64::from(yi) - expected).abs() <= 1e-5 * (1.0 + expected.abs()),
                "gelu({x}), fused {fused}"
            );
            assert!(
                gi.is_finite() && (f64::from(gi) - slope).abs() <= 1e-4,
                "gelu'({x}) = {gi}, expected {slope}, fused {fused}"
            );
        }
    }
}

/// The batched cohort kernels (every backend but the CPU's, where the clients own equal rows)
/// against the one-client-at-a-time ones, forward and backward.
mod batched_cohorts {
    use super::super::cohort::{self, Cohort};
    use super::*;
    use burn::tensor::TensorMetadata;
    use burn::tensor::ops::FloatTensorOps;

    type C = NdArray;

    fn prim<const D: usize>(shape: [usize; D], seed: u64) -> FloatTensor<C> {
        random(shape, seed).inner().into_primitive().tensor()
    }

    fn values(t: FloatTensor<C>) -> Vec<f32> {
        let t: Tensor<C, 1> = float(C::float_reshape(
            t.clone(),
            Shape::new([t.shape().num_elements()]),
        ));
        t.into_data().into_vec().expect("f32")
    }

    fn same(a: FloatTensor<C>, b: FloatTensor<C>, what: &str) {
        assert_eq!(a.shape(), b.shape(), "{what}: shapes");
        assert_close(&values(a), &values(b), what);
    }

    const CLIENTS: usize = 3;

    fn cohort() -> Cohort {
        Cohort::new(vec![2; CLIENTS])
    }

    #[test]
    fn linear() {
        let (x, w, b) = (
            prim([6, 4, 5], 1),
            prim([CLIENTS, 7, 5], 2),
            prim([CLIENTS, 7], 3),
        );
        let c = cohort();
        same(
            cohort::batched_linear::<C>(x.clone(), w.clone(), Some(b.clone()), &c),
            cohort::linear::<C>(x.clone(), w.clone(), Some(b), &c),
            "linear",
        );
        let g = prim([6, 4, 7], 4);
        let (bx, bw, bb) =
            cohort::batched_linear_backward::<C>(x.clone(), w.clone(), g.clone(), true, &c);
        let (ox, ow, ob) = cohort::linear_backward::<C>(x, w, g, true, &c);
        same(bx, ox, "d_x");
        same(bw, ow, "d_w");
        same(bb.expect("bias"), ob.expect("bias"), "d_bias");
    }

    #[test]
    fn layer_norm() {
        let (x, gamma, beta) = (
            prim([6, 3, 8], 5),
            prim([CLIENTS, 8], 6),
            prim([CLIENTS, 8], 7),
        );
        let c = cohort();
        same(
            cohort::batched_layer_norm::<C>(x.clone(), gamma.clone(), beta.clone(), &c),
            cohort::layer_norm::<C>(x.clone(), gamma.clone(), beta, &c),
            "layer norm",
        );
        let g = prim([6, 3, 8], 8);
        let batched =
            cohort::batched_layer_norm_backward::<C>(x.clone(), gamma.clone(), g.clone(), &c);
        let alone = cohort::layer_norm_backward::<C>(x, gamma, g, &c);
        for ((b, a), what) in batched
            .into_iter()
            .zip(alone)
            .zip(["d_x", "d_gamma", "d_beta"])
        {
            same(b, a, what);
        }
    }

    /// On every geometry of the shipped models (3×3 stride 1 and 2 with padding 1, ResNet's
    /// 1×1 stride-2 shortcut) and an odd one (2×2 stride 3, sides that leave a remainder).
    #[test]
    fn conv2d() {
        for (side, c_out, kernel, stride, padding) in [
            (6, 5, 3, 1, 1),
            (7, 4, 3, 2, 1),
            (6, 5, 1, 2, 0),
            (8, 3, 2, 3, 0),
        ] {
            let geometry = ConvGeometry {
                kernel: [kernel, kernel],
                stride: [stride, stride],
                padding: [padding, padding],
            };
            let what = format!("{kernel}×{kernel} stride {stride} padding {padding}");
            let c = cohort();
            assert!(cohort::batches_conv(&c, geometry), "{what}: batched");
            let c_in = 3;
            let input = Shape::new([6, c_in, side, side]);
            let x = prim([6, c_in, side, side], 13);
            let filters = prim([CLIENTS, c_out, c_in * kernel * kernel], 14);
            let bias = prim([CLIENTS, c_out], 15);
            let (batched, saved_b) = cohort::batched_conv2d::<C>(
                x.clone(),
                filters.clone(),
                Some(bias.clone()),
                geometry,
            );
            let (alone, saved_a) =
                cohort::conv2d::<C>(x, filters.clone(), Some(bias), geometry, &c);
            let g = prim(batched.shape().dims::<4>(), 16);
            same(batched, alone, &what);
            let (b_x, b_filters, b_bias) = cohort::batched_conv2d_backward::<C>(
                saved_b,
                input.clone(),
                filters.clone(),
                g.clone(),
                geometry,
                true,
            );
            let (a_x, a_filters, a_bias) =
                cohort::conv2d_backward::<C>(saved_a, input, filters, g, geometry, true, &c);
            let bias = |d: Option<_>| d.expect("asked for the bias gradient");
            for (b, a, name) in [
                (b_x, a_x, "d_x"),
                (b_filters, a_filters, "d_filters"),
                (bias(b_bias), bias(a_bias), "d_bias"),
            ] {
                same(b, a, &format!("{what}: {name}"));
            }
        }
    }

    #[test]
    fn group_norm() {
        for relu in [false, true] {
            let x = prim([6, 4, 3, 3], 9);
            let params = [prim([CLIENTS, 4], 10), prim([CLIENTS, 4], 11)];
            let c = cohort();
            same(
                cohort::batched_group_norm::<C>(x.clone(), params.clone(), 2, relu, &c),
                cohort::group_norm::<C>(x.clone(), params.clone(), 2, relu, &c),
                "group norm",
            );
            let g = prim([6, 4, 3, 3], 12);
            let batched = cohort::batched_group_norm_backward::<C>(
                x.clone(),
                params.clone(),
                g.clone(),
                2,
                relu,
                &c,
            );
            let alone = cohort::group_norm_backward::<C>(x, params, g, 2, relu, &c);
            for ((b, a), what) in batched
                .into_iter()
                .zip(alone)
                .zip(["d_x", "d_gamma", "d_beta"])
            {
                same(b, a, what);
            }
        }
    }
}
