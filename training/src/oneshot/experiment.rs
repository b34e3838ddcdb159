//! The γ × runs grid of the FESC ridge experiment (docs/algorithms.md §3.3) and its summary table.

use super::OneshotError;
use super::data::{node_moments, sample_sizes, true_parameter};
use super::ridge::{RidgeForm, fit, fit_with_oracle};
use faer::{Col, Mat};
use fedshard_strategies::aggregation::{
    Contribution, FedAvg, Fesc, FescOracle, RoundOutcome, Weighting,
};
use fedshard_strategies::rng::{Purpose, stream};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// The parameters of the experiment; the defaults are the paper's (§3.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RidgeConfig {
    /// `m`, the number of nodes.
    pub nodes: usize,
    /// `d`, the dimension of `θ*`.
    pub dim: usize,
    /// The size exponents `γ` (mean node size `m^γ`).
    pub gammas: Vec<f64>,
    /// Independent runs per `γ`.
    pub runs: usize,
    /// Base seed of the streams `stream(seed, run, γ-index, Purpose::Experiment)`.
    pub seed: u64,
    /// Local loss form; the centralised fit uses the same form.
    pub form: RidgeForm,
}

impl Default for RidgeConfig {
    fn default() -> Self {
        Self {
            nodes: 500,
            dim: 50,
            gammas: (2..=12).map(|i| f64::from(i) / 10.0).collect(),
            runs: 50,
            seed: 0,
            form: RidgeForm::Mean,
        }
    }
}

/// Mean errors `‖θ̂ − θ*‖²` over the runs of one `γ`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RidgeRow {
    pub gamma: f64,
    /// Ridge on the pooled data, `λ = 1/√N`.
    pub mse_centralized: f64,
    /// Weights `n_i / N`.
    pub mse_fedavg: f64,
    /// FESC weights (§3.2).
    pub mse_fesc: f64,
    /// Oracle FESC weights from the true `a_i`, `b_i` (§3.2, §3.3 step 5).
    pub mse_oracle: f64,
    /// Mean `K/m` of FESC: the fraction of nodes with a positive weight.
    pub active_fraction: f64,
}

/// The result of [`run_ridge`], one row per `γ` in input order. Serialises as
/// `{"rows": [{"gamma", "mse_centralized", "mse_fedavg", "mse_fesc", "mse_oracle",
/// "active_fraction"}, …]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RidgeReport {
    pub rows: Vec<RidgeRow>,
}

impl RidgeReport {
    /// A plain-text table, one line per `γ`.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:>6} {:>12} {:>12} {:>12} {:>12} {:>7}\n",
            "gamma", "centralized", "fedavg", "fesc", "oracle", "active"
        );
        for r in &self.rows {
            out.push_str(&format!(
                "{:>6.2} {:>12.4e} {:>12.4e} {:>12.4e} {:>12.4e} {:>7.3}\n",
                r.gamma,
                r.mse_centralized,
                r.mse_fedavg,
                r.mse_fesc,
                r.mse_oracle,
                r.active_fraction
            ));
        }
        out
    }
}

/// The errors of one run at one `γ`.
#[derive(Debug, Clone, Copy)]
struct RunErrors {
    centralized: f64,
    fedavg: f64,
    fesc: f64,
    oracle: f64,
    active_fraction: f64,
}

fn validate(config: &RidgeConfig) -> Result<(), OneshotError> {
    for (option, value) in [
        ("--nodes", config.nodes),
        ("--dim", config.dim),
        ("--runs", config.runs),
    ] {
        if value < 1 {
            return Err(OneshotError::TooFew { option });
        }
    }
    if config.gammas.is_empty() {
        return Err(OneshotError::NoGammas);
    }
    if let Some(&g) = config
        .gammas
        .iter()
        .find(|g| !(g.is_finite() && (0.0..=3.0).contains(*g)))
    {
        return Err(OneshotError::GammaOutOfRange(g));
    }
    Ok(())
}

/// Runs the experiment of docs/algorithms.md §3.3: for every `γ` and run, draw `θ*`, node sizes and
/// node moments, fit the local ridges, and compare the centralised, FedAvg, FESC and oracle
/// estimators. The `γ × runs` tasks run in parallel on rayon's pool; each draws only from
/// `stream(seed, run, γ-index, Purpose::Experiment)` and the means are summed in run order, so
/// the report is bit-for-bit independent of scheduling and thread count. `on_task_done` is
/// called once per finished task (for a progress bar).
///
/// faer runs sequentially (it is built without its `rayon` feature): the matrices are `d × d`,
/// parallelism is across tasks.
pub fn run_ridge(
    config: &RidgeConfig,
    on_task_done: &(dyn Fn() + Sync),
) -> Result<RidgeReport, OneshotError> {
    validate(config)?;
    let tasks: Vec<(usize, usize)> = (0..config.gammas.len())
        .flat_map(|g| (0..config.runs).map(move |r| (g, r)))
        .collect();
    let errors = tasks
        .par_iter()
        .map(|&(g, r)| {
            let e = single_run(config, g, r).map_err(|source| OneshotError::Run {
                run: r,
                gamma: config.gammas[g],
                source: Box::new(source),
            });
            on_task_done();
            e
        })
        .collect::<Result<Vec<RunErrors>, OneshotError>>()?;
    let runs = config.runs as f64;
    let rows = config
        .gammas
        .iter()
        .zip(errors.chunks_exact(config.runs))
        .map(|(&gamma, e)| {
            let mean = |f: fn(&RunErrors) -> f64| e.iter().map(f).sum::<f64>() / runs;
            RidgeRow {
                gamma,
                mse_centralized: mean(|e| e.centralized),
                mse_fedavg: mean(|e| e.fedavg),
                mse_fesc: mean(|e| e.fesc),
                mse_oracle: mean(|e| e.oracle),
                active_fraction: mean(|e| e.active_fraction),
            }
        })
        .collect();
    Ok(RidgeReport { rows })
}

/// One run at one `γ` (§3.3 steps 1–6).
fn single_run(
    config: &RidgeConfig,
    gamma_index: usize,
    run: usize,
) -> Result<RunErrors, OneshotError> {
    let mut rng = stream(
        config.seed,
        run as u64,
        gamma_index as u64,
        Purpose::Experiment,
    );
    let d = config.dim;
    let theta_star = true_parameter(&mut rng, d);
    let sizes = sample_sizes(&mut rng, config.nodes, config.gammas[gamma_index])?;

    let mut pooled_gram = Mat::<f64>::zeros(d, d);
    let mut pooled_cross = Col::<f64>::zeros(d);
    let mut estimates = Vec::with_capacity(sizes.len());
    let mut variances = Vec::with_capacity(sizes.len());
    let mut biases = Vec::with_capacity(sizes.len());
    for &n in &sizes {
        let node = node_moments(&mut rng, n, &theta_star);
        let kappa = config.form.diagonal_load(n as f64);
        let local = fit_with_oracle(&node.gram, &node.cross, kappa, &theta_star)?;
        pooled_gram += &node.gram;
        pooled_cross += &node.cross;
        estimates.push(local.theta);
        variances.push(local.variance);
        biases.push(local.squared_bias);
    }
    let total: f64 = sizes.iter().map(|&n| n as f64).sum();
    let centralized = fit(
        &pooled_gram,
        &pooled_cross,
        config.form.diagonal_load(total),
    )?;

    let results: Vec<Contribution> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| Contribution {
            client: i as u64,
            samples: n as f64,
            inclusion_probability: 1.0,
        })
        .collect();
    let round = RoundOutcome {
        results: &results,
        failures: &[],
        population_samples: total,
    };
    let error_of = |weights: &[f64]| -> f64 {
        let mut combined = Col::<f64>::zeros(d);
        for (w, theta) in weights.iter().zip(&estimates) {
            if *w != 0.0 {
                combined += faer::Scale(*w) * theta;
            }
        }
        (&combined - &theta_star).squared_norm_l2()
    };
    let fesc = Fesc.weights(&round)?;
    let active = fesc.iter().filter(|&&w| w > 0.0).count();
    let oracle = FescOracle {
        a: variances,
        b: biases,
    };
    Ok(RunErrors {
        centralized: (&centralized - &theta_star).squared_norm_l2(),
        fedavg: error_of(&FedAvg.weights(&round)?),
        fesc: error_of(&fesc),
        oracle: error_of(&oracle.weights(&round)?),
        active_fraction: active as f64 / sizes.len() as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(runs: usize) -> RidgeConfig {
        RidgeConfig {
            nodes: 60,
            dim: 10,
            gammas: vec![0.5],
            runs,
            seed: 7,
            form: RidgeForm::Mean,
        }
    }

    /// §3.3's claim on a small fixed instance (m = 60, d = 10, γ = 0.5, 8 runs, seed 7): most
    /// nodes have fewer samples than dimensions, so FedAvg's error is dominated by their huge
    /// variance, which FESC discards; the oracle (true a, b) does at least as well as FESC's
    /// proxy, and the centralised fit beats every one-shot aggregate.
    #[test]
    fn fesc_beats_fedavg_on_a_small_instance() {
        let report = run_ridge(&small(8), &|| {}).unwrap();
        let r = &report.rows[0];
        assert!(r.mse_fesc < r.mse_fedavg, "{r:?}");
        assert!(r.mse_oracle < r.mse_fedavg, "{r:?}");
        assert!(r.mse_centralized < r.mse_fesc.min(r.mse_oracle), "{r:?}");
        assert!(r.active_fraction > 0.0 && r.active_fraction < 1.0, "{r:?}");
    }

    #[test]
    fn report_is_reproducible() {
        let a = run_ridge(&small(3), &|| {}).unwrap();
        let b = run_ridge(&small(3), &|| {}).unwrap();
        assert_eq!(a, b);
    }

    /// The JSON printed by `fedshard oneshot ridge --json`.
    #[test]
    fn json_has_one_row_object_per_gamma() {
        let mut config = small(2);
        config.gammas = vec![0.3, 0.6];
        config.form = RidgeForm::Sum;
        let report = run_ridge(&config, &|| {}).unwrap();
        let json = serde_json::to_value(&report).unwrap();
        let rows = json["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2);
        for (row, gamma) in rows.iter().zip([0.3, 0.6]) {
            let obj = row.as_object().unwrap();
            let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                [
                    "active_fraction",
                    "gamma",
                    "mse_centralized",
                    "mse_fedavg",
                    "mse_fesc",
                    "mse_oracle"
                ]
            );
            assert_eq!(obj["gamma"].as_f64(), Some(gamma));
            assert!(obj.values().all(|v| v.as_f64().is_some_and(f64::is_finite)));
        }
        assert_eq!(json.as_object().unwrap().len(), 1);
    }

    #[test]
    fn rejects_bad_configs() {
        let mut c = small(1);
        c.gammas.clear();
        assert!(run_ridge(&c, &|| {}).is_err());
        let mut c = small(1);
        c.nodes = 0;
        assert!(run_ridge(&c, &|| {}).is_err());
        let mut c = small(1);
        c.gammas = vec![f64::NAN];
        assert!(run_ridge(&c, &|| {}).is_err());
    }
}
