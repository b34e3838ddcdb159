//! Reading the numeric inputs of the research commands, with errors that name the file and what
//! was expected.

use anyhow::{Context, bail};
use std::path::Path;

/// Reads a JSON array of finite, non-negative numbers from `path`; `what` names it in errors.
pub fn read_vector(path: &Path, what: &str) -> anyhow::Result<Vec<f64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {what} file {}", path.display()))?;
    let values: Vec<f64> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON array of numbers for the {what}",
            path.display()
        )
    })?;
    if values.is_empty() {
        bail!(
            "{}: the {what} is empty; expected at least one number",
            path.display()
        );
    }
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite() || **v < 0.0)
    {
        bail!(
            "{}: {what} entry {i} is {v}; expected finite non-negative numbers",
            path.display()
        );
    }
    Ok(values)
}
