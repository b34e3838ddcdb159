//! Multinomial logistic regression, `p(y | x) = softmax(W x + b)`, trained by mini-batch SGD
//! with momentum: the first model family, small enough to exercise the federated runtime before
//! neural networks land, and convex, so its results are easy to check.
//!
//! Parameters live in a [`ModelState`] with `"bias": [classes]` and `"weight": [classes, dim]`
//! (row-major: row `k` holds the weights of class `k`, contiguous for the dot product with a
//! sample).

use fedshard_strategies::rng::{Purpose, stream};
use serde::{Deserialize, Serialize};

use super::{ModelError, ModelState, NamedTensor, Result};
use crate::data::{Dataset, shuffle};

/// Name of the `[classes]` bias tensor.
pub const BIAS: &str = "bias";
/// Name of the `[classes, dim]` weight tensor.
pub const WEIGHT: &str = "weight";

/// The zero model: uniform predictions, loss `ln(classes)`. The problem is convex, so no random
/// initialisation is needed (and none is drawn).
pub fn init(dim: usize, classes: usize) -> ModelState {
    ModelState {
        // Already in name order: "bias" < "weight".
        tensors: vec![
            NamedTensor::zeros(BIAS, vec![classes]),
            NamedTensor::zeros(WEIGHT, vec![classes, dim]),
        ],
    }
}

/// Local SGD recipe. Defaults follow the federated recipe of DESIGN.md (momentum 0.9,
/// decay 1e-4) with a step size suited to features in `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SgdConfig {
    /// Step size, > 0.
    pub lr: f64,
    /// Passes over the local data, ≥ 1.
    pub epochs: usize,
    /// Samples per step, ≥ 1 (the last batch of an epoch may be smaller).
    pub batch_size: usize,
    /// Heavy-ball momentum in `[0, 1)`; the velocity starts at zero on every call, because a
    /// client does not keep optimiser state between rounds.
    pub momentum: f64,
    /// L2 (Frobenius) decay on the weight matrix, ≥ 0; the bias is not decayed.
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 0.1,
            epochs: 1,
            batch_size: 32,
            momentum: 0.9,
            weight_decay: 1e-4,
        }
    }
}

impl SgdConfig {
    /// Checks every field's domain; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let invalid = |name, value: String, expected| {
            Err(ModelError::InvalidConfig {
                name,
                value,
                expected,
            })
        };
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return invalid("lr", self.lr.to_string(), "a finite step size > 0");
        }
        if self.epochs == 0 {
            return invalid("epochs", "0".into(), "at least one epoch");
        }
        if self.batch_size == 0 {
            return invalid("batch_size", "0".into(), "at least one sample per batch");
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return invalid("momentum", self.momentum.to_string(), "a value in [0, 1)");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return invalid(
                "weight_decay",
                self.weight_decay.to_string(),
                "a finite value ≥ 0",
            );
        }
        Ok(())
    }
}

/// Outcome of a local training call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    /// The trained parameters (finite, same layout as the input state).
    pub state: ModelState,
    /// Mean cross-entropy over all batches of all epochs, each measured before its step.
    pub mean_loss: f64,
    /// Local samples `D_c` (the aggregation weight), not samples × epochs.
    pub samples: usize,
}

/// Held-out quality of a state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Fraction of samples whose arg-max class (lowest class on ties) is the label.
    pub accuracy: f64,
    /// Mean cross-entropy in nats.
    pub mean_loss: f64,
}

/// Trains a copy of `state` on `data` by mini-batch SGD with momentum.
///
/// Each epoch visits the samples in an order shuffled from
/// `stream(seed, epoch, 0, Purpose::Training)`; the caller passes a seed specific to its run,
/// round and client so clients do not share batch orders. Errors when the state is not a
/// softmax model for `data` (shapes, classes), the config is out of range, `data` is empty, or
/// training diverges to non-finite values — a diverged model is never returned.
pub fn train(
    state: &ModelState,
    data: &Dataset,
    cfg: &SgdConfig,
    seed: u64,
) -> Result<TrainReport> {
    cfg.validate()?;
    let (classes, dim) = layout(state)?;
    check_data(data, classes, dim)?;
    if data.is_empty() {
        return Err(ModelError::DataMismatch(
            "cannot train on an empty dataset".into(),
        ));
    }

    let mut weight = state.require(WEIGHT)?.data.clone();
    let mut bias = state.require(BIAS)?.data.clone();
    let mut velocity_w = vec![0.0f32; weight.len()];
    let mut velocity_b = vec![0.0f32; bias.len()];
    let mut grad_w = vec![0.0f32; weight.len()];
    let mut grad_b = vec![0.0f32; bias.len()];
    let mut logits = vec![0.0f32; classes];
    let mut order: Vec<usize> = Vec::with_capacity(data.len());

    let (lr, momentum, decay) = (cfg.lr as f32, cfg.momentum as f32, cfg.weight_decay as f32);
    let mut loss_sum = 0.0f64;
    for epoch in 0..cfg.epochs {
        order.clear();
        order.extend(0..data.len());
        shuffle(
            &mut order,
            &mut stream(seed, epoch as u64, 0, Purpose::Training),
        );
        for batch in order.chunks(cfg.batch_size) {
            grad_w.fill(0.0);
            grad_b.fill(0.0);
            loss_sum += accumulate_gradient(
                &weight,
                &bias,
                data,
                batch,
                &mut logits,
                &mut grad_w,
                &mut grad_b,
            );
            let scale = 1.0 / batch.len() as f32;
            for ((w, v), g) in weight.iter_mut().zip(&mut velocity_w).zip(&grad_w) {
                *v = momentum * *v + g * scale + decay * *w;
                *w -= lr * *v;
            }
            for ((b, v), g) in bias.iter_mut().zip(&mut velocity_b).zip(&grad_b) {
                *v = momentum * *v + g * scale;
                *b -= lr * *v;
            }
        }
    }

    let mean_loss = loss_sum / (data.len() * cfg.epochs) as f64;
    let trained = ModelState {
        tensors: vec![
            NamedTensor {
                name: BIAS.into(),
                shape: vec![classes],
                data: bias,
            },
            NamedTensor {
                name: WEIGHT.into(),
                shape: vec![classes, dim],
                data: weight,
            },
        ],
    };
    if !mean_loss.is_finite() || !trained.is_finite() {
        return Err(ModelError::NonFinite(format!(
            "softmax training diverged (mean loss {mean_loss}); lower lr = {}",
            cfg.lr
        )));
    }
    Ok(TrainReport {
        state: trained,
        mean_loss,
        samples: data.len(),
    })
}

/// Accuracy and mean cross-entropy of `state` on `data`. Errors when the state does not fit the
/// data or `data` is empty (an accuracy of 0/0 is not a number to report).
pub fn evaluate(state: &ModelState, data: &Dataset) -> Result<Evaluation> {
    let (classes, dim) = layout(state)?;
    check_data(data, classes, dim)?;
    if data.is_empty() {
        return Err(ModelError::DataMismatch(
            "cannot evaluate on an empty dataset".into(),
        ));
    }
    let weight = &state.require(WEIGHT)?.data;
    let bias = &state.require(BIAS)?.data;
    let mut logits = vec![0.0f32; classes];
    let mut loss_sum = 0.0f64;
    let mut correct = 0usize;
    for (i, &label) in data.labels.iter().enumerate() {
        compute_logits(weight, bias, data.row(i), &mut logits);
        let (top, log_sum) = log_sum_exp(&logits);
        loss_sum += log_sum - logits[label as usize] as f64;
        if argmax(&logits, top) == label as usize {
            correct += 1;
        }
    }
    Ok(Evaluation {
        accuracy: correct as f64 / data.len() as f64,
        mean_loss: loss_sum / data.len() as f64,
    })
}

/// `(classes, dim)` of a softmax state, checking it holds exactly `bias: [K]` and
/// `weight: [K, D]`.
fn layout(state: &ModelState) -> Result<(usize, usize)> {
    let bias = state.require(BIAS)?;
    let weight = state.require(WEIGHT)?;
    let &[classes] = bias.shape.as_slice() else {
        return Err(ModelError::ShapeMismatch {
            name: BIAS.into(),
            expected: vec![weight.shape.first().copied().unwrap_or(0)],
            found: bias.shape.clone(),
        });
    };
    let dim = match weight.shape.as_slice() {
        &[k, d] if k == classes => d,
        _ => {
            return Err(ModelError::ShapeMismatch {
                name: WEIGHT.into(),
                expected: vec![classes, weight.shape.last().copied().unwrap_or(0)],
                found: weight.shape.clone(),
            });
        }
    };
    if state.tensors.len() != 2 {
        return Err(ModelError::TensorCount {
            expected: 2,
            found: state.tensors.len(),
        });
    }
    // Lengths are an invariant of ModelState::new, but the fields are public.
    if bias.data.len() != classes || weight.data.len() != classes * dim {
        return Err(ModelError::DataLength {
            name: WEIGHT.into(),
            shape: weight.shape.clone(),
            expected: classes * dim,
            actual: weight.data.len(),
        });
    }
    Ok((classes, dim))
}

fn check_data(data: &Dataset, classes: usize, dim: usize) -> Result<()> {
    if data.dim != dim || data.classes != classes {
        return Err(ModelError::DataMismatch(format!(
            "data has dim {} and {} classes, the model dim {dim} and {classes} classes",
            data.dim, data.classes
        )));
    }
    data.validate()
        .map_err(|e| ModelError::DataMismatch(e.to_string()))
}

/// `logits = W x + b`, one contiguous dot product per class.
#[inline]
fn compute_logits(weight: &[f32], bias: &[f32], x: &[f32], logits: &mut [f32]) {
    for ((logit, row), &b) in logits
        .iter_mut()
        .zip(weight.chunks_exact(x.len().max(1)))
        .zip(bias)
    {
        *logit = b + row.iter().zip(x).map(|(w, v)| w * v).sum::<f32>();
    }
}

/// `(max, log Σ exp(logits))`, the maximum subtracted first so large logits cannot overflow.
#[inline]
fn log_sum_exp(logits: &[f32]) -> (f32, f64) {
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - top) as f64).exp()).sum();
    (top, top as f64 + sum.ln())
}

/// First index holding `top` (the maximum), so ties go to the lowest class.
#[inline]
fn argmax(logits: &[f32], top: f32) -> usize {
    logits.iter().position(|&l| l == top).unwrap_or(0)
}

/// Adds `Σ_{i ∈ batch} ∇ −log softmax(W x_i + b)[y_i]` to `grad_w`, `grad_b` and returns the
/// summed loss. `∂/∂z_k = p_k − [k = y]`, so row `k` of the weight gradient gains
/// `(p_k − [k = y]) · x`. `logits` is scratch space of length `classes`.
fn accumulate_gradient(
    weight: &[f32],
    bias: &[f32],
    data: &Dataset,
    batch: &[usize],
    logits: &mut [f32],
    grad_w: &mut [f32],
    grad_b: &mut [f32],
) -> f64 {
    let dim = data.dim;
    let mut loss = 0.0f64;
    for &i in batch {
        let x = data.row(i);
        let label = data.labels[i] as usize;
        compute_logits(weight, bias, x, logits);
        let (_, log_sum) = log_sum_exp(logits);
        loss += log_sum - logits[label] as f64;
        for (k, (&z, gb)) in logits.iter().zip(grad_b.iter_mut()).enumerate() {
            let p = (z as f64 - log_sum).exp();
            let g = (p - if k == label { 1.0 } else { 0.0 }) as f32;
            *gb += g;
            let row = &mut grad_w[k * dim..(k + 1) * dim];
            for (gw, &v) in row.iter_mut().zip(x) {
                *gw += g * v;
            }
        }
    }
    loss
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{digits, split};

    /// 6 samples, 4 features, 3 classes, with features of both signs.
    fn tiny() -> Dataset {
        let features = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
        Dataset::new(features, vec![0, 1, 2, 1, 0, 2], 4, 3).unwrap()
    }

    fn nonzero_state(dim: usize, classes: usize) -> ModelState {
        let mut s = init(dim, classes);
        for (j, t) in s.tensors.iter_mut().enumerate() {
            for (i, v) in t.data.iter_mut().enumerate() {
                *v = ((i * 5 + j * 3) % 7) as f32 / 7.0 - 0.4;
            }
        }
        s
    }

    fn mean_loss_at(weight: &[f32], bias: &[f32], data: &Dataset) -> f64 {
        let all: Vec<usize> = (0..data.len()).collect();
        let mut logits = vec![0.0; bias.len()];
        let mut gw = vec![0.0; weight.len()];
        let mut gb = vec![0.0; bias.len()];
        accumulate_gradient(weight, bias, data, &all, &mut logits, &mut gw, &mut gb)
            / data.len() as f64
    }

    #[test]
    fn gradient_matches_central_finite_differences() {
        let data = tiny();
        let s = nonzero_state(4, 3);
        let weight = s.get(WEIGHT).unwrap().data.clone();
        let bias = s.get(BIAS).unwrap().data.clone();
        let all: Vec<usize> = (0..data.len()).collect();
        let (mut gw, mut gb) = (vec![0.0; 12], vec![0.0; 3]);
        accumulate_gradient(&weight, &bias, &data, &all, &mut [0.0; 3], &mut gw, &mut gb);
        let n = data.len() as f32;
        // Central differences with h = 1e-2 have O(h²) ≈ 1e-4 truncation error; f32 logits add
        // ≈ 1e-7 / h = 1e-5. A tolerance of 1e-3 separates that from any real mistake.
        let h = 1e-2f32;
        for j in 0..weight.len() {
            let (mut plus, mut minus) = (weight.clone(), weight.clone());
            plus[j] += h;
            minus[j] -= h;
            let fd = (mean_loss_at(&plus, &bias, &data) - mean_loss_at(&minus, &bias, &data))
                / (2.0 * h as f64);
            assert!(
                (fd - (gw[j] / n) as f64).abs() < 1e-3,
                "weight {j}: {fd} vs {}",
                gw[j] / n
            );
        }
        for k in 0..bias.len() {
            let (mut plus, mut minus) = (bias.clone(), bias.clone());
            plus[k] += h;
            minus[k] -= h;
            let fd = (mean_loss_at(&weight, &plus, &data) - mean_loss_at(&weight, &minus, &data))
                / (2.0 * h as f64);
            assert!(
                (fd - (gb[k] / n) as f64).abs() < 1e-3,
                "bias {k}: {fd} vs {}",
                gb[k] / n
            );
        }
    }

    #[test]
    fn one_full_batch_step_without_momentum_is_plain_gradient_descent() {
        let data = tiny();
        let s = nonzero_state(4, 3);
        let cfg = SgdConfig {
            lr: 0.5,
            epochs: 1,
            batch_size: 6,
            momentum: 0.0,
            weight_decay: 0.0,
        };
        let report = train(&s, &data, &cfg, 0).unwrap();
        let weight = &s.get(WEIGHT).unwrap().data;
        let bias = &s.get(BIAS).unwrap().data;
        let all: Vec<usize> = (0..6).collect();
        let (mut gw, mut gb) = (vec![0.0; 12], vec![0.0; 3]);
        let loss =
            accumulate_gradient(weight, bias, &data, &all, &mut [0.0; 3], &mut gw, &mut gb) / 6.0;
        let trained = &report.state.get(WEIGHT).unwrap().data;
        for j in 0..12 {
            // The batch is a permutation of all samples, so only summation order differs.
            assert!((trained[j] - (weight[j] - 0.5 * gw[j] / 6.0)).abs() < 1e-6);
        }
        assert!((report.mean_loss - loss).abs() < 1e-6);
        assert_eq!(report.samples, 6);
    }

    #[test]
    fn zero_model_predicts_class_zero_with_loss_ln_classes() {
        let d = digits::load().unwrap();
        let eval = evaluate(&init(64, 10), &d).unwrap();
        // Uniform predictions: −log(1/10) for every sample.
        assert!(
            (eval.mean_loss - 10f64.ln()).abs() < 1e-9,
            "{}",
            eval.mean_loss
        );
        // All logits tie at 0, so arg-max picks class 0: accuracy is the share of zeros.
        let zeros = d.labels.iter().filter(|&&y| y == 0).count();
        assert_eq!(eval.accuracy, zeros as f64 / d.len() as f64);
    }

    #[test]
    fn centralised_digits_reach_ninety_percent_in_three_epochs() {
        let d = digits::load().unwrap();
        let (train_set, test_set) = split::train_test(&d, 0.25, 11).unwrap();
        let cfg = SgdConfig {
            epochs: 3,
            ..SgdConfig::default()
        };
        let report = train(&init(64, 10), &train_set, &cfg, 5).unwrap();
        let eval = evaluate(&report.state, &test_set).unwrap();
        eprintln!(
            "digits softmax: train loss {:.4}, test accuracy {:.4}, test loss {:.4}",
            report.mean_loss, eval.accuracy, eval.mean_loss
        );
        assert!(eval.accuracy > 0.9, "test accuracy {}", eval.accuracy);
        assert!(eval.mean_loss < 10f64.ln());
        assert_eq!(report.samples, train_set.len());
    }

    #[test]
    fn training_is_deterministic_given_seed() {
        let d = digits::load().unwrap();
        let cfg = SgdConfig::default();
        let a = train(&init(64, 10), &d, &cfg, 3).unwrap();
        let b = train(&init(64, 10), &d, &cfg, 3).unwrap();
        let c = train(&init(64, 10), &d, &cfg, 4).unwrap();
        assert_eq!(a.state.to_bytes(), b.state.to_bytes());
        assert_eq!(a.mean_loss.to_bits(), b.mean_loss.to_bits());
        assert_ne!(a.state.to_bytes(), c.state.to_bytes());
    }

    #[test]
    fn mismatches_and_bad_configs_are_errors() {
        let data = tiny();
        assert!(matches!(
            train(&init(5, 3), &data, &SgdConfig::default(), 0),
            Err(ModelError::DataMismatch(_))
        ));
        let mut wrong = init(4, 3);
        wrong.tensors[1].shape = vec![12];
        assert!(matches!(
            evaluate(&wrong, &data),
            Err(ModelError::ShapeMismatch { .. })
        ));
        let missing = ModelState::new(vec![NamedTensor::zeros(BIAS, vec![3])]).unwrap();
        assert_eq!(
            evaluate(&missing, &data),
            Err(ModelError::State(
                fedshard_actors::model::ModelError::Missing(WEIGHT.into())
            ))
        );
        for cfg in [
            SgdConfig {
                lr: 0.0,
                ..SgdConfig::default()
            },
            SgdConfig {
                epochs: 0,
                ..SgdConfig::default()
            },
            SgdConfig {
                batch_size: 0,
                ..SgdConfig::default()
            },
            SgdConfig {
                momentum: 1.0,
                ..SgdConfig::default()
            },
            SgdConfig {
                weight_decay: f64::NAN,
                ..SgdConfig::default()
            },
        ] {
            assert!(matches!(
                train(&init(4, 3), &data, &cfg, 0),
                Err(ModelError::InvalidConfig { .. })
            ));
        }
        let empty = data.subset(&[]).unwrap();
        assert!(train(&init(4, 3), &empty, &SgdConfig::default(), 0).is_err());
        assert!(evaluate(&init(4, 3), &empty).is_err());
    }

    #[test]
    fn divergence_is_reported_not_returned() {
        let mut data = tiny();
        for v in &mut data.features {
            *v *= 1e18;
        }
        let cfg = SgdConfig {
            lr: 1e18,
            epochs: 3,
            ..SgdConfig::default()
        };
        assert!(matches!(
            train(&init(4, 3), &data, &cfg, 0),
            Err(ModelError::NonFinite(_))
        ));
    }

    #[test]
    fn config_deserialises_with_defaults() {
        let cfg: SgdConfig = serde_json::from_str(r#"{"epochs": 3}"#).unwrap();
        assert_eq!(
            cfg,
            SgdConfig {
                epochs: 3,
                ..SgdConfig::default()
            }
        );
        assert!(serde_json::from_str::<SgdConfig>(r#"{"lr_typo": 1}"#).is_err());
    }
}
