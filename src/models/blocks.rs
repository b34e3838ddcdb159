//! Building blocks shared by the models: normalisation layers and causal self-attention, all
//! written over [`Affine`] so every projection can be sharded.

use crate::models::builder::{Builder, Init};
use crate::models::layers::{Affine, Weight};
use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// Layer normalisation over the last dimension, with a learned scale and shift.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    pub gamma: Param<Tensor<B, 1>>,
    pub beta: Param<Tensor<B, 1>>,
}

const NORM_EPS: f64 = 1e-5;

impl<B: Backend> LayerNorm<B> {
    pub fn new(b: &mut Builder<B>, name: &str, dim: usize) -> Result<Self, String> {
        Ok(Self {
            gamma: b.tensor(&format!("{name}.weight"), [dim], Init::Ones)?,
            beta: b.tensor(&format!("{name}.bias"), [dim], Init::Zeros)?,
        })
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let centred = x.clone() - x.mean_dim(D - 1);
        // A product, not `powi`: the ndarray backend raises to a power through `powf`.
        let var = (centred.clone() * centred.clone()).mean_dim(D - 1);
        let normed = centred / var.add_scalar(NORM_EPS).sqrt();
        let shape = |t: Tensor<B, 1>| {
            let mut s = [1; D];
            s[D - 1] = t.dims()[0];
            t.reshape(s)
        };
        normed * shape(self.gamma.val()) + shape(self.beta.val())
    }
}

/// Group normalisation of `N × C × H × W` activations (ResNet-18 with GroupNorm).
#[derive(Module, Debug)]
pub struct GroupNorm<B: Backend> {
    pub gamma: Param<Tensor<B, 1>>,
    pub beta: Param<Tensor<B, 1>>,
    pub groups: usize,
}

impl<B: Backend> GroupNorm<B> {
    pub fn new(
        b: &mut Builder<B>,
        name: &str,
        channels: usize,
        groups: usize,
    ) -> Result<Self, String> {
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(format!(
                "`{name}`: {channels} channels do not split into {groups} groups"
            ));
        }
        Ok(Self {
            gamma: b.tensor(&format!("{name}.weight"), [channels], Init::Ones)?,
            beta: b.tensor(&format!("{name}.bias"), [channels], Init::Zeros)?,
            groups,
        })
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [n, c, h, w] = x.dims();
        let grouped: Tensor<B, 3> = x.reshape([n, self.groups, (c / self.groups) * h * w]);
        let centred = grouped.clone() - grouped.mean_dim(2);
        let var = (centred.clone() * centred.clone()).mean_dim(2);
        let normed = (centred / var.add_scalar(NORM_EPS).sqrt()).reshape([n, c, h, w]);
        normed * self.gamma.val().reshape([1, c, 1, 1]) + self.beta.val().reshape([1, c, 1, 1])
    }
}

/// Multi-head self-attention with four (shardable) projections q, k, v and o.
#[derive(Module, Debug)]
pub struct SelfAttention<B: Backend> {
    pub q: Affine<B>,
    pub k: Affine<B>,
    pub v: Affine<B>,
    pub o: Affine<B>,
    pub heads: usize,
}

impl<B: Backend> SelfAttention<B> {
    pub fn new(b: &mut Builder<B>, name: &str, dim: usize, heads: usize) -> Result<Self, String> {
        if heads == 0 || !dim.is_multiple_of(heads) {
            return Err(format!(
                "`{name}`: width {dim} does not split into {heads} heads"
            ));
        }
        Ok(Self {
            q: b.affine(&format!("{name}.q"), dim, dim, true, true)?,
            k: b.affine(&format!("{name}.k"), dim, dim, true, true)?,
            v: b.affine(&format!("{name}.v"), dim, dim, true, true)?,
            o: b.affine(&format!("{name}.o"), dim, dim, true, true)?,
            heads,
        })
    }

    /// `x`: `N × T × d`; `mask`: additive `T × T` (−∞ above the diagonal for causal attention).
    pub fn forward(&self, x: Tensor<B, 3>, mask: Option<&Tensor<B, 2>>) -> Tensor<B, 3> {
        let [n, t, d] = x.dims();
        let h = self.heads;
        let split = |y: Tensor<B, 3>| y.reshape([n, t, h, d / h]).swap_dims(1, 2);
        // Scaling q (N·T·d values) rather than the scores (N·h·T·T) is the same product, cheaper.
        let q = split(
            self.q
                .forward(x.clone())
                .div_scalar(((d / h) as f64).sqrt()),
        );
        let k = split(self.k.forward(x.clone()));
        let v = split(self.v.forward(x));
        let mut scores = q.matmul(k.swap_dims(2, 3));
        if let Some(m) = mask {
            scores = scores + m.clone().reshape([1, 1, t, t]);
        }
        let context = softmax(scores, 3)
            .matmul(v)
            .swap_dims(1, 2)
            .reshape([n, t, d]);
        self.o.forward(context)
    }

    pub fn weights(&self) -> [&Weight<B>; 4] {
        [
            &self.q.weight,
            &self.k.weight,
            &self.v.weight,
            &self.o.weight,
        ]
    }
}

/// The additive causal mask: 0 on and below the diagonal, a large negative number above.
pub fn causal_mask<B: Backend>(t: usize, device: &B::Device) -> Tensor<B, 2> {
    let data: Vec<f32> = (0..t * t)
        .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
        .collect();
    Tensor::from_data(TensorData::new(data, [t, t]), device)
}

/// GPT-2's GELU, `x · ½(1 + tanh(√(2/π)(x + 0.044715 x³)))`, computed as `x · σ(2u)` with
/// `σ(y) = 1 / (1 + e^{−y})` (the same function, since ½(1 + tanh u) = σ(2u)).
///
/// Why not burn's own functions: on the ndarray backend `tanh` is a libm call per element
/// (≈30% of a char-transformer step, forward plus its recomputation in the backward pass),
/// `sigmoid` is exp(−ln(1 + e^{−x})) and the exact GELU goes through `erf`. One `exp` and one
/// `recip` are cheap; the exponent is clamped at 80 so that e^{−y} stays finite (σ is then
/// 0 to f32 precision, and so is its gradient).
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let c = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
    let u = x.clone() * (x.clone() * x.clone()).mul_scalar(0.044715).add_scalar(1.0);
    let sigma = u
        .mul_scalar(-c)
        .clamp_max(80.0)
        .exp()
        .add_scalar(1.0)
        .recip();
    x * sigma
}

/// The two-layer MLP of a transformer block, `d → ratio·d → d` with GELU; both shardable.
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    pub fc: Affine<B>,
    pub proj: Affine<B>,
}

impl<B: Backend> FeedForward<B> {
    pub fn new(b: &mut Builder<B>, name: &str, dim: usize, hidden: usize) -> Result<Self, String> {
        Ok(Self {
            fc: b.affine(&format!("{name}.fc"), dim, hidden, true, true)?,
            proj: b.affine(&format!("{name}.proj"), hidden, dim, true, true)?,
        })
    }

    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.proj.forward(gelu(self.fc.forward(x)))
    }
}

/// A pre-norm transformer block (GPT-2 and CCT layout): `x + attn(ln1 x)`, then
/// `x + mlp(ln2 x)`.
#[derive(Module, Debug)]
pub struct TransformerBlock<B: Backend> {
    pub ln1: LayerNorm<B>,
    pub attn: SelfAttention<B>,
    pub ln2: LayerNorm<B>,
    pub mlp: FeedForward<B>,
}

impl<B: Backend> TransformerBlock<B> {
    pub fn new(
        b: &mut Builder<B>,
        name: &str,
        dim: usize,
        heads: usize,
        hidden: usize,
    ) -> Result<Self, String> {
        Ok(Self {
            ln1: LayerNorm::new(b, &format!("{name}.ln1"), dim)?,
            attn: SelfAttention::new(b, &format!("{name}.attn"), dim, heads)?,
            ln2: LayerNorm::new(b, &format!("{name}.ln2"), dim)?,
            mlp: FeedForward::new(b, &format!("{name}.mlp"), dim, hidden)?,
        })
    }

    pub fn forward(&self, x: Tensor<B, 3>, mask: Option<&Tensor<B, 2>>) -> Tensor<B, 3> {
        let x = x.clone() + self.attn.forward(self.ln1.forward(x), mask);
        x.clone() + self.mlp.forward(self.ln2.forward(x))
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        let mut w = self.attn.weights().to_vec();
        w.extend([&self.mlp.fc.weight, &self.mlp.proj.weight]);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};

    type B = Autodiff<NdArray>;

    #[test]
    fn gelu_is_gpt2s_tanh_form_with_finite_gradients_everywhere() {
        let xs: Vec<f32> = vec![-200.0, -50.0, -8.0, -1.5, -0.3, 0.0, 0.4, 1.0, 3.0, 60.0];
        let x =
            Tensor::<B, 1>::from_data(TensorData::new(xs.clone(), [xs.len()]), &Default::default())
                .require_grad();
        let y = gelu(x.clone());
        let grads = y.clone().sum().backward();
        let dy: Vec<f32> = x
            .grad(&grads)
            .expect("grad")
            .into_data()
            .into_vec()
            .expect("f32");
        let y: Vec<f32> = y.into_data().into_vec().expect("f32");
        let c = (2.0 / std::f64::consts::PI).sqrt();
        for ((&xi, &yi), &gi) in xs.iter().zip(&y).zip(&dy) {
            let x = f64::from(xi);
            let t = (c * (x + 0.044715 * x.powi(3))).tanh();
            let expected = 0.5 * x * (1.0 + t);
            let slope =
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
            assert!(
                (f64::from(yi) - expected).abs() <= 1e-5 * (1.0 + expected.abs()),
                "gelu({x})"
            );
            assert!(
                gi.is_finite() && (f64::from(gi) - slope).abs() <= 1e-4,
                "gelu'({x}) = {gi}, expected {slope}"
            );
        }
    }
}
