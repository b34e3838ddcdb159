//! Every citation of the project's specification resolves: each `docs/algorithms.md §N.M` (or
//! `§N`, or a range `§N.M–N.K`) in a `.rs`, `.md` or `.toml` file of the repository names a
//! section whose heading exists in docs/algorithms.md, and no file still points at the old
//! specification outside the repository or at the papers by their file numbers.
//!
//! Input: the repository's files (without `target/` and `.git/`). Expected: no unresolved
//! citation and no stale reference; a failure lists each one as `path:line` with what is wrong.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The file every citation points into.
const SPEC: &str = "docs/algorithms.md";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs`, `.md` and `.toml` files under `dir`, skipping `target/` and `.git/` (and not
/// following symbolic links).
fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let path = entry.path();
        let kind = entry
            .file_type()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if kind.is_dir() {
            if entry.file_name() != "target" && entry.file_name() != ".git" {
                source_files(&path, out);
            }
        } else if kind.is_file()
            && path
                .extension()
                .is_some_and(|x| x == "rs" || x == "md" || x == "toml")
        {
            out.push(path);
        }
    }
}

fn all_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    source_files(&repo(), &mut files);
    files.sort();
    files
}

/// A section number at the start of `text`: digits, optionally `.` and digits (`4`, `1.11`).
/// Returns it and the rest of `text`; a trailing `.` (end of a sentence) is not part of it.
fn section_number(text: &str) -> Option<(&str, &str)> {
    let major = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if major == 0 {
        return None;
    }
    let rest = &text[major..];
    let minor = rest
        .strip_prefix('.')
        .map(|r| r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len()))
        .unwrap_or(0);
    let end = if minor > 0 { major + 1 + minor } else { major };
    Some((&text[..end], &text[end..]))
}

/// The section numbers that headings of the specification define: `## 1 Title`,
/// `### 1.11 Title`, … (any heading level whose text starts with a number).
fn defined_sections(spec: &str) -> BTreeSet<String> {
    spec.lines()
        .filter_map(|line| {
            let text = line.trim_start_matches('#');
            if text.len() == line.len() || !text.starts_with(' ') {
                return None;
            }
            section_number(text.trim_start()).map(|(number, _)| number.to_string())
        })
        .collect()
}

/// Strips comment and list markers from the start of a continuation line.
fn continuation(line: &str) -> &str {
    line.trim_start()
        .trim_start_matches(['/', '!', '#', '*', '-', '>'])
        .trim_start()
}

/// One citation: where it is and which sections it names.
struct Citation {
    line: usize,
    sections: Vec<String>,
}

/// The sections cited in `text` right after a `docs/algorithms.md`: `§N.M`, optionally followed
/// by a range end `–N.K` (en dash or hyphen).
fn cited_after(text: &str) -> Option<Vec<String>> {
    let text = text.trim_start().strip_prefix('§')?;
    let (first, rest) = section_number(text)?;
    let mut sections = vec![first.to_string()];
    let after_dash = rest.strip_prefix('–').or_else(|| rest.strip_prefix('-'));
    if let Some((last, _)) = after_dash.and_then(section_number) {
        sections.push(last.to_string());
    }
    Some(sections)
}

/// Every `docs/algorithms.md §…` citation in `content`, with its 1-based line. A citation whose
/// `§` moved to the next line (a wrapped comment) counts too.
fn citations(content: &str) -> Vec<Citation> {
    let lines: Vec<&str> = content.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        for (at, _) in line.match_indices(SPEC) {
            let after = &line[at + SPEC.len()..];
            let sections = if after.trim().is_empty() {
                lines
                    .get(i + 1)
                    .and_then(|next| cited_after(continuation(next)))
            } else {
                cited_after(after)
            };
            if let Some(sections) = sections {
                found.push(Citation {
                    line: i + 1,
                    sections,
                });
            }
        }
    }
    found
}

/// References that must not appear: the old specification outside the repository (its name in
/// capitals) and the papers by file number (`seed 00` and a digit, in any case). Built from
/// pieces so that this file does not match itself.
fn stale_references(content: &str) -> Vec<(usize, String)> {
    let old_spec = ["ALGO", "RITHMS.md"].concat();
    let seed_prefix = ["seed", " 00"].concat();
    let mut found = Vec::new();
    for (i, line) in content.lines().enumerate() {
        if line.contains(&old_spec) {
            found.push((
                i + 1,
                format!("mentions {old_spec}; cite {SPEC} §N.M instead"),
            ));
        }
        let lower = line.to_lowercase();
        for (at, _) in lower.match_indices(&seed_prefix) {
            if lower[at + seed_prefix.len()..].starts_with(|c: char| c.is_ascii_digit()) {
                found.push((
                    i + 1,
                    "cites a paper by its file number; name it (the sharding, sampling, FESC or \
                     KLMS paper)"
                        .to_string(),
                ));
            }
        }
    }
    found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_citation_of_the_specification_names_an_existing_section() {
    let spec_path = repo().join(SPEC);
    let spec =
        fs::read_to_string(&spec_path).unwrap_or_else(|e| panic!("{}: {e}", spec_path.display()));
    let defined = defined_sections(&spec);
    let mut problems = Vec::new();
    let mut count = 0;
    for path in all_files() {
        let Ok(content) = fs::read_to_string(&path) else {
            continue; // not UTF-8: no citation can be in it
        };
        for citation in citations(&content) {
            count += 1;
            for section in &citation.sections {
                if !defined.contains(section) {
                    problems.push(format!(
                        "{}:{}: {SPEC} §{section} has no heading in {SPEC}",
                        relative(&path),
                        citation.line
                    ));
                }
            }
        }
    }
    // A parser that found nothing would pass vacuously: the code cites the spec well over a
    // hundred times.
    assert!(
        count >= 100,
        "only {count} citations of {SPEC} found: is the parser broken?"
    );
    assert!(
        problems.is_empty(),
        "{} unresolved citation(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn no_file_points_at_the_old_specification_or_at_papers_by_number() {
    let mut problems = Vec::new();
    for path in all_files() {
        let Ok(content) = fs::read_to_string(&path) else {
            continue;
        };
        for (line, what) in stale_references(&content) {
            problems.push(format!("{}:{line}: {what}", relative(&path)));
        }
    }
    assert!(
        problems.is_empty(),
        "{} stale reference(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_specification_numbers_every_section_the_chapters_promise() {
    // §1.1–§1.12, §2.1–§2.6, §3.1–§3.5, §4.1–§4.12 and the chapters themselves.
    let spec = fs::read_to_string(repo().join(SPEC)).expect(SPEC);
    let defined = defined_sections(&spec);
    for (chapter, last) in [(1, 12), (2, 6), (3, 5), (4, 12)] {
        assert!(defined.contains(&chapter.to_string()), "§{chapter} missing");
        for section in 1..=last {
            let number = format!("{chapter}.{section}");
            assert!(defined.contains(&number), "§{number} missing");
        }
    }
}

#[test]
fn the_parsers_read_the_forms_the_code_uses() {
    // Input, expected sections.
    let cases: [(&str, &[&str]); 6] = [
        ("(docs/algorithms.md §1.1 step 5)", &["1.1"]),
        ("docs/algorithms.md §1.5–1.6): draw", &["1.5", "1.6"]),
        ("the one-shot setting of docs/algorithms.md §3.3.", &["3.3"]),
        ("Compressed uplinks (docs/algorithms.md §4): the", &["4"]),
        ("ANME, docs/algorithms.md\n//! §1.9) and how far", &["1.9"]),
        ("docs/algorithms.md conventions", &[]),
    ];
    for (text, want) in cases {
        let got: Vec<String> = citations(text)
            .into_iter()
            .flat_map(|c| c.sections)
            .collect();
        assert_eq!(got, want, "{text:?}");
    }
    let headings = "# Algorithms\n## Conventions\n## 1 Spectral\n### 1.11 Test oracles\n#x";
    let want: BTreeSet<String> = ["1", "1.11"].map(String::from).into();
    assert_eq!(defined_sections(headings), want);
    let stale = [
        ["see ALGO", "RITHMS.md"].concat(),
        ["Seed", " 002"].concat(),
    ];
    assert_eq!(stale_references(&stale.join("\n")).len(), 2);
    assert!(stale_references("seed 0, seeds 1 and 2; docs/algorithms.md").is_empty());
}
