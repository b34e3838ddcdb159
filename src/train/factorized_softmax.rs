//! Softmax regression whose weight is trained as a spectral shard, `Ŵ = U diag(ω) Vᵀ`
//! (ALGORITHMS.md §1.7): ω frozen, U and V trained by SGD with momentum, Frobenius decay
//! `(μ/2)‖Ŵ‖²_F` and ClipLR (gradient rows of term j scaled by `min(1, τ/ω_j)`).

use crate::data::Dataset;
use fedshard_actors::trainer::{LayerShard, Recipe};
use fedshard_strategies::rng::ChaCha20Rng;

/// The trainable state: bias, the shard's factors (rows `u'_j` ∈ R^classes, `v'_j` ∈ R^dim) and
/// frozen multipliers.
pub struct FactorizedSoftmax<'a> {
    pub bias: &'a mut [f32],
    pub shard: &'a mut LayerShard,
}

/// ClipLR factor `min(1, τ/ω)` (1 when clipping is off).
pub fn clip_factor(omega: f64, tau: Option<f64>) -> f64 {
    match tau {
        Some(tau) if omega > tau => tau / omega,
        _ => 1.0,
    }
}

/// The effective weight Ŵ = Σ_j ω_j u'_j v'_jᵀ, row-major classes × dim.
pub fn effective_weight(shard: &LayerShard) -> Vec<f64> {
    let (rows, cols) = (shard.rows(), shard.cols());
    let mut w = vec![0.0f64; rows * cols];
    for (j, &omega) in shard.multipliers.iter().enumerate() {
        let u = &shard.left[j * rows..(j + 1) * rows];
        let v = &shard.right[j * cols..(j + 1) * cols];
        for (c, &uc) in u.iter().enumerate() {
            let scale = f64::from(omega) * f64::from(uc);
            for (k, &vk) in v.iter().enumerate() {
                w[c * cols + k] += scale * f64::from(vk);
            }
        }
    }
    w
}

/// Gradients of the mean cross-entropy over `batch` plus Frobenius decay, w.r.t. bias, U, V.
/// Returns the batch's summed loss.
pub fn gradients(
    model: &FactorizedSoftmax<'_>,
    data: &Dataset,
    batch: &[usize],
    decay: f64,
    grad_bias: &mut [f64],
    grad_left: &mut [f64],
    grad_right: &mut [f64],
) -> f64 {
    let shard = &*model.shard;
    let (rows, cols, n) = (shard.rows(), shard.cols(), shard.indices.len());
    grad_bias.fill(0.0);
    grad_left.fill(0.0);
    grad_right.fill(0.0);
    let mut h = vec![0.0f64; n];
    let mut logits = vec![0.0f64; rows];
    let mut loss = 0.0;
    let scale = 1.0 / batch.len() as f64;
    for &s in batch {
        let x = &data.features[s * cols..(s + 1) * cols];
        let y = data.labels[s] as usize;
        for ((hj, v), omega) in h
            .iter_mut()
            .zip(shard.right.chunks_exact(cols))
            .zip(&shard.multipliers)
        {
            let z: f64 = v
                .iter()
                .zip(x)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            *hj = f64::from(*omega) * z;
        }
        for (c, l) in logits.iter_mut().enumerate() {
            *l = f64::from(model.bias[c])
                + (0..n)
                    .map(|j| f64::from(shard.left[j * rows + c]) * h[j])
                    .sum::<f64>();
        }
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let log_sum = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        loss += log_sum - logits[y];
        // g = softmax − onehot, scaled by 1/batch.
        for (c, l) in logits.iter_mut().enumerate() {
            *l = ((*l - log_sum).exp() - if c == y { 1.0 } else { 0.0 }) * scale;
        }
        let g = &logits;
        for (c, gc) in g.iter().enumerate() {
            grad_bias[c] += gc;
        }
        for j in 0..n {
            let u = &shard.left[j * rows..(j + 1) * rows];
            let mut ug = 0.0;
            for c in 0..rows {
                grad_left[j * rows + c] += h[j] * g[c];
                ug += f64::from(u[c]) * g[c];
            }
            let coef = f64::from(shard.multipliers[j]) * ug;
            for (k, xk) in x.iter().enumerate() {
                grad_right[j * cols + k] += coef * f64::from(*xk);
            }
        }
    }
    if decay > 0.0 {
        let w = effective_weight(shard);
        for j in 0..n {
            let omega = f64::from(shard.multipliers[j]);
            let u = &shard.left[j * rows..(j + 1) * rows];
            let v = &shard.right[j * cols..(j + 1) * cols];
            for c in 0..rows {
                let wv: f64 = (0..cols).map(|k| w[c * cols + k] * f64::from(v[k])).sum();
                grad_left[j * rows + c] += decay * omega * wv;
            }
            for k in 0..cols {
                let wu: f64 = (0..rows).map(|c| w[c * cols + k] * f64::from(u[c])).sum();
                grad_right[j * cols + k] += decay * omega * wu;
            }
        }
    }
    loss
}

/// Trains the factorised model on `samples` for the recipe's epochs; returns the mean loss.
pub fn train(
    model: &mut FactorizedSoftmax<'_>,
    data: &Dataset,
    samples: &[usize],
    recipe: &Recipe,
    rng: &mut ChaCha20Rng,
) -> f64 {
    let (rows, cols, n) = (
        model.shard.rows(),
        model.shard.cols(),
        model.shard.indices.len(),
    );
    let mut gb = vec![0.0; rows];
    let mut gl = vec![0.0; n * rows];
    let mut gr = vec![0.0; n * cols];
    let mut mb = vec![0.0; rows];
    let mut ml = vec![0.0; n * rows];
    let mut mr = vec![0.0; n * cols];
    let clip: Vec<f64> = model
        .shard
        .multipliers
        .iter()
        .map(|&w| clip_factor(f64::from(w), recipe.clip_lr))
        .collect();
    let mut order = samples.to_vec();
    let (mut loss, mut seen) = (0.0, 0usize);
    for _ in 0..recipe.epochs {
        crate::data::shuffle(&mut order, rng);
        for batch in order.chunks(recipe.batch_size.max(1)) {
            loss += gradients(
                model,
                data,
                batch,
                recipe.weight_decay,
                &mut gb,
                &mut gl,
                &mut gr,
            );
            seen += batch.len();
            for j in 0..n {
                for c in 0..rows {
                    gl[j * rows + c] *= clip[j];
                }
                for k in 0..cols {
                    gr[j * cols + k] *= clip[j];
                }
            }
            step(model.bias, &gb, &mut mb, recipe);
            step(&mut model.shard.left, &gl, &mut ml, recipe);
            step(&mut model.shard.right, &gr, &mut mr, recipe);
        }
    }
    if seen == 0 { 0.0 } else { loss / seen as f64 }
}

/// SGD with momentum: `m ← βm + g`, `θ ← θ − η m`.
fn step(params: &mut [f32], grad: &[f64], momentum: &mut [f64], recipe: &Recipe) {
    for ((p, g), m) in params.iter_mut().zip(grad).zip(momentum.iter_mut()) {
        *m = recipe.momentum * *m + g;
        *p = (f64::from(*p) - recipe.learning_rate * *m) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> (Dataset, LayerShard, Vec<f32>) {
        let data = Dataset {
            features: vec![0.5, -1.0, 2.0, 0.3, 1.5, -0.7],
            labels: vec![0, 2],
            dim: 3,
            classes: 3,
        };
        let shard = LayerShard {
            name: "weight".into(),
            shape: vec![3, 3],
            indices: vec![0, 2],
            left: vec![0.3, -0.2, 0.5, 0.1, 0.4, -0.6],
            right: vec![0.7, 0.2, -0.1, -0.3, 0.5, 0.9],
            multipliers: vec![1.5, 12.0],
        };
        (data, shard, vec![0.1, 0.0, -0.1])
    }

    fn loss_of(bias: &[f32], shard: &LayerShard, data: &Dataset, decay: f64) -> f64 {
        let mut b = bias.to_vec();
        let mut s = shard.clone();
        let m = FactorizedSoftmax {
            bias: &mut b,
            shard: &mut s,
        };
        let (mut gb, mut gl, mut gr) = (vec![0.0; 3], vec![0.0; 6], vec![0.0; 6]);
        let ce = gradients(&m, data, &[0, 1], 0.0, &mut gb, &mut gl, &mut gr) / 2.0;
        let w = effective_weight(shard);
        ce + 0.5 * decay * w.iter().map(|v| v * v).sum::<f64>()
    }

    /// Analytic gradients (cross-entropy plus the Frobenius-decay term of §1.7) match central
    /// finite differences of the objective to 1e-3 relative (f32 parameters, h = 1e-3).
    #[test]
    fn gradients_match_finite_differences() {
        let (data, shard, bias) = tiny();
        let decay = 0.05;
        let mut b = bias.clone();
        let mut s = shard.clone();
        let m = FactorizedSoftmax {
            bias: &mut b,
            shard: &mut s,
        };
        let (mut gb, mut gl, mut gr) = (vec![0.0; 3], vec![0.0; 6], vec![0.0; 6]);
        gradients(&m, &data, &[0, 1], decay, &mut gb, &mut gl, &mut gr);
        let h = 1e-3f32;
        for i in 0..6 {
            for (right, analytic) in [(false, gl[i]), (true, gr[i])] {
                let mut plus = shard.clone();
                let mut minus = shard.clone();
                let (p, q) = if right {
                    (&mut plus.right, &mut minus.right)
                } else {
                    (&mut plus.left, &mut minus.left)
                };
                p[i] += h;
                q[i] -= h;
                let numeric = (loss_of(&bias, &plus, &data, decay)
                    - loss_of(&bias, &minus, &data, decay))
                    / (2.0 * f64::from(h));
                assert!(
                    (numeric - analytic).abs() <= 1e-3 * analytic.abs().max(1e-2),
                    "param {i} right={right}: {numeric} vs {analytic}"
                );
            }
        }
    }

    #[test]
    fn clip_lr_factors_follow_the_oracle() {
        let factors: Vec<f64> = [1.0, 2.5, 10.0, 25.0, 100.0]
            .iter()
            .map(|&w| clip_factor(w, Some(10.0)))
            .collect();
        assert_eq!(factors, vec![1.0, 1.0, 1.0, 0.4, 0.1]);
        assert_eq!(clip_factor(100.0, None), 1.0);
    }
}
