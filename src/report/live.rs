//! The live pages: a run's at its metrics address (`fedshard run`, `fedshard serve`, drawn from
//! the records the exporter has seen) and `fedshard report --serve`'s (drawn from run folders
//! as they are written). Both show the same figures as the files a finished run leaves, drawn
//! again as rounds arrive; the page refreshes itself (see [`html::live_document`]).

use super::html::{self, escape};
use super::rounds::{RoundPoint, Run, RunLabels, label_runs};
use super::{figures, grid};
use fedshard_actors::live::{LivePage, LiveView, RunState};
use fedshard_actors::run_folder::SUMMARY_FILE;
use fedshard_cluster::metrics::{ClusterMetrics, NodeStatus};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// The page of one run at its metrics address.
pub struct RunPage {
    name: String,
    /// What the config says, in the report's words.
    summary: String,
    total: u64,
    /// `round`, or `version` in async mode.
    step: &'static str,
    /// The step the run starts from (a resumed run's history), for the time left.
    resumed_at: u64,
    /// `fedshard serve`'s transport: the page adds the client nodes.
    cluster: Option<ClusterMetrics>,
}

impl RunPage {
    /// The page of a run called `name`, of `total` steps, resumed after `resumed_at`.
    pub fn new(
        name: &str,
        labels: &RunLabels,
        total: u64,
        step: &'static str,
        resumed_at: u64,
    ) -> Self {
        Self {
            name: name.to_string(),
            summary: html::describe(labels),
            total,
            step,
            resumed_at,
            cluster: None,
        }
    }

    /// Adds the client nodes of `fedshard serve` (and its transport's refusals) to the page.
    pub fn with_nodes(mut self, cluster: ClusterMetrics) -> Self {
        self.cluster = Some(cluster);
        self
    }

    fn status(&self, rounds: &[RoundPoint], state: &RunState, elapsed: Duration) -> String {
        let done = rounds.last().map_or(0, |r| r.round);
        let simulated = rounds
            .last()
            .and_then(|r| r.time.as_ref())
            .map_or_else(String::new, |t| format!(" · {:.1} simulated s", t.end));
        let (class, text) = match state {
            RunState::Running => {
                let ran = done.saturating_sub(self.resumed_at);
                let left = if ran > 0 && done < self.total {
                    let per = elapsed.as_secs_f64() / ran as f64;
                    format!(
                        " · about {} left",
                        clock(Duration::from_secs_f64(per * (self.total - done) as f64))
                    )
                } else {
                    String::new()
                };
                (
                    "running",
                    format!(
                        "Running: {} {done} of {} · {} elapsed{left}{simulated}",
                        self.step,
                        self.total,
                        clock(elapsed)
                    ),
                )
            }
            RunState::Finished => (
                "finished",
                format!(
                    "Finished: {done} {}s of {} · {}{simulated}",
                    self.step,
                    self.total,
                    clock(elapsed)
                ),
            ),
            RunState::Failed(error) => (
                "failed",
                format!("Failed after {} {done}: {error}", self.step),
            ),
        };
        let last = rounds.last().map_or_else(String::new, |r| {
            format!(
                " <span class=\"last\">accuracy {} · loss {}</span>",
                html::number(Some(r.accuracy)),
                html::number(Some(r.loss))
            )
        });
        format!(
            "<div data-state=\"{class}\" data-round=\"{done}\" data-total=\"{}\">\n\
             <p class=\"status\"><strong class=\"{class}\">{}</strong>{last}</p>\n</div>\n",
            self.total,
            escape(&text)
        )
    }

    /// The nodes table and the refusals, or nothing when this is not a server node.
    fn nodes(&self) -> String {
        let Some(cluster) = &self.cluster else {
            return String::new();
        };
        let nodes = cluster.nodes();
        let mut out = String::from("<section id=\"nodes\" aria-label=\"Client nodes\">\n");
        if nodes.is_empty() {
            out.push_str("<p>No client node has registered yet.</p>\n");
        } else {
            out.push_str(&nodes_table(&nodes, self.step));
        }
        let refusals = cluster.refusals();
        if refusals.is_empty() {
            out.push_str("<p class=\"refusals\">Refused: none.</p>\n");
        } else {
            let list: Vec<String> = refusals
                .iter()
                .map(|(what, why, n)| format!("{n} {what} ({why})"))
                .collect();
            let _ = writeln!(
                out,
                "<p class=\"refusals\">Refused: {}.</p>",
                escape(&list.join(", "))
            );
        }
        out.push_str("</section>\n");
        out
    }
}

impl LivePage for RunPage {
    fn live(&self, view: &LiveView<'_>) -> String {
        let rounds: Vec<RoundPoint> = view
            .records
            .iter()
            .map(|r| RoundPoint::from(r.as_ref()))
            .collect();
        let mut out = self.status(&rounds, view.state, view.elapsed);
        out.push_str(&self.nodes());
        if rounds.is_empty() {
            let _ = writeln!(
                out,
                "<p>The figures appear after the first {}.</p>",
                self.step
            );
        } else {
            out.push_str(&html::figure_sections(&drawn(figures::run_figures(
                &rounds,
            ))));
        }
        out
    }

    fn document(&self, live: &str, state: &RunState) -> String {
        let heading = format!(
            "<h1>{}</h1>\n<p class=\"config\">{}</p>\n",
            escape(&self.name),
            escape(&self.summary)
        );
        html::live_document(
            &format!("fedshard: {}", self.name),
            &heading,
            live,
            *state == RunState::Running,
        )
    }
}

/// `fedshard report --serve`'s page: the report of run folders and `compare --out` grids, read
/// again as they grow.
pub struct ReportPage {
    dirs: Vec<PathBuf>,
}

impl ReportPage {
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        Self { dirs }
    }

    /// Whether every run has written its summary and every grid its table (each writes it
    /// last).
    pub fn finished(&self) -> bool {
        self.dirs.iter().all(|d| done(d))
    }
}

fn done(dir: &std::path::Path) -> bool {
    if grid::is_grid(dir) {
        grid::is_done(dir)
    } else {
        dir.join(SUMMARY_FILE).is_file()
    }
}

impl LivePage for ReportPage {
    fn live(&self, view: &LiveView<'_>) -> String {
        let class = match view.state {
            RunState::Running => "running",
            RunState::Finished => "finished",
            RunState::Failed(_) => "failed",
        };
        let written = self.dirs.iter().filter(|d| done(d)).count();
        let mut out = format!(
            "<div data-state=\"{class}\" data-round=\"{written}\" data-total=\"{}\">\n\
             <p class=\"status\"><strong class=\"{class}\">{written} of {} finished</strong>\
             </p>\n</div>\n",
            self.dirs.len(),
            self.dirs.len()
        );
        let (grids, runs): (Vec<PathBuf>, Vec<PathBuf>) =
            self.dirs.iter().cloned().partition(|d| grid::is_grid(d));
        // A folder not yet written (a run not started, a grid before its first run) is said
        // to be waited for, and read again at the next refresh.
        let mut loaded = Vec::new();
        for dir in &runs {
            match Run::load(dir) {
                Ok(run) => loaded.push(run),
                Err(e) => {
                    let _ = writeln!(out, "<p>Waiting: {}</p>", escape(&format!("{e:#}")));
                }
            }
        }
        if !loaded.is_empty() {
            label_runs(&mut loaded);
            out.push_str(&html::report_body(
                &loaded,
                &drawn(figures::overlay(&loaded)),
            ));
        }
        for dir in &grids {
            out.push_str(&grid::section(dir));
        }
        out
    }

    fn document(&self, live: &str, state: &RunState) -> String {
        html::live_document(
            "fedshard report",
            "<h1>fedshard report</h1>\n",
            live,
            *state == RunState::Running,
        )
    }
}

/// Each figure as `(anchor, title, svg)`; a figure that cannot be drawn is left out (and
/// logged) rather than failing the page.
fn drawn(
    figures: Vec<(&'static str, super::figure::Figure)>,
) -> Vec<(&'static str, String, String)> {
    figures
        .into_iter()
        .filter_map(|(stem, figure)| match figure.svg() {
            Ok(svg) => Some((stem, figure.title.clone(), svg)),
            Err(e) => {
                tracing::warn!("live page: cannot draw {stem}: {e:#}");
                None
            }
        })
        .collect()
}

fn nodes_table(nodes: &[NodeStatus], step: &str) -> String {
    let mut out = format!(
        "<table>\n<tr><th>node</th><th>address</th><th>connected</th><th>clients</th>\
         <th>last {step} answered</th></tr>\n"
    );
    for node in nodes {
        let _ = writeln!(
            out,
            "<tr data-node=\"{}\" data-connected=\"{}\"><td class=\"name\">{}</td><td>{}</td>\
             <td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&node.name),
            node.connected,
            escape(&node.name),
            escape(&node.peer),
            if node.connected { "yes" } else { "no" },
            node.clients,
            node.last_round
                .map_or_else(|| "–".into(), |r| r.to_string()),
        );
    }
    out.push_str("</table>\n");
    out
}

/// `h:mm:ss`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}
