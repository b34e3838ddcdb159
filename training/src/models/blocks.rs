//! Building blocks shared by the models: normalisation layers and causal self-attention, all
//! written over [`Affine`] so every projection can be sharded.

use crate::models::NetError;
use crate::models::builder::{Builder, Init};
use crate::models::kernels::{self, Cohort, Kernels};
use crate::models::layers::{Affine, Weight};
use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// Layer normalisation over the last dimension, with a learned scale and shift.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// `C × d`, per client.
    pub gamma: Param<Tensor<B, 2>>,
    pub beta: Param<Tensor<B, 2>>,
}

impl<B: Kernels> LayerNorm<B> {
    pub fn new(b: &mut Builder<B>, name: &str, dim: usize) -> Result<Self, NetError> {
        Ok(Self {
            gamma: b.vector(&format!("{name}.weight"), dim, Init::Ones)?,
            beta: b.vector(&format!("{name}.bias"), dim, Init::Zeros)?,
        })
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, cohort: &Cohort) -> Tensor<B, D> {
        kernels::cohort_layer_norm(x, self.gamma.val(), self.beta.val(), cohort)
    }
}

/// Group normalisation of `N × C × H × W` activations (ResNet-18 with GroupNorm).
#[derive(Module, Debug)]
pub struct GroupNorm<B: Backend> {
    /// `C × channels`, per client.
    pub gamma: Param<Tensor<B, 2>>,
    pub beta: Param<Tensor<B, 2>>,
    pub groups: usize,
}

impl<B: Kernels> GroupNorm<B> {
    pub fn new(
        b: &mut Builder<B>,
        name: &str,
        channels: usize,
        groups: usize,
    ) -> Result<Self, NetError> {
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(NetError::Groups {
                name: name.to_string(),
                channels,
                groups,
            });
        }
        Ok(Self {
            gamma: b.vector(&format!("{name}.weight"), channels, Init::Ones)?,
            beta: b.vector(&format!("{name}.bias"), channels, Init::Zeros)?,
            groups,
        })
    }

    pub fn forward(&self, x: Tensor<B, 4>, cohort: &Cohort) -> Tensor<B, 4> {
        let (gamma, beta) = (self.gamma.val(), self.beta.val());
        kernels::cohort_group_norm(x, gamma, beta, self.groups, false, cohort)
    }

    /// `relu(self.forward(x))` in one fused pass.
    pub fn forward_relu(&self, x: Tensor<B, 4>, cohort: &Cohort) -> Tensor<B, 4> {
        let (gamma, beta) = (self.gamma.val(), self.beta.val());
        kernels::cohort_group_norm(x, gamma, beta, self.groups, true, cohort)
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
    /// Position i attends to positions 0..=i only.
    pub causal: bool,
}

impl<B: Kernels> SelfAttention<B> {
    /// Attention of width `dim` with `heads` heads over the builder's positions (the tokens),
    /// of which it keeps `kept` (a width slice's; `heads` for the whole layer): q, k and v map
    /// `dim → kept · head_dim`, o maps back to `dim`, and every kept head keeps its
    /// `head_dim = dim / heads`, so the residual width never narrows.
    pub fn new(
        b: &mut Builder<B>,
        name: &str,
        dim: usize,
        [heads, kept]: [usize; 2],
        causal: bool,
    ) -> Result<Self, NetError> {
        if heads == 0 || !dim.is_multiple_of(heads) || kept == 0 || kept > heads {
            return Err(NetError::Heads {
                name: name.to_string(),
                width: dim,
                heads,
            });
        }
        let inner = kept * (dim / heads);
        // The scores Q·Kᵀ and their weighted sum of V: each query meets every key (T of them),
        // or on average (T + 1) / 2 under the causal mask, once in each product, at the width
        // of the kept heads whatever the projections' ranks.
        let tokens = b.positions();
        b.between_activations(if causal {
            (tokens + 1) * inner
        } else {
            2 * tokens * inner
        });
        Ok(Self {
            q: b.affine(&format!("{name}.q"), dim, inner, true, true)?,
            k: b.affine(&format!("{name}.k"), dim, inner, true, true)?,
            v: b.affine(&format!("{name}.v"), dim, inner, true, true)?,
            o: b.affine(&format!("{name}.o"), inner, dim, true, true)?,
            heads: kept,
            causal,
        })
    }

    /// `x`: `N × T × d`.
    pub fn forward(&self, x: Tensor<B, 3>, cohort: &Cohort) -> Tensor<B, 3> {
        let q = self.q.forward(x.clone(), cohort);
        let k = self.k.forward(x.clone(), cohort);
        let v = self.v.forward(x, cohort);
        self.o
            .forward(kernels::attention(q, k, v, self.heads, self.causal), cohort)
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

/// The two-layer MLP of a transformer block, `d → ratio·d → d` with GELU; both shardable.
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    pub fc: Affine<B>,
    pub proj: Affine<B>,
}

impl<B: Kernels> FeedForward<B> {
    pub fn new(
        b: &mut Builder<B>,
        name: &str,
        dim: usize,
        hidden: usize,
    ) -> Result<Self, NetError> {
        Ok(Self {
            fc: b.affine(&format!("{name}.fc"), dim, hidden, true, true)?,
            proj: b.affine(&format!("{name}.proj"), hidden, dim, true, true)?,
        })
    }

    pub fn forward(&self, x: Tensor<B, 3>, cohort: &Cohort) -> Tensor<B, 3> {
        let hidden = kernels::gelu(self.fc.forward(x, cohort));
        self.proj.forward(hidden, cohort)
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

impl<B: Kernels> TransformerBlock<B> {
    pub fn new(
        b: &mut Builder<B>,
        name: &str,
        dim: usize,
        heads: usize,
        hidden: usize,
        causal: bool,
    ) -> Result<Self, NetError> {
        // A width slice keeps some heads (`{name}.heads`) and some MLP units (`{name}.mlp`).
        let kept = b.units(&format!("{name}.heads"), heads);
        let hidden = b.units(&format!("{name}.mlp"), hidden);
        Ok(Self {
            ln1: LayerNorm::new(b, &format!("{name}.ln1"), dim)?,
            attn: SelfAttention::new(b, &format!("{name}.attn"), dim, [heads, kept], causal)?,
            ln2: LayerNorm::new(b, &format!("{name}.ln2"), dim)?,
            mlp: FeedForward::new(b, &format!("{name}.mlp"), dim, hidden)?,
        })
    }

    pub fn forward(&self, x: Tensor<B, 3>, cohort: &Cohort) -> Tensor<B, 3> {
        let attended = self
            .attn
            .forward(self.ln1.forward(x.clone(), cohort), cohort);
        let x = x + attended;
        let mixed = self
            .mlp
            .forward(self.ln2.forward(x.clone(), cohort), cohort);
        x + mixed
    }

    pub fn weights(&self) -> Vec<&Weight<B>> {
        let mut w = self.attn.weights().to_vec();
        w.extend([&self.mlp.fc.weight, &self.mlp.proj.weight]);
        w
    }
}
