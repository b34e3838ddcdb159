//! Ridge regression clients for the one-shot setting of the FESC paper (docs/algorithms.md §3.3): each
//! client fits `θ̂ = (XᵀX + n λ I)⁻¹ Xᵀy` with `λ = 1/√n` (mean-loss form) in closed form.

use crate::data::DataError;
use crate::data::synthetic::linear_regression;
use crate::oneshot::OneshotError;
use faer::{Col, Mat};
use fedshard_protocol::model::{ModelError, ModelState, NamedTensor};
use fedshard_protocol::task::{
    EvalError, Evaluation, Evaluator, LocalTrainer, TrainError, TrainOutput, TrainTask,
};
use fedshard_strategies::rng::{Purpose, stream};
use rand::Rng;
use thiserror::Error;

/// Why a ridge client or the synthetic setting could not be built or fitted.
#[derive(Debug, Error)]
pub enum RidgeError {
    #[error("ridge regression needs at least one sample")]
    NoSamples,
    /// The regularised Gram matrix did not factor, or the clients' sizes could not be drawn.
    #[error(transparent)]
    Oneshot(#[from] OneshotError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    State(#[from] ModelError),
}

impl From<RidgeError> for TrainError {
    fn from(e: RidgeError) -> Self {
        TrainError::Model(Box::new(e))
    }
}

/// Features (row-major samples × dim) and targets.
#[derive(Debug, Clone)]
pub struct RegressionData {
    pub features: Vec<f32>,
    pub targets: Vec<f32>,
    pub dim: usize,
}

impl RegressionData {
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

/// The ridge estimate of the mean-loss form with λ = 1/√n, κ = nλ = √n
/// (solved by [`crate::oneshot::ridge::fit`]).
pub fn fit(data: &RegressionData) -> Result<Vec<f64>, RidgeError> {
    let (n, d) = (data.len(), data.dim);
    if n == 0 {
        return Err(RidgeError::NoSamples);
    }
    let mut gram = Mat::<f64>::zeros(d, d);
    let mut cross = Col::<f64>::zeros(d);
    for (x, &y) in data.features.chunks_exact(d).zip(&data.targets) {
        for i in 0..d {
            let xi = f64::from(x[i]);
            cross[i] += xi * f64::from(y);
            for j in 0..d {
                gram[(i, j)] += xi * f64::from(x[j]);
            }
        }
    }
    let theta = crate::oneshot::ridge::fit(&gram, &cross, (n as f64).sqrt())?;
    Ok((0..d).map(|i| theta[i]).collect())
}

#[derive(Debug, Clone)]
pub struct RidgeClient {
    pub data: RegressionData,
}

impl LocalTrainer for RidgeClient {
    fn samples(&self) -> u64 {
        self.data.len() as u64
    }

    fn train(&self, task: &TrainTask) -> Result<TrainOutput, TrainError> {
        if task.variates.is_some() {
            return Err(TrainError::Unsupported {
                trainer: "ridge",
                what: "SCAFFOLD's control variates (a closed-form fit takes no steps)".into(),
            });
        }
        let theta = fit(&self.data)?;
        let weight = NamedTensor::new(
            "weight",
            vec![1, self.data.dim],
            theta.iter().map(|&v| v as f32).collect(),
        )
        .map_err(RidgeError::from)?;
        let loss = mse(&weight.data, &self.data);
        let dense = ModelState::new(vec![weight]).map_err(RidgeError::from)?;
        Ok(TrainOutput {
            dense,
            shards: vec![],
            loss,
            control: None,
        })
    }
}

/// Mean squared error of the linear model `w` on `data`.
fn mse(w: &[f32], data: &RegressionData) -> f64 {
    let sum: f64 = data
        .features
        .chunks_exact(data.dim)
        .zip(&data.targets)
        .map(|(x, &y)| {
            let p: f64 = x
                .iter()
                .zip(w)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            (p - f64::from(y)).powi(2)
        })
        .sum();
    sum / data.len().max(1) as f64
}

/// Test MSE as the loss; R² = 1 − MSE / Var(y) in the accuracy column.
pub struct RidgeEvaluator {
    pub test: RegressionData,
}

impl Evaluator for RidgeEvaluator {
    fn evaluate(&self, model: &ModelState) -> Result<Evaluation, EvalError> {
        if self.test.is_empty() {
            return Err(EvalError::EmptyTestSet);
        }
        let w = model
            .get("weight")
            .ok_or_else(|| EvalError::Model(Box::new(ModelError::Missing("weight".into()))))?;
        let loss = mse(&w.data, &self.test);
        let n = self.test.len().max(1) as f64;
        let mean = self.test.targets.iter().map(|&y| f64::from(y)).sum::<f64>() / n;
        let var = self
            .test
            .targets
            .iter()
            .map(|&y| (f64::from(y) - mean).powi(2))
            .sum::<f64>()
            / n;
        Ok(Evaluation {
            accuracy: 1.0 - loss / var,
            loss,
        })
    }
}

/// Clients of the synthetic one-shot setting: θ* ~ U(0, 1)^d, client sizes
/// n_i = max(1, ⌊X_i⌋), X_i ~ LogNormal(γ ln K − ½, 1), data y = xᵀθ* + N(0, 1).
pub fn synthetic_clients(
    clients: usize,
    dim: usize,
    gamma: f64,
    test_samples: usize,
    seed: u64,
) -> Result<(Vec<RidgeClient>, RidgeEvaluator, Vec<f64>), RidgeError> {
    let mut rng = stream(seed, 0, 0, Purpose::SyntheticTruth);
    let theta_star = crate::oneshot::data::true_parameter(&mut rng, dim);
    let theta: Vec<f64> = (0..dim).map(|i| theta_star[i]).collect();
    let sizes = crate::oneshot::data::sample_sizes(&mut rng, clients, gamma)?;
    let mut out = Vec::with_capacity(clients);
    for (c, &n) in sizes.iter().enumerate() {
        let data_seed = stream(seed, 0, c as u64, Purpose::SyntheticSamples).next_u64();
        let (features, targets) = linear_regression(n as usize, dim, &theta, 1.0, data_seed)?;
        out.push(RidgeClient {
            data: RegressionData {
                features,
                targets,
                dim,
            },
        });
    }
    let test_seed = stream(seed, 0, 0, Purpose::SyntheticTest).next_u64();
    let (features, targets) = linear_regression(test_samples, dim, &theta, 1.0, test_seed)?;
    Ok((
        out,
        RidgeEvaluator {
            test: RegressionData {
                features,
                targets,
                dim,
            },
        },
        theta,
    ))
}
