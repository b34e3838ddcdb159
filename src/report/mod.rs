//! Reports of finished runs: the figures of a run folder (`plots/`, SVG and PNG, written at the
//! end of `fedshard run`), the one-page HTML report of `fedshard report` that overlays several
//! runs, and the tables and figures of `fedshard compare --out`.
//!
//! Everything here works from what a run leaves on disk (`metrics.jsonl`, `summary.json`,
//! `config.toml`) or from the runtime's round records, never from a live federation, so a report
//! can be made again, later and elsewhere, from a copied folder.

pub mod compare;
pub mod figure;
pub mod figures;
pub mod grid;
pub mod html;
pub mod live;
mod raster;
pub mod rounds;

use anyhow::Context;
use fedshard_actors::record::RoundRecord;
use rounds::RoundPoint;
use std::path::{Path, PathBuf};

/// The folder of a run's figures, inside the run folder.
pub const PLOTS_DIR: &str = "plots";
/// The file `fedshard report` writes into its output folder.
pub const REPORT_FILE: &str = "report.html";

/// Writes every figure of [`figures::run_figures`] as `RUN_DIR/plots/STEM.svg` and `.png`;
/// returns the plots folder.
pub fn write_run_plots(run_dir: &Path, history: &[RoundRecord]) -> anyhow::Result<PathBuf> {
    let dir = run_dir.join(PLOTS_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let rounds: Vec<RoundPoint> = history.iter().map(RoundPoint::from).collect();
    for (stem, figure) in figures::run_figures(&rounds) {
        figure.write(&dir, stem)?;
    }
    Ok(dir)
}

/// Loads every run folder, overlays them in one figure per metric and writes the HTML page as
/// `out_dir/report.html` (creating `out_dir`); returns the page's path. A folder that is not a
/// run folder is an error naming it, before anything is written.
pub fn write_report(run_dirs: &[PathBuf], out_dir: &Path) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(!run_dirs.is_empty(), "no run folder to report on");
    let runs = rounds::load_runs(run_dirs)?;
    let mut sections = Vec::new();
    for (stem, figure) in figures::overlay(&runs) {
        sections.push((stem, figure.title.clone(), figure.svg()?));
    }
    let page = html::page(&runs, &sections);
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let path = out_dir.join(REPORT_FILE);
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
