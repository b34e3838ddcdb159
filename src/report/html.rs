//! The page of `fedshard report`: one self-contained HTML file (styles and SVG figures inline, no
//! script, no link or image to fetch), so it can be mailed, archived or opened offline.

use super::rounds::{Run, RunLabels};
use std::fmt::Write as _;

/// The page for `runs`, with `figures` as `(anchor, title, svg)` in page order. Each figure
/// carries its title inside the SVG, so the sections have no heading of their own.
pub fn page(runs: &[Run], figures: &[(&str, String, String)]) -> String {
    let names: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
    let mut out = head(&format!("fedshard report: {}", names.join(", ")), "");
    out.push_str("<h1>fedshard report</h1>\n");
    out.push_str(&report_body(runs, figures));
    out.push_str("</body>\n</html>\n");
    out
}

/// The report's table and figures: the body of [`page`], and the part of `fedshard report
/// --serve`'s page that refreshes.
pub fn report_body(runs: &[Run], figures: &[(&str, String, String)]) -> String {
    table(runs) + &figure_sections(figures)
}

/// A line of links to the figures, then each figure (`(anchor, title, svg)`) in its section.
/// Each figure carries its title inside the SVG, so the sections have no heading of their own.
pub fn figure_sections(figures: &[(&str, String, String)]) -> String {
    let mut out = String::from("<nav>");
    for (anchor, title, _) in figures {
        let _ = write!(out, "<a href=\"#{anchor}\">{}</a> ", escape(title));
    }
    out.push_str("</nav>\n");
    for (anchor, title, svg) in figures {
        let _ = write!(
            out,
            "<section id=\"{anchor}\" aria-label=\"{}\">\n{svg}\n</section>\n",
            escape(title)
        );
    }
    out
}

/// The document's start up to `<body>`, with `extra` in the head.
fn head(title: &str, extra: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n{extra}</head>\n<body>\n",
        escape(title)
    )
}

/// How often a live page asks for its changing part.
pub const REFRESH_MS: u64 = 2000;

/// A live page: `heading` (HTML), then `live` in `<main id="live">`, which a few lines of
/// script replace every [`REFRESH_MS`] with what `GET live` answers while the part's
/// `data-state` says `running`. The script is inline and fetches only that address: the page
/// needs no library and no network beyond the server it came from. Without script the page
/// reloads itself instead, until the run is over.
pub fn live_document(title: &str, heading: &str, live: &str, running: bool) -> String {
    let reload = if running {
        format!(
            "<noscript><meta http-equiv=\"refresh\" content=\"{}\"></noscript>\n",
            REFRESH_MS / 1000
        )
    } else {
        String::new()
    };
    let mut out = head(title, &reload);
    out.push_str(heading);
    let _ = write!(
        out,
        "<p id=\"offline\" hidden>The server does not answer; the page shows what it last \
         sent.</p>\n<main id=\"live\">\n{live}</main>\n<script>{}</script>\n</body>\n</html>\n",
        script()
    );
    out
}

/// Counts its refreshes in `body[data-refreshes]` and the first round it showed in
/// `body[data-first-round]`, which tests read from the DOM.
fn script() -> String {
    format!(
        "(function(){{\
var live=document.getElementById('live'),body=document.body,n=0;\
function part(){{return live.querySelector('[data-state]');}}\
function running(){{var p=part();return !p||p.dataset.state==='running';}}\
body.dataset.refreshes='0';\
if(part())body.dataset.firstRound=part().dataset.round||'';\
function tick(){{fetch('live',{{cache:'no-store'}}).then(function(r){{\
if(!r.ok)throw new Error(r.status);return r.text();}}).then(function(t){{\
live.innerHTML=t;n+=1;body.dataset.refreshes=String(n);\
document.getElementById('offline').hidden=true;\
}}).catch(function(){{document.getElementById('offline').hidden=false;}})\
.then(function(){{if(running())setTimeout(tick,{REFRESH_MS});}});}}\
if(running())setTimeout(tick,{REFRESH_MS});\
}})();"
    )
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;padding:0 1em;max-width:64em;color:#222}\
table{border-collapse:collapse;margin-bottom:1.5em}\
th,td{border:1px solid #ccc;padding:.3em .6em}\
td.n,td.name{white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#f3f3f3}nav a{margin-right:1em}section svg{max-width:100%;height:auto}\
.status{font-size:1.15em}.running{color:#1a5fb4}.finished{color:#26a269}.failed{color:#c01c28}\
#offline{color:#c01c28}";

/// Final accuracy, loss, total uplink bits and rounds per run, with what its config says. The
/// folder is the run cell's tooltip: the label already is its name (or its path).
fn table(runs: &[Run]) -> String {
    let mut out = String::from(
        "<table>\n<tr><th>run</th><th>config</th><th>rounds</th><th>final accuracy</th>\
         <th>final loss</th><th>total uplink bits</th></tr>\n",
    );
    for run in runs {
        let last = run.last();
        let _ = writeln!(
            out,
            "<tr><td class=\"name\" title=\"{}\">{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&run.dir.display().to_string()),
            escape(&run.label),
            escape(&describe(&run.config)),
            last.map_or(0, |r| r.round),
            number(last.map(|r| r.accuracy)),
            number(last.map(|r| r.loss)),
            grouped(run.uplink_bits_total()),
        );
    }
    out.push_str("</table>\n");
    out
}

/// `digits-linear: digits, unbiased, seed 1` (and the compressor and `async` when set),
/// leaving out what the config does not say.
pub(crate) fn describe(config: &RunLabels) -> String {
    let details: Vec<String> = [
        config.dataset.clone(),
        config.strategy.clone(),
        config.compressor.clone(),
        config.mode.clone(),
        config.seed.map(|s| format!("seed {s}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    match (&config.name, details.is_empty()) {
        (Some(name), true) => name.clone(),
        (Some(name), false) => format!("{name}: {}", details.join(", ")),
        (None, true) => "–".into(),
        (None, false) => details.join(", "),
    }
}

/// Four decimals, or `–` for a value not measured (absent or NaN).
pub(crate) fn number(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.4}"),
        _ => "–".into(),
    }
}

/// `733687296` → `733 687 296`: bit totals run to nine digits and more.
pub(crate) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// Text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_text_are_rendered_safely() {
        assert_eq!(grouped(733_687_296), "733 687 296");
        assert_eq!(grouped(12), "12");
        assert_eq!(grouped(0), "0");
        assert_eq!(escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
        let mut labels = RunLabels {
            name: Some("digits-linear".into()),
            seed: Some(1),
            strategy: Some("unbiased".into()),
            dataset: Some("digits".into()),
            compressor: None,
            mode: None,
        };
        assert_eq!(describe(&labels), "digits-linear: digits, unbiased, seed 1");
        labels.compressor = Some("signsgd-klms".into());
        labels.mode = Some("async".into());
        assert_eq!(
            describe(&labels),
            "digits-linear: digits, unbiased, signsgd-klms, async, seed 1"
        );
        labels.compressor = None;
        labels.mode = None;
        labels.name = None;
        labels.strategy = None;
        assert_eq!(describe(&labels), "digits, seed 1");
        assert_eq!(describe(&RunLabels::default()), "–");
    }
}
