//! The accountant against Google's dp-accounting 0.6.0. Every reference was printed by
//! `scripts/dp_reference.py` (the line quoted next to it is the exact call); the tolerance is
//! relative 1e-9, floating-point rounding of the same formulas on the same order grid.

use super::*;
use crate::rng::{Purpose, stream};

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1e-12),
        "{what}: {got} vs dp-accounting's {want}"
    );
}

/// Per-order RDP, integer and fractional orders, of the Poisson-subsampled Gaussian
/// (`_compute_rdp_poisson_subsampled_gaussian(q, noise_multiplier, orders=[α])`) and of
/// sampling without replacement under the replace-one relation
/// (`_compute_rdp_sample_wor_gaussian(q, noise_multiplier, orders=[α])`; α = 300 is above the
/// forward-difference cut-off, α = 3.5 interpolated).
#[test]
fn per_order_rdp_matches_dp_accounting() {
    type Rdp = fn(f64, f64, f64) -> f64;
    let poisson: (Rdp, &[(f64, f64, f64, f64)]) = (
        rdp::poisson_subsampled_gaussian,
        &[
            (0.01, 1.1, 2.0, 0.00012851008160516542),
            (0.01, 1.1, 2.5, 0.00016215219755506363),
            (0.01, 1.1, 8.0, 0.0005840703355202598),
            (0.01, 1.1, 12.0, 0.04138551937921605),
            (0.01, 1.1, 32.0, 8.469416433675926),
            (0.1, 1.0, 2.0, 0.017036863236176605),
            (0.1, 1.0, 2.5, 0.02385328594777003),
            (0.1, 1.0, 8.0, 1.3783614113481268),
            (0.1, 1.0, 12.0, 3.4882531913005788),
            (0.1, 1.0, 32.0, 13.623137968522595),
        ],
    );
    let without_replacement: (Rdp, &[(f64, f64, f64, f64)]) = (
        rdp::without_replacement_gaussian,
        &[
            (0.05, 0.7, 2.0, 0.03776238978941676),
            (0.05, 0.7, 3.5, 0.3323773084812439),
            (0.05, 0.7, 16.0, 13.177292665825721),
            (0.05, 0.7, 300.0, 303.1190157525496),
            (0.2, 2.0, 2.0, 0.04444173933542095),
            (0.2, 2.0, 3.5, 0.08588276950534705),
            (0.2, 2.0, 16.0, 0.4933263076599701),
            (0.2, 2.0, 300.0, 35.88749757006799),
        ],
    );
    for (rdp, cases) in [poisson, without_replacement] {
        for &(q, sigma, alpha, want) in cases {
            close(
                rdp(q, sigma, alpha),
                want,
                &format!("q={q} σ={sigma} α={alpha}"),
            );
        }
    }
}

/// ε after composition: `RdpAccountant().compose(PoissonSampledDpEvent(q,
/// GaussianDpEvent(σ)), steps).get_epsilon(δ)`, and the tighter PLD accountant's
/// `PLDAccountant().compose(…).get_epsilon(δ)`, which ours must never undercut. The third case
/// is DP-SGD on MNIST (batch 256 of 60 000, σ = 1.1, 60 epochs).
#[test]
fn poisson_epsilon_matches_dp_accounting_and_stays_above_its_pld_bound() {
    let cases = [
        (
            0.01,
            1.1,
            1000,
            1e-5,
            1.7117701662429012,
            1.5153702481094293,
        ),
        (0.1, 1.0, 30, 1e-5, 4.848039837634081, 4.178223609042274),
        (0.5, 1.5, 40, 1e-4, 12.08276321109529, 10.860091465320895),
        (
            256.0 / 60000.0,
            1.1,
            14062,
            1e-5,
            2.5965558697943036,
            2.381686002234784,
        ),
    ];
    for (rate, sigma, steps, delta, rdp_eps, pld_eps) in cases {
        let accountant = Accountant::new(Sampling::Poisson { rate }, sigma).unwrap();
        let got = accountant.epsilon(steps, delta).epsilon;
        close(got, rdp_eps, &format!("q={rate} σ={sigma} T={steps}"));
        assert!(got > pld_eps, "{got} undercuts the PLD bound {pld_eps}");
    }
}

/// `RdpAccountant(neighboring_relation=REPLACE_ONE).compose(SampledWithoutReplacementDpEvent(n,
/// m, GaussianDpEvent(σ)), steps).get_epsilon(δ)`, where σ is the noise over the substitution
/// sensitivity: ours is told the multiplier over the clip norm, 2σ.
#[test]
fn without_replacement_epsilon_matches_dp_accounting() {
    let cases = [
        (1000, 100, 1.0, 30, 1e-5, 7.574018107320061),
        (1000, 200, 0.5, 40, 1e-4, 75.04115917059231),
        (60000, 256, 0.55, 10000, 1e-5, 20.05038884512992),
    ];
    for (population, sample_size, sigma, steps, delta, want) in cases {
        let sampling = Sampling::WithoutReplacement {
            population,
            sample_size,
        };
        let accountant = Accountant::new(sampling, 2.0 * sigma).unwrap();
        let got = accountant.epsilon(steps, delta).epsilon;
        close(
            got,
            want,
            &format!("{sample_size}/{population} σ={sigma} T={steps}"),
        );
    }
}

/// `RdpAccountant().compose(GaussianDpEvent(5.0), 20).get_epsilon(1e-5)` for the unamplified
/// accounting of async buffers (substitution: multiplier 10 over the clip norm).
#[test]
fn unsampled_epsilon_is_the_gaussian_mechanisms() {
    let accountant = Accountant::new(Sampling::None, 10.0).unwrap();
    close(
        accountant.epsilon(20, 1e-5).epsilon,
        4.161624306053592,
        "Gaussian σ=5, 20 releases",
    );
}

/// ε grows with the rounds, falls with the noise and with the sampling rate; no release costs
/// nothing.
#[test]
fn epsilon_is_monotone_in_rounds_noise_and_rate() {
    let eps = |rate: f64, z: f64, t: u64| {
        Accountant::new(Sampling::Poisson { rate }, z)
            .unwrap()
            .epsilon(t, 1e-5)
            .epsilon
    };
    assert_eq!(eps(0.1, 1.0, 0), 0.0);
    assert!(eps(0.1, 1.0, 10) < eps(0.1, 1.0, 20));
    assert!(eps(0.1, 2.0, 20) < eps(0.1, 1.0, 20));
    assert!(eps(0.05, 1.0, 20) < eps(0.1, 1.0, 20));
    assert!(Accountant::new(Sampling::Poisson { rate: 0.0 }, 1.0).is_err());
    assert!(Accountant::new(Sampling::Poisson { rate: 0.1 }, 0.0).is_err());
    let too_many = Sampling::WithoutReplacement {
        population: 10,
        sample_size: 11,
    };
    assert!(Accountant::new(too_many, 1.0).is_err());
}

/// Adaptive clipping (Andrew et al. 2021) on a synthetic population whose update norms are
/// lognormal(0, 1): the median is 1 and the 0.8-quantile e^{0.8416} = 2.320. Starting from
/// C = 0.1, 100 clients per round, η = 0.2, σ_b = 100/20, the clip norm ends within 10% of the
/// target quantile after 300 rounds (the noised count's error is σ_b/m = 0.05 per round).
#[test]
fn adaptive_clip_converges_to_the_target_quantile() {
    use rand_distr::{Distribution, LogNormal};
    for (quantile, want) in [(0.5, 1.0), (0.8, 0.8416f64.exp())] {
        let adaptive = AdaptiveClip {
            quantile,
            learning_rate: 0.2,
            count_stddev: 5.0,
        };
        let norms = LogNormal::new(0.0, 1.0).unwrap();
        let mut clip = 0.1;
        let mut tail = Vec::new();
        for round in 0..300u64 {
            let mut rng = stream(7, round, 0, Purpose::Experiment);
            let below = (0..100).filter(|_| norms.sample(&mut rng) <= clip).count();
            let mut noise = stream(7, round, 1, Purpose::PrivacyNoise);
            clip = adaptive.next(clip, below, 100.0, &mut noise).0;
            if round >= 250 {
                tail.push(clip);
            }
        }
        let mean = tail.iter().sum::<f64>() / tail.len() as f64;
        assert!(
            (mean / want - 1.0).abs() < 0.1,
            "quantile {quantile}: C = {mean}, want {want}"
        );
    }
}

/// `z_Δ = (z⁻² − (2σ_b)⁻²)^{−1/2}`: z = 1, σ_b = 5 gives (1 − 0.01)^{−1/2} = 1.00504; σ_b ≤ z/2
/// is refused.
#[test]
fn the_count_spends_part_of_the_noise() {
    let z = update_noise_multiplier(1.0, 5.0).unwrap();
    assert!((z - 0.99f64.powf(-0.5)).abs() < 1e-12);
    assert!(update_noise_multiplier(1.0, 0.5).is_err());
}

/// The noise has the right scale: 200 000 draws of std 0.3 have a sample std within 1% of 0.3
/// (its standard error is 0.3/√(2n) = 0.05%) and a mean within 5 standard errors of 0.
#[test]
fn noise_has_the_requested_standard_deviation() {
    let mut values = vec![0.0; 200_000];
    add_gaussian_noise(
        &mut values,
        0.3,
        &mut stream(3, 1, 0, Purpose::PrivacyNoise),
    );
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    assert!((std / 0.3 - 1.0).abs() < 0.01, "std {std}");
    assert!(mean.abs() < 5.0 * 0.3 / n.sqrt(), "mean {mean}");
}

#[test]
fn clip_factor_scales_into_the_ball() {
    assert_eq!(clip_factor(0.0, 1.0), 1.0);
    assert_eq!(clip_factor(0.5, 1.0), 1.0);
    assert_eq!(clip_factor(4.0, 1.0), 0.25);
}
