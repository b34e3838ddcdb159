//! The kernels under [`Autodiff`]: one graph node per kernel, whose backward pass calls the
//! inner backend's backward kernel.
//!
//! Why: burn's autodiff would otherwise record the 5–10 operations of each composite kernel and
//! replay them backward; one node keeps the fused loops on both passes.

use super::{Cohort, ConvGeometry, Kernels, MaxWindow, Pool};
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DataError, Tensor, TensorMetadata};

/// A graph node with `N` inputs whose backward pass is `backward(state, grad)`, one gradient
/// per input.
#[derive(Debug)]
struct KernelNode<B: Backend, S, const N: usize> {
    backward: fn(S, FloatTensor<B>) -> [FloatTensor<B>; N],
}

impl<B, S, const N: usize> Backward<B, N> for KernelNode<B, S, N>
where
    B: Backend,
    S: Clone + Send + std::fmt::Debug + 'static,
{
    type State = S;

    fn backward(self, ops: Ops<S, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let gradients = (self.backward)(ops.state, grad);
        for (parent, gradient) in ops.parents.into_iter().zip(gradients) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, gradient);
            }
        }
    }
}

/// Records `output`, computed by a kernel from `inputs`, in the graph; `state` is what the
/// backward pass needs.
fn record<B, C, S, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    output: FloatTensor<B>,
    state: S,
    backward: fn(S, FloatTensor<B>) -> [FloatTensor<B>; N],
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    S: Clone + Send + std::fmt::Debug + 'static,
{
    let node = KernelNode { backward };
    match node
        .prepare::<C>(inputs.map(|t| t.node))
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// One graph node per kernel; the backward pass runs the inner backend's backward kernel.
impl<B: Kernels, C: CheckpointStrategy> Kernels for Autodiff<B, C> {
    const BATCHED_COHORTS: bool = B::BATCHED_COHORTS;

    fn read_values<const D: usize>(t: Tensor<Self, D>) -> Result<Vec<f32>, DataError> {
        B::read_values(t.inner())
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let (y, saved) = (B::fused_gelu(x.primitive.clone()), x.primitive.clone());
        record::<B, C, _, 1>([x], y, saved, |x, g| [B::fused_gelu_backward(x, g)])
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let y = B::fused_layer_norm(
            x.primitive.clone(),
            gamma.primitive.clone(),
            beta.primitive.clone(),
        );
        let state = (x.primitive.clone(), gamma.primitive.clone());
        record::<B, C, _, 3>([x, gamma, beta], y, state, |(x, gamma), g| {
            B::fused_layer_norm_backward(x, gamma, g)
        })
    }

    fn fused_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let y = B::fused_linear(
            x.primitive.clone(),
            w.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
        );
        let state = (x.primitive.clone(), w.primitive.clone());
        match bias {
            Some(bias) => record::<B, C, _, 3>([x, w, bias], y, state, |(x, w), g| {
                let [d_x, d_w] = B::fused_linear_backward(x, w, g.clone());
                [d_x, d_w, B::fused_bias_backward(g)]
            }),
            None => record::<B, C, _, 2>([x, w], y, state, |(x, w), g| {
                B::fused_linear_backward(x, w, g)
            }),
        }
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        causal: bool,
    ) -> [FloatTensor<Self>; 2] {
        let qkv = [
            q.primitive.clone(),
            k.primitive.clone(),
            v.primitive.clone(),
        ];
        let [out, probs] = B::fused_attention(
            qkv[0].clone(),
            qkv[1].clone(),
            qkv[2].clone(),
            heads,
            causal,
        );
        let probs_out = probs.clone();
        let state = (qkv, probs, causal);
        let out = record::<B, C, _, 3>([q, k, v], out, state, |(qkv, probs, causal), g| {
            B::fused_attention_backward(qkv, probs, g, causal)
        });
        [out, Self::from_inner(probs_out)]
    }

    fn fused_conv2d(
        x: FloatTensor<Self>,
        filters: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        geometry: ConvGeometry,
    ) -> [FloatTensor<Self>; 2] {
        let [y, saved] = B::fused_conv2d(
            x.primitive.clone(),
            filters.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            geometry,
        );
        let saved_out = Self::from_inner(saved.clone());
        let state = (
            saved,
            x.primitive.shape(),
            filters.primitive.clone(),
            geometry,
        );
        let y = match bias {
            Some(bias) => record::<B, C, _, 3>([x, filters, bias], y, state, |s, g| {
                let (d_x, d_filters, d_bias) =
                    B::fused_conv2d_backward(s.0, s.1, s.2, g, s.3, true);
                [d_x, d_filters, d_bias.expect("asked for the bias gradient")]
            }),
            None => record::<B, C, _, 2>([x, filters], y, state, |s, g| {
                let (d_x, d_filters, _) = B::fused_conv2d_backward(s.0, s.1, s.2, g, s.3, false);
                [d_x, d_filters]
            }),
        };
        [y, saved_out]
    }

    fn fused_group_norm(
        x: FloatTensor<Self>,
        [gamma, beta]: [FloatTensor<Self>; 2],
        groups: usize,
        relu: bool,
    ) -> FloatTensor<Self> {
        let params = [gamma.primitive.clone(), beta.primitive.clone()];
        let y = B::fused_group_norm(x.primitive.clone(), params.clone(), groups, relu);
        let state = (x.primitive.clone(), params, groups, relu);
        record::<B, C, _, 3>([x, gamma, beta], y, state, |s, g| {
            B::fused_group_norm_backward(s.0, s.1, g, s.2, s.3)
        })
    }

    fn fused_pool(x: FloatTensor<Self>, kind: Pool, k: usize) -> FloatTensor<Self> {
        let y = B::fused_pool(x.primitive.clone(), kind, k);
        let state = (x.primitive.clone(), kind, k);
        record::<B, C, _, 1>([x], y, state, |(x, kind, k), g| {
            [B::fused_pool_backward(x, g, kind, k)]
        })
    }

    fn fused_max_pool(x: FloatTensor<Self>, window: MaxWindow) -> FloatTensor<Self> {
        let y = B::fused_max_pool(x.primitive.clone(), window);
        let state = (x.primitive.clone(), window);
        record::<B, C, _, 1>([x], y, state, |(x, window), g| {
            [B::fused_max_pool_backward(x, g, window)]
        })
    }

    fn cohort_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        cohort: &Cohort,
    ) -> FloatTensor<Self> {
        let y = B::cohort_linear(
            x.primitive.clone(),
            w.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            cohort,
        );
        let state = (x.primitive.clone(), w.primitive.clone(), cohort.clone());
        match bias {
            Some(bias) => record::<B, C, _, 3>([x, w, bias], y, state, |(x, w, cohort), g| {
                let (d_x, d_w, d_b) = B::cohort_linear_backward(x, w, g, true, &cohort);
                [d_x, d_w, d_b.expect("asked for the bias gradient")]
            }),
            None => record::<B, C, _, 2>([x, w], y, state, |(x, w, cohort), g| {
                let (d_x, d_w, _) = B::cohort_linear_backward(x, w, g, false, &cohort);
                [d_x, d_w]
            }),
        }
    }

    fn cohort_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        cohort: &Cohort,
    ) -> FloatTensor<Self> {
        let y = B::cohort_layer_norm(
            x.primitive.clone(),
            gamma.primitive.clone(),
            beta.primitive.clone(),
            cohort,
        );
        let state = (x.primitive.clone(), gamma.primitive.clone(), cohort.clone());
        record::<B, C, _, 3>([x, gamma, beta], y, state, |(x, gamma, cohort), g| {
            B::cohort_layer_norm_backward(x, gamma, g, &cohort)
        })
    }

    fn cohort_conv2d(
        x: FloatTensor<Self>,
        filters: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        geometry: ConvGeometry,
        cohort: &Cohort,
    ) -> (FloatTensor<Self>, Vec<FloatTensor<Self>>) {
        let (y, saved) = B::cohort_conv2d(
            x.primitive.clone(),
            filters.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            geometry,
            cohort,
        );
        let saved_out = saved.iter().cloned().map(Self::from_inner).collect();
        let state = (
            saved,
            x.primitive.shape(),
            filters.primitive.clone(),
            geometry,
            cohort.clone(),
        );
        let y = match bias {
            Some(bias) => record::<B, C, _, 3>([x, filters, bias], y, state, |s, g| {
                let (d_x, d_filters, d_bias) =
                    B::cohort_conv2d_backward(s.0, s.1, s.2, g, s.3, true, &s.4);
                [d_x, d_filters, d_bias.expect("asked for the bias gradient")]
            }),
            None => record::<B, C, _, 2>([x, filters], y, state, |s, g| {
                let (d_x, d_filters, _) =
                    B::cohort_conv2d_backward(s.0, s.1, s.2, g, s.3, false, &s.4);
                [d_x, d_filters]
            }),
        };
        (y, saved_out)
    }

    fn cohort_group_norm(
        x: FloatTensor<Self>,
        [gamma, beta]: [FloatTensor<Self>; 2],
        groups: usize,
        relu: bool,
        cohort: &Cohort,
    ) -> FloatTensor<Self> {
        let params = [gamma.primitive.clone(), beta.primitive.clone()];
        let y = B::cohort_group_norm(x.primitive.clone(), params.clone(), groups, relu, cohort);
        let state = (x.primitive.clone(), params, groups, relu, cohort.clone());
        record::<B, C, _, 3>([x, gamma, beta], y, state, |s, g| {
            B::cohort_group_norm_backward(s.0, s.1, g, s.2, s.3, &s.4)
        })
    }
}
