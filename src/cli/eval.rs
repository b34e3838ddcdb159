//! `fedshard eval RUN_DIR`: the test accuracy and loss of a finished run's final model, and of
//! its spectral truncations (`--keep-top 0.2,1`: every sharded layer cut to its `⌈rN⌉` largest
//! singular terms).
//!
//! The truncation is the Top-n diagnostic of the sharding paper §3.1 seen from the server: a Top-n client
//! trains only the leading terms, yet the test evaluates the whole layer. If the truncated model
//! scores far above the whole one, the terms nobody trained are what holds the model back.

use crate::config::Config;
use crate::federation;
use anyhow::{Context, ensure};
use clap::Args;
use fedshard_actors::run_folder::MODEL_FILE;
use fedshard_protocol::model::ModelState;
use fedshard_strategies::spectrum::kept_terms;
use fedshard_strategies::svd::{factorize, recompose_subset};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// A run folder of `fedshard run` (its `config.toml` and final `model.bin`).
    pub run: PathBuf,
    /// Comma-separated keep ratios r in (0, 1]: also evaluate the model with every sharded layer
    /// cut to its ⌈rN⌉ largest singular terms (r = 1 is the SVD's round trip).
    #[arg(long, value_name = "LIST")]
    pub keep_top: Option<String>,
    /// Print the rows as JSON `{"rows": [{keep_top, accuracy, loss}, …]}`.
    #[arg(long)]
    pub json: bool,
}

/// One evaluated model: the whole one (`keep_top: None`) or a truncation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Row {
    pub keep_top: Option<f64>,
    pub accuracy: f64,
    pub loss: f64,
}

/// Evaluates the run's model, then each truncation, on the config's test set.
pub fn eval(args: &EvalArgs) -> anyhow::Result<Vec<Row>> {
    let ratios: Vec<f64> = match &args.keep_top {
        Some(list) => crate::compare::parse_list(list).context("--keep-top")?,
        None => Vec::new(),
    };
    if let Some(bad) = ratios.iter().find(|r| !(**r > 0.0 && **r <= 1.0)) {
        anyhow::bail!("--keep-top: expected keep ratios in (0, 1], found {bad}");
    }
    let (config, model) = load_run(&args.run)?;
    let layers = config.model.resolved_sharded_layers();
    ensure!(
        ratios.is_empty() || !layers.is_empty(),
        "--keep-top: the run's `model.sharded_layers` is empty, so there is no layer to truncate"
    );
    let evaluator = federation::evaluator(&config)?;
    let mut rows = Vec::with_capacity(1 + ratios.len());
    let whole = evaluator.evaluate(&model)?;
    rows.push(Row {
        keep_top: None,
        accuracy: whole.accuracy,
        loss: whole.loss,
    });
    for ratio in ratios {
        let truncated = truncate(&model, &layers, ratio)?;
        let e = evaluator.evaluate(&truncated)?;
        rows.push(Row {
            keep_top: Some(ratio),
            accuracy: e.accuracy,
            loss: e.loss,
        });
    }
    Ok(rows)
}

/// The config and final model of a run folder, with errors that name the file: a missing,
/// damaged or non-finite `model.bin` is refused, never evaluated into a NaN.
pub(crate) fn load_run(dir: &Path) -> anyhow::Result<(Config, ModelState)> {
    let config = super::run::saved_config(dir)?;
    let model_path = dir.join(MODEL_FILE);
    let model = ModelState::read_file(&model_path).map_err(|e| {
        if e.is_not_found() {
            anyhow::anyhow!("{e} (a run writes it after its last round)")
        } else {
            e.into()
        }
    })?;
    Ok((config, model))
}

/// `model` with each of `layers` replaced by the sum of its `⌈rN⌉` largest singular terms
/// (computed in f64).
pub fn truncate(model: &ModelState, layers: &[String], ratio: f64) -> anyhow::Result<ModelState> {
    let mut model = model.clone();
    for name in layers {
        let tensor = model
            .get_mut(name)
            .with_context(|| format!("sharded layer `{name}` is not in the model"))?;
        let (rows, cols) = tensor.matrix_shape();
        let weights: Vec<f64> = tensor.data.iter().map(|&w| f64::from(w)).collect();
        let factors = factorize(&weights, rows, cols).with_context(|| format!("layer `{name}`"))?;
        let kept = kept_terms(factors.terms(), ratio).with_context(|| format!("layer `{name}`"))?;
        let indices: Vec<usize> = (0..kept).collect();
        let top = recompose_subset(&factors, &indices, &vec![1.0; kept]);
        tensor.data = top.iter().map(|&w| w as f32).collect();
    }
    Ok(model)
}

/// The rows as a markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from("| model | test accuracy % | test loss |\n|---|---:|---:|\n");
    for row in rows {
        let label = row.keep_top.map_or_else(
            || "whole".to_string(),
            |r| format!("top {r} of each sharded layer"),
        );
        out.push_str(&format!(
            "| {label} | {:.2} | {:.4} |\n",
            100.0 * row.accuracy,
            row.loss
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedshard_protocol::model::NamedTensor;

    /// W = [[0, 3], [1, 0]] has singular values 3 and 1: its top half is [[0, 3], [0, 0]], its
    /// top whole is W; a layer that is not sharded is left alone, one that is missing is named.
    #[test]
    fn truncation_keeps_the_largest_singular_terms_of_sharded_layers_only() {
        let model = ModelState::new(vec![
            NamedTensor::new("w", vec![2, 2], vec![0.0, 3.0, 1.0, 0.0]).unwrap(),
            NamedTensor::new("b", vec![2], vec![5.0, 6.0]).unwrap(),
        ])
        .unwrap();
        let layers = ["w".to_string()];
        let half = truncate(&model, &layers, 0.5).unwrap();
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(close(&half.get("w").unwrap().data, &[0.0, 3.0, 0.0, 0.0]));
        assert_eq!(half.get("b"), model.get("b"));
        let whole = truncate(&model, &layers, 1.0).unwrap();
        assert!(close(&whole.get("w").unwrap().data, &[0.0, 3.0, 1.0, 0.0]));
        let err = truncate(&model, &["fc9.weight".to_string()], 0.5).unwrap_err();
        assert!(err.to_string().contains("fc9.weight"), "{err}");
    }
}
