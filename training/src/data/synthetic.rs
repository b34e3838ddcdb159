//! Synthetic data with a known answer: the linear regression of the one-shot ridge federation
//! (FESC), where the optimal estimator is known in closed form and errors can be measured
//! exactly.

use rand_distr::{Distribution, Normal, StandardNormal};

use super::{DataError, DataStream, Result, data_stream};

/// `samples` draws of `x ~ N(0, I_dim)` and `y = xᵀθ + ε`, `ε ~ N(0, noise_std²)`.
///
/// Returns row-major features (`samples × dim`) and targets. Arithmetic is in `f64` and rounded
/// to `f32` at the end, so targets are consistent with θ to f32 precision. Errors if
/// `theta.len() != dim` or `noise_std` is negative or not finite.
pub fn linear_regression(
    samples: usize,
    dim: usize,
    theta: &[f64],
    noise_std: f64,
    seed: u64,
) -> Result<(Vec<f32>, Vec<f32>)> {
    if theta.len() != dim {
        return Err(DataError::InvalidParameter {
            name: "theta",
            value: format!("{} coefficients", theta.len()),
            expected: "one coefficient per feature (theta.len() == dim)",
        });
    }
    let noise = Normal::new(0.0, noise_std)
        .ok()
        .filter(|_| noise_std.is_finite() && noise_std >= 0.0)
        .ok_or_else(|| DataError::InvalidParameter {
            name: "noise_std",
            value: noise_std.to_string(),
            expected: "a finite standard deviation ≥ 0",
        })?;
    let mut rng = data_stream(seed, DataStream::Synthetic, 0);
    let mut features = Vec::with_capacity(samples * dim);
    let mut targets = Vec::with_capacity(samples);
    for _ in 0..samples {
        let mut y = 0.0;
        for &t in theta {
            let x: f64 = StandardNormal.sample(&mut rng);
            features.push(x as f32);
            y += x * t;
        }
        targets.push((y + noise.sample(&mut rng)) as f32);
    }
    Ok((features, targets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noiseless_targets_are_exactly_linear() {
        let theta = [1.0, -2.0, 0.5];
        let (x, y) = linear_regression(50, 3, &theta, 0.0, 4).unwrap();
        assert_eq!((x.len(), y.len()), (150, 50));
        for (row, &target) in x.chunks_exact(3).zip(&y) {
            let fit: f64 = row.iter().zip(&theta).map(|(&a, b)| a as f64 * b).sum();
            assert!((fit - target as f64).abs() < 1e-5, "{fit} vs {target}");
        }
    }

    #[test]
    fn features_are_standard_normal_and_noise_has_the_requested_scale() {
        let theta = [0.0, 0.0];
        let (x, y) = linear_regression(20_000, 2, &theta, 0.5, 1).unwrap();
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / x.len() as f64;
        // Standard errors at n = 40 000: 0.005 for the mean, 0.007 for the variance.
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.04, "variance {var}");
        let noise_var = y.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / y.len() as f64;
        assert!(
            (noise_var - 0.25).abs() < 0.015,
            "noise variance {noise_var}"
        );
    }

    #[test]
    fn deterministic_and_validated() {
        let theta = [0.3; 4];
        assert_eq!(
            linear_regression(10, 4, &theta, 0.1, 8).unwrap(),
            linear_regression(10, 4, &theta, 0.1, 8).unwrap()
        );
        assert!(linear_regression(10, 3, &theta, 0.1, 8).is_err());
        assert!(linear_regression(10, 4, &theta, -1.0, 8).is_err());
        assert!(linear_regression(10, 4, &theta, f64::NAN, 8).is_err());
        assert!(linear_regression(10, 4, &theta, f64::INFINITY, 8).is_err());
    }
}
