//! Layer and group normalisation, forward and backward, from each row's (group's) moments.

use super::{LANES, contiguous, lane_dot, lane_sum, row_len, tensor, values, writable};
use crate::models::kernels::NORM_EPS;
use burn::tensor::{Shape, TensorMetadata};
use burn_ndarray::NdArrayTensor;

pub(super) fn layer_norm(
    x: NdArrayTensor,
    gamma: NdArrayTensor,
    beta: NdArrayTensor,
) -> NdArrayTensor {
    let shape = x.shape();
    let cols = row_len(&shape);
    let (gamma, beta) = (values(&gamma), values(&beta));
    let mut y = writable(x);
    for row in contiguous(&mut y).chunks_exact_mut(cols) {
        let (mean, inv_std) = moments(row);
        for ((v, g), b) in row.iter_mut().zip(gamma.iter()).zip(beta.iter()) {
            *v = (*v - mean) * inv_std * g + b;
        }
    }
    NdArrayTensor::from(y)
}

pub(super) fn layer_norm_backward(
    x: NdArrayTensor,
    gamma: NdArrayTensor,
    grad: NdArrayTensor,
) -> [NdArrayTensor; 3] {
    let shape = x.shape();
    let cols = row_len(&shape);
    let gamma = values(&gamma);
    let grad = values(&grad);
    let mut dx = writable(x);
    let mut d_gamma = vec![0.0f32; cols];
    let mut d_beta = vec![0.0f32; cols];
    let scale = 1.0 / cols as f32;
    for (row, g) in contiguous(&mut dx)
        .chunks_exact_mut(cols)
        .zip(grad.chunks_exact(cols))
    {
        let (mean, inv_std) = moments(row);
        // row ← x̂; accumulate the parameter gradients and the two row means of dx̂.
        let (mut mean_d, mut mean_dx) = (0.0f32, 0.0f32);
        for j in 0..cols {
            let normed = (row[j] - mean) * inv_std;
            row[j] = normed;
            d_gamma[j] += g[j] * normed;
            d_beta[j] += g[j];
            let d = g[j] * gamma[j];
            mean_d += d;
            mean_dx += d * normed;
        }
        mean_d *= scale;
        mean_dx *= scale;
        for j in 0..cols {
            let normed = row[j];
            row[j] = (g[j] * gamma[j] - mean_d - normed * mean_dx) * inv_std;
        }
    }
    [
        NdArrayTensor::from(dx),
        tensor(d_gamma, Shape::new([cols])),
        tensor(d_beta, Shape::new([cols])),
    ]
}

pub(super) fn group_norm(
    x: NdArrayTensor,
    [gamma, beta]: [NdArrayTensor; 2],
    groups: usize,
    relu: bool,
) -> NdArrayTensor {
    let shape = x.shape();
    let (gamma, beta) = (values(&gamma), values(&beta));
    let (plane, per_group) = group_layout(&shape, groups);
    let mut y = writable(x);
    for (i, group) in contiguous(&mut y)
        .chunks_exact_mut(per_group * plane)
        .enumerate()
    {
        let (mean, inv_std) = moments(group);
        let first = (i % groups) * per_group;
        for (c, values) in group.chunks_exact_mut(plane).enumerate() {
            let (g, b) = (gamma[first + c], beta[first + c]);
            let (scale, shift) = (inv_std * g, b - mean * inv_std * g);
            if relu {
                values
                    .iter_mut()
                    .for_each(|v| *v = (*v * scale + shift).max(0.0));
            } else {
                values.iter_mut().for_each(|v| *v = *v * scale + shift);
            }
        }
    }
    NdArrayTensor::from(y)
}

pub(super) fn group_norm_backward(
    x: NdArrayTensor,
    [gamma, beta]: [NdArrayTensor; 2],
    grad: NdArrayTensor,
    groups: usize,
    relu: bool,
) -> [NdArrayTensor; 3] {
    let shape = x.shape();
    let channels = shape[1];
    let (gamma, beta) = (values(&gamma), values(&beta));
    // Through the ReLU first: zero where the forward output was clamped.
    let mut grad = writable(grad);
    let (plane, per_group) = group_layout(&shape, groups);
    let len = per_group * plane;
    let mut dx = writable(x);
    let mut d_gamma = vec![0.0f32; channels];
    let mut d_beta = vec![0.0f32; channels];
    let scale = 1.0 / len as f32;
    for (i, (group, g)) in contiguous(&mut dx)
        .chunks_exact_mut(len)
        .zip(contiguous(&mut grad).chunks_exact_mut(len))
        .enumerate()
    {
        let (mean, inv_std) = moments(group);
        let first = (i % groups) * per_group;
        // group ← x̂ and g ← the gradient through the ReLU, in element-wise passes; then
        // per channel Σg and Σg·x̂, from which both means of dx̂ = g·γ follow:
        // Σ dx̂ = Σ_c γ_c Σg, Σ dx̂·x̂ = Σ_c γ_c Σg·x̂.
        let (mut mean_d, mut mean_dx) = (0.0f32, 0.0f32);
        for (c, (values, g)) in group
            .chunks_exact_mut(plane)
            .zip(g.chunks_exact_mut(plane))
            .enumerate()
        {
            let (gamma, beta) = (gamma[first + c], beta[first + c]);
            // A select, not a branch: the ReLU's mask is data-dependent and mispredicted
            // about half the time (this loop was 11% of a digits-cnn step).
            for (v, g) in values.iter_mut().zip(g.iter_mut()) {
                let normed = (*v - mean) * inv_std;
                *v = normed;
                *g = if relu && normed * gamma + beta <= 0.0 {
                    0.0
                } else {
                    *g
                };
            }
            let db = lane_sum(g);
            let dg = lane_dot(g, values);
            d_gamma[first + c] += dg;
            d_beta[first + c] += db;
            mean_d += db * gamma;
            mean_dx += dg * gamma;
        }
        mean_d *= scale;
        mean_dx *= scale;
        for (c, (values, g)) in group
            .chunks_exact_mut(plane)
            .zip(g.chunks_exact(plane))
            .enumerate()
        {
            let gamma = gamma[first + c];
            for (v, &g) in values.iter_mut().zip(g) {
                *v = (g * gamma - mean_d - *v * mean_dx) * inv_std;
            }
        }
    }
    [
        NdArrayTensor::from(dx),
        tensor(d_gamma, Shape::new([channels])),
        tensor(d_beta, Shape::new([channels])),
    ]
}

/// The plane size `H·W` and the channels per group of `N × C × H × W` activations.
fn group_layout(shape: &Shape, groups: usize) -> (usize, usize) {
    let channels = shape[1];
    assert!(
        groups > 0 && channels.is_multiple_of(groups),
        "group norm: {channels} channels do not split into {groups} groups"
    );
    (shape[2] * shape[3], channels / groups)
}

/// Mean and `1/√(var + ε)` of a row (population variance, as the composite version).
fn moments(row: &[f32]) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = lane_sum(row) / n;
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (acc, v) in lanes.iter_mut().zip(chunk) {
            *acc += (v - mean) * (v - mean);
        }
    }
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|v| (v - mean) * (v - mean))
        .sum();
    let var = (lanes.iter().sum::<f32>() + tail) / n;
    (mean, 1.0 / (var + NORM_EPS).sqrt())
}
