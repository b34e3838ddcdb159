//! A `fedshard compare --out DIR` grid as `fedshard report --serve` shows it while the grid
//! runs: the runs its journal holds so far, in a table and as accuracy curves.

use super::figure::{Figure, Legend, Series, ValueAxis};
use super::html::escape;
use crate::compare_journal::{self, Finished};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// The tables a grid writes when it is done, one per kind of grid.
const FINAL_TABLES: [&str; 2] = ["table.md", "compressors.md"];

/// Whether `dir` is a grid's output folder (it has a journal) rather than a run folder.
pub fn is_grid(dir: &Path) -> bool {
    dir.join(compare_journal::FILE).is_file()
}

/// Whether the grid has written its table after its last run (a `--resume`d grid has an old
/// table until it is done again).
pub fn is_done(dir: &Path) -> bool {
    let modified = |name: &str| std::fs::metadata(dir.join(name)).and_then(|m| m.modified());
    let Ok(journal) = modified(compare_journal::FILE) else {
        return false;
    };
    FINAL_TABLES
        .iter()
        .any(|table| modified(table).is_ok_and(|t| t >= journal))
}

/// The grid's section of the page: a table of its finished runs and their accuracy curves.
pub fn section(dir: &Path) -> String {
    let mut out = format!("<h2>{}</h2>\n", escape(&format!("grid {}", dir.display())));
    let runs = match compare_journal::read_finished(dir) {
        Ok(runs) => runs,
        Err(e) => return out + &format!("<p>Waiting: {}</p>\n", escape(&format!("{e:#}"))),
    };
    let _ = writeln!(
        out,
        "<p>{} run{} finished{}.</p>",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        if is_done(dir) {
            "; the grid is done"
        } else {
            " so far"
        }
    );
    out.push_str("<table>\n<tr><th>run</th><th>final accuracy</th><th>error</th></tr>\n");
    for run in &runs {
        let accuracy = run.result["final_accuracy"]
            .as_f64()
            .map_or_else(|| "–".into(), |a| format!("{a:.4}"));
        let error = run.result["error"].as_str().unwrap_or("");
        let _ = writeln!(
            out,
            "<tr><td class=\"name\">{}</td><td class=\"n\">{accuracy}</td><td>{}</td></tr>",
            escape(&label(&run.result)),
            escape(error)
        );
    }
    out.push_str("</table>\n");
    if let Some(svg) = curves(dir, &runs) {
        let _ = writeln!(out, "<section class=\"grid\">\n{svg}\n</section>");
    }
    out
}

/// `unbiased · r=0.2 · seed 3`, `fedpm-klms D=4 · seed 1`: what the grid varied.
fn label(result: &Value) -> String {
    let text = |key: &str| result[key].as_str().map(String::from);
    let what = text("strategy")
        .or_else(|| {
            let compressor = text("compressor")?;
            Some(match result["d_target"].as_u64() {
                Some(d) => format!("{compressor} D={d}"),
                None => compressor,
            })
        })
        .unwrap_or_else(|| "run".into());
    let setup = text("setup").map_or_else(String::new, |s| format!(" · {s}"));
    let seed = result["seed"]
        .as_u64()
        .map_or_else(String::new, |s| format!(" · seed {s}"));
    format!("{what}{setup}{seed}")
}

/// One line per finished run, or `None` before the first.
fn curves(dir: &Path, runs: &[Finished]) -> Option<String> {
    let series: Vec<Series> = runs
        .iter()
        .filter(|r| !r.accuracy_per_round.is_empty())
        .map(|r| Series {
            label: label(&r.result),
            points: (1..)
                .zip(&r.accuracy_per_round)
                .map(|(k, &a)| (f64::from(k), a))
                .collect(),
        })
        .collect();
    if series.is_empty() {
        return None;
    }
    let figure = Figure {
        title: format!("Test accuracy per round, {}", dir.display()),
        step: "round",
        value_label: "accuracy".into(),
        value_axis: ValueAxis::Fixed(0.0, 1.0),
        legend: if series.len() <= 12 {
            Legend::LowerRight
        } else {
            Legend::None
        },
        series,
    };
    match figure.svg() {
        Ok(svg) => Some(svg),
        Err(e) => {
            tracing::warn!("report page: cannot draw {}: {e:#}", dir.display());
            None
        }
    }
}
