//! Synthetic data of the ridge experiment (docs/algorithms.md §3.3 steps 1–3), reduced to what the
//! estimators need: each node's Gram matrix `XᵀX` and cross moment `Xᵀy`.

use super::OneshotError;
use faer::{Accum, Col, Mat, Par};
use rand::Rng;
use rand_distr::{ChiSquared, Distribution, LogNormal, StandardNormal};

/// A node's sufficient statistics for ridge regression.
#[derive(Debug, Clone)]
pub struct NodeMoments {
    /// `n_i`, the number of samples.
    pub samples: u64,
    /// `XᵢᵀXᵢ` (`d × d`).
    pub gram: Mat<f64>,
    /// `Xᵢᵀyᵢ` (`d`).
    pub cross: Col<f64>,
}

/// `θ* ~ U[0,1]^d` (§3.3 step 1).
pub fn true_parameter(rng: &mut impl Rng, dim: usize) -> Col<f64> {
    Col::from_fn(dim, |_| fedshard_strategies::rng::uniform(rng))
}

/// `n_i = max(1, ⌊X_i⌋)` with `X_i ~ LogNormal(γ ln m − 1/2, 1)` (§3.3 step 2), so that
/// `E X_i = m^γ`.
pub fn sample_sizes(
    rng: &mut impl Rng,
    nodes: usize,
    gamma: f64,
) -> Result<Vec<u64>, OneshotError> {
    let mu = gamma * (nodes as f64).ln() - 0.5;
    let law = LogNormal::new(mu, 1.0).map_err(|e| OneshotError::SizeLaw {
        mu,
        cause: e.to_string(),
    })?;
    Ok((0..nodes)
        .map(|_| {
            let x: f64 = law.sample(rng);
            // `as` saturates, so an astronomically large draw stays finite.
            (x.floor() as u64).max(1)
        })
        .collect())
}

/// Draws one node's moments for `x ~ N(0, I_d)`, `y = xᵀθ* + ε`, `ε ~ N(0, 1)` (§3.3 step 3)
/// without forming the `n × d` data matrix when `n ≥ d`:
///
/// * `n ≥ d`: `XᵀX ~ Wishart_d(n, I)` by the Bartlett decomposition, `XᵀX = L Lᵀ` with
///   `L` lower triangular, `L_jj = √c_j`, `c_j ~ χ²(n − j)` (`j = 0..d`), `L_jk ~ N(0,1)` below
///   the diagonal. Given `X`, `Xᵀε ~ N(0, XᵀX)`, and `L z` with `z ~ N(0, I)` has exactly that
///   law, so `Xᵀy = XᵀX θ* + L z`. This is exact in distribution and costs `O(d³)` instead of
///   `O(n d²)` plus `n d` normals, which is what keeps the default experiment (≈ 1.8 million
///   samples per run) within seconds.
/// * `n < d` (the Wishart law is singular): the rows are drawn explicitly, `O(n d²)`.
pub fn node_moments(rng: &mut impl Rng, samples: u64, theta_star: &Col<f64>) -> NodeMoments {
    let d = theta_star.nrows();
    let mut gram = Mat::<f64>::zeros(d, d);
    let mut cross = Col::<f64>::zeros(d);
    if samples >= d as u64 {
        let mut factor = Mat::<f64>::zeros(d, d);
        for j in 0..d {
            let dof = (samples - j as u64) as f64;
            // `dof ≥ 1`, so the law exists.
            let chi2: f64 = ChiSquared::new(dof).map_or(dof, |law| law.sample(rng));
            factor[(j, j)] = chi2.sqrt();
            for k in 0..j {
                factor[(j, k)] = StandardNormal.sample(rng);
            }
        }
        faer::linalg::matmul::matmul(
            gram.as_mut(),
            Accum::Replace,
            factor.as_ref(),
            factor.transpose(),
            1.0,
            Par::Seq,
        );
        let z = Col::<f64>::from_fn(d, |_| StandardNormal.sample(rng));
        faer::linalg::matmul::matmul(
            cross.as_mut(),
            Accum::Replace,
            gram.as_ref(),
            theta_star.as_ref(),
            1.0,
            Par::Seq,
        );
        faer::linalg::matmul::matmul(
            cross.as_mut(),
            Accum::Add,
            factor.as_ref(),
            z.as_ref(),
            1.0,
            Par::Seq,
        );
    } else {
        let rows = samples as usize;
        let x = Mat::<f64>::from_fn(rows, d, |_, _| StandardNormal.sample(rng));
        let y = Col::<f64>::from_fn(rows, |i| {
            let noise: f64 = StandardNormal.sample(rng);
            (0..d).map(|j| x[(i, j)] * theta_star[j]).sum::<f64>() + noise
        });
        faer::linalg::matmul::matmul(
            gram.as_mut(),
            Accum::Replace,
            x.transpose(),
            x.as_ref(),
            1.0,
            Par::Seq,
        );
        faer::linalg::matmul::matmul(
            cross.as_mut(),
            Accum::Replace,
            x.transpose(),
            y.as_ref(),
            1.0,
            Par::Seq,
        );
    }
    NodeMoments {
        samples,
        gram,
        cross,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_strategies::rng::{Purpose, stream};

    /// The Bartlett draw has the Wishart moments `E W = n I`, `Var W_jj = 2n`, `Var W_jk = n`,
    /// and `E Xᵀy = n θ*`, `Var (Xᵀy)_j = n(‖θ*‖² + θ*_j² + 1)` — the moments of the explicit
    /// rows. Each mean is checked to 5 standard errors over T draws.
    #[test]
    fn bartlett_draw_has_the_moments_of_explicit_rows() {
        const T: usize = 4000;
        let (n, d) = (40u64, 4usize);
        let theta = Col::<f64>::from_fn(d, |j| 0.25 * j as f64);
        let norm2: f64 = (0..d).map(|j| theta[j] * theta[j]).sum();
        let mut rng = stream(5, 0, 0, Purpose::Data);
        let mut gram_sum = Mat::<f64>::zeros(d, d);
        let mut cross_sum = Col::<f64>::zeros(d);
        for _ in 0..T {
            let m = node_moments(&mut rng, n, &theta);
            gram_sum += &m.gram;
            cross_sum += &m.cross;
        }
        let nf = n as f64;
        for j in 0..d {
            for k in 0..d {
                let mean = gram_sum[(j, k)] / T as f64;
                let (want, var) = if j == k { (nf, 2.0 * nf) } else { (0.0, nf) };
                assert!(
                    (mean - want).abs() < 5.0 * (var / T as f64).sqrt(),
                    "W[{j},{k}] mean {mean}"
                );
            }
            let mean = cross_sum[j] / T as f64;
            let var = nf * (norm2 + theta[j] * theta[j] + 1.0);
            assert!(
                (mean - nf * theta[j]).abs() < 5.0 * (var / T as f64).sqrt(),
                "Xᵀy[{j}] mean {mean}"
            );
        }
    }

    #[test]
    fn sizes_are_at_least_one() {
        let mut rng = stream(1, 0, 0, Purpose::Data);
        let n = sample_sizes(&mut rng, 1000, 0.2).unwrap();
        assert!(n.iter().all(|&x| x >= 1));
        assert!(n.contains(&1));
    }
}
