//! Every command the README and the docs show must still be a valid command: each `fedshard …`
//! line in a code block or an inline code span parses with the real command line, names
//! configs that exist and load, and each `cargo test`/`cargo bench` names a target that exists.
//!
//! Short commands are also run for real by `.ci/smoke` (the main job, the tour, the research
//! commands); the long reproduce commands (grids of hundreds of runs) are checked here in this
//! shortened form: the same command line, parsed and validated, not run to the end.

use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use fedshard::cli::first_run;
use fedshard::config::Config;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, docs/*.md and dashboards/README.md.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    docs.push(repo().join("README.md"));
    docs.push(repo().join("dashboards/README.md"));
    docs
}

/// The shell commands of a markdown text: each line of a code block (with `\` continuations
/// joined), and each inline code span outside code blocks (a span may wrap across lines).
fn shell_snippets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    let mut prose = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            prose.push('\n');
            continue;
        }
        if in_block {
            let line = line.trim();
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
            } else {
                pending.push_str(line);
                out.push(std::mem::take(&mut pending));
            }
        } else {
            prose.push_str(line);
            prose.push(' ');
        }
    }
    out.extend(prose.split('`').skip(1).step_by(2).map(str::to_string));
    out
}

/// The fedshard invocations of one snippet, as argument vectors starting with `fedshard`.
fn invocations(snippet: &str) -> Vec<Vec<String>> {
    let without_comment = match snippet.find(" #") {
        Some(i) => &snippet[..i],
        None => snippet,
    };
    without_comment
        .split("&&")
        .flat_map(|s| s.split(" & "))
        .filter_map(|part| {
            let part = part.trim().trim_end_matches('&').trim();
            let rest = [
                "fedshard ",
                "cargo run --release -- ",
                "target/release/fedshard ",
            ]
            .iter()
            .find_map(|prefix| part.strip_prefix(prefix))?;
            let mut argv = vec!["fedshard".to_string()];
            argv.extend(
                rest.split_whitespace()
                    .map(|w| w.trim_matches('\'').to_string()),
            );
            Some(argv)
        })
        .collect()
}

/// A synopsis rather than a command: `CONFIG`, `[--out DIR]`, `cpu|cuda`, `…`.
fn is_synopsis(argv: &[String]) -> bool {
    argv.iter().any(|w| {
        w.contains('…')
            || w.contains('[')
            || w.contains('|')
            || (!w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c == ':'))
    })
}

/// Words that are all subcommand names (lowercase, no digits, dots or slashes) or `--flags`.
fn is_mention(argv: &[String]) -> bool {
    argv.len() <= 4
        && argv
            .iter()
            .skip(1)
            .all(|w| w.starts_with("--") || w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
}

#[test]
fn every_documented_fedshard_command_parses_and_names_existing_configs() {
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("read doc");
        let name = doc
            .strip_prefix(repo())
            .unwrap_or(&doc)
            .display()
            .to_string();
        for argv in shell_snippets(&text).iter().flat_map(|s| invocations(s)) {
            if is_synopsis(&argv) {
                continue;
            }
            let line = argv.join(" ");
            match first_run::try_parse_from(&argv) {
                Ok(cli) => {
                    if let Err(e) = first_run::check(&cli.command) {
                        failures.push(format!("{name}: `{line}`: {e}"));
                    } else if let Some(config) = first_run::config_arg(&cli.command)
                        && let Err(e) = Config::load(&repo().join(config))
                    {
                        failures.push(format!("{name}: `{line}`: {e:#}"));
                    }
                    checked.push(line);
                }
                Err(e)
                    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) =>
                {
                    checked.push(line)
                }
                // A mention of a command or flag in prose (`fedshard eval`, `fedshard eval
                // --keep-top`), not an invocation: no word but subcommand names and flags.
                Err(_) if is_mention(&argv) => {}
                Err(e) => failures.push(format!("{name}: `{line}`:\n{e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "documented commands that no longer work:\n{}",
        failures.join("\n")
    );
    for expected in [
        "fedshard run config/digits-cnn.toml",
        "fedshard report runs/tour-seed1 runs/tour-seed2 --out runs/tour-report",
        "fedshard compare config/klms-mnist-fedpm.toml --compressors fedpm,fedpm-klms --d-targets 4 --seeds 3 --rounds 40",
    ] {
        assert!(
            checked.iter().any(|c| c == expected),
            "not found in the docs: {expected}\n{checked:#?}"
        );
    }
    assert!(
        checked.len() >= 40,
        "only {} commands found: {checked:#?}",
        checked.len()
    );
}

/// The folder of a workspace package, by its name.
fn package_dir(name: &str) -> Option<&'static str> {
    Some(match name {
        "fedshard" => ".",
        "fedshard-strategies" => "strategies",
        "fedshard-protocol" => "protocol",
        "fedshard-training" => "training",
        "fedshard-actors" => "actors",
        "fedshard-cluster" => "cluster",
        _ => return None,
    })
}

#[test]
fn every_documented_cargo_test_and_bench_target_exists() {
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("read doc");
        // Only whole cargo commands: a span such as `--bench spectral` alone names no package.
        for snippet in shell_snippets(&text)
            .iter()
            .filter(|s| s.contains("cargo "))
        {
            let words: Vec<&str> = snippet.split_whitespace().collect();
            for (i, w) in words.iter().enumerate() {
                let (flag, folder) = match *w {
                    "--test" => ("--test", "tests"),
                    "--bench" => ("--bench", "benches"),
                    _ => continue,
                };
                let Some(target) = words.get(i + 1) else {
                    continue;
                };
                let package = words
                    .windows(2)
                    .find(|p| p[0] == "-p")
                    .map_or("fedshard", |p| p[1]);
                let dir = package_dir(package).unwrap_or_else(|| {
                    panic!(
                        "{}: unknown package {package} in `{snippet}`",
                        doc.display()
                    )
                });
                let file = Path::new(dir).join(folder).join(format!("{target}.rs"));
                assert!(
                    repo().join(&file).is_file(),
                    "{}: `{snippet}`: no {flag} target {}",
                    doc.display(),
                    file.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} cargo targets found");
}
