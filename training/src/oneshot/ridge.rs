//! Ridge fits from sufficient statistics, and the oracle variance and bias of a local fit
//! (docs/algorithms.md §3.3 steps 4–5).

use super::OneshotError;
use faer::linalg::solvers::{DenseSolveCore, Llt, Solve};
use faer::{Accum, Col, Mat, Par, Side};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which loss the local ridge minimises (§3.3 step 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RidgeForm {
    /// `(1/n)‖y − Xθ‖² + λ‖θ‖²`: `θ̂ = (XᵀX + nλ I)⁻¹ Xᵀy`, the paper's ERM form (default).
    #[default]
    Mean,
    /// `‖y − Xθ‖² + λ‖θ‖²` (scikit-learn's `Ridge(alpha = λ)`): `θ̂ = (XᵀX + λ I)⁻¹ Xᵀy`.
    Sum,
}

impl RidgeForm {
    /// The diagonal load `κ` of `A = XᵀX + κ I` for `n` samples with `λ = 1/√n`:
    /// `κ = nλ = √n` (mean form) or `κ = λ = 1/√n` (sum form).
    pub fn diagonal_load(&self, samples: f64) -> f64 {
        match self {
            RidgeForm::Mean => samples.sqrt(),
            RidgeForm::Sum => 1.0 / samples.sqrt(),
        }
    }
}

impl fmt::Display for RidgeForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RidgeForm::Mean => "mean",
            RidgeForm::Sum => "sum",
        })
    }
}

impl FromStr for RidgeForm {
    type Err = OneshotError;

    fn from_str(s: &str) -> Result<Self, OneshotError> {
        match s {
            "mean" => Ok(RidgeForm::Mean),
            "sum" => Ok(RidgeForm::Sum),
            other => Err(OneshotError::UnknownForm(other.to_string())),
        }
    }
}

/// A ridge estimate and, for a local fit, its oracle quantities.
#[derive(Debug, Clone)]
pub struct RidgeFit {
    /// `θ̂ = A⁻¹ Xᵀy`, `A = XᵀX + κ I`.
    pub theta: Col<f64>,
    /// `a = tr Var(θ̂ | X) = tr(A⁻¹ XᵀX A⁻¹)` (σ² = 1).
    pub variance: f64,
    /// `b = ‖E θ̂ − θ*‖² = ‖κ A⁻¹ θ*‖²`.
    pub squared_bias: f64,
}

/// Fits ridge with diagonal load `kappa` from `gram = XᵀX` and `cross = Xᵀy` by a Cholesky
/// (LLᵀ) factorisation of `A = XᵀX + κ I`, and computes the oracle variance and bias of §3.3
/// step 5 against `theta_star`. The variance uses `tr(A⁻¹ W A⁻¹) = ⟨A⁻¹W, A⁻¹⟩_F` (A⁻¹ is
/// symmetric), free of the cancellation in `tr A⁻¹ − κ‖A⁻¹‖²_F`.
pub fn fit_with_oracle(
    gram: &Mat<f64>,
    cross: &Col<f64>,
    kappa: f64,
    theta_star: &Col<f64>,
) -> Result<RidgeFit, OneshotError> {
    let d = gram.nrows();
    let llt = factor(gram, kappa)?;
    let theta = llt.solve(cross);
    let inverse = llt.inverse();
    let mut inverse_gram = Mat::<f64>::zeros(d, d);
    faer::linalg::matmul::matmul(
        inverse_gram.as_mut(),
        Accum::Replace,
        inverse.as_ref(),
        gram.as_ref(),
        1.0,
        Par::Seq,
    );
    let mut variance = 0.0;
    for j in 0..d {
        for i in 0..d {
            variance += inverse_gram[(i, j)] * inverse[(i, j)];
        }
    }
    let shrunk = llt.solve(theta_star);
    let squared_bias = kappa * kappa * shrunk.squared_norm_l2();
    Ok(RidgeFit {
        theta,
        variance,
        squared_bias,
    })
}

/// The Cholesky (LLᵀ) factorisation of the ridge system `A = XᵀX + κ I`.
fn factor(gram: &Mat<f64>, kappa: f64) -> Result<Llt<f64>, OneshotError> {
    let d = gram.nrows();
    let system = Mat::<f64>::from_fn(d, d, |i, j| gram[(i, j)] + if i == j { kappa } else { 0.0 });
    system
        .llt(Side::Lower)
        .map_err(|e| OneshotError::NotPositiveDefinite {
            cause: format!("{e:?}"),
        })
}

/// Fits ridge with diagonal load `kappa` only (the centralised estimator).
pub fn fit(gram: &Mat<f64>, cross: &Col<f64>, kappa: f64) -> Result<Col<f64>, OneshotError> {
    Ok(factor(gram, kappa)?.solve(cross))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `XᵀX = diag(μ)`, everything is scalar: `θ̂_j = c_j/(μ_j + κ)`,
    /// `a = Σ μ_j/(μ_j + κ)²`, `b = Σ (κ θ*_j/(μ_j + κ))²`.
    #[test]
    fn diagonal_gram_matches_closed_form() {
        let mu = [4.0, 1.0, 0.0];
        let c = [2.0, -1.0, 0.5];
        let theta_star = Col::<f64>::from_fn(3, |j| [0.5, 0.25, 1.0][j]);
        let kappa = 2.0;
        let gram = Mat::<f64>::from_fn(3, 3, |i, j| if i == j { mu[i] } else { 0.0 });
        let cross = Col::<f64>::from_fn(3, |j| c[j]);
        let r = fit_with_oracle(&gram, &cross, kappa, &theta_star).unwrap();
        for j in 0..3 {
            assert!((r.theta[j] - c[j] / (mu[j] + kappa)).abs() < 1e-14);
        }
        let a: f64 = mu.iter().map(|m| m / (m + kappa) / (m + kappa)).sum();
        let b: f64 = (0..3)
            .map(|j| (kappa * theta_star[j] / (mu[j] + kappa)).powi(2))
            .sum();
        assert!((r.variance - a).abs() < 1e-14);
        assert!((r.squared_bias - b).abs() < 1e-14);
        let t = fit(&gram, &cross, kappa).unwrap();
        assert!((&t - &r.theta).norm_l2() < 1e-15);
    }

    #[test]
    fn forms_and_names() {
        assert_eq!(RidgeForm::Mean.diagonal_load(4.0), 2.0);
        assert_eq!(RidgeForm::Sum.diagonal_load(4.0), 0.5);
        assert_eq!("sum".parse::<RidgeForm>().unwrap(), RidgeForm::Sum);
        assert!("median".parse::<RidgeForm>().is_err());
    }
}
