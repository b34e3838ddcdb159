//! The size limits the house keeps, as tests that fail the day one is broken: a code file that
//! needs a comment to say how it is organised is too big, and a README that holds every detail
//! is no longer read.
//!
//! - Every `.rs` file of the workspace has at most [`MAX_CODE_LINES`] lines. Test code apart:
//!   files named `tests.rs` and files under a folder named `tests` (integration tests, a
//!   module's `tests/` folder) are not counted, so a module whose tests grow moves them out of
//!   its file into a `tests.rs` beside it; an inline `#[cfg(test)] mod tests` counts with its
//!   file. `target/` and hidden folders are skipped.
//! - README.md has fewer than [`README_MAX_LINES`] lines, none longer than
//!   [`README_MAX_LINE_CHARS`] characters: detail belongs in `docs/`.
//!
//! A failure lists each offending file with its count.

use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a code file may have.
const MAX_CODE_LINES: usize = 700;

/// The README must stay under this many lines.
const README_MAX_LINES: usize = 250;

/// The most characters one README line may have (a table row included).
const README_MAX_LINE_CHARS: usize = 400;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether `path` (relative to the repository) is test code, which has no size limit.
fn is_test_code(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == "tests.rs")
        || path
            .parent()
            .is_some_and(|dir| dir.components().any(|c| c.as_os_str() == "tests"))
}

/// The `.rs` files under `root`, in path order, skipping `target/`, `node_modules/` and hidden
/// folders (`.git/`, `.cargo/`) and not following symbolic links.
fn rust_files(root: &Path) -> Vec<PathBuf> {
    let skipped = |entry: &walkdir::DirEntry| {
        let name = entry.file_name().to_string_lossy();
        entry.depth() > 0
            && entry.file_type().is_dir()
            && (name == "target" || name == "node_modules" || name.starts_with('.'))
    };
    let mut files: Vec<PathBuf> = walkdir::WalkDir::new(root)
        .into_iter()
        .filter_entry(|entry| !skipped(entry))
        .map(|entry| entry.unwrap_or_else(|e| panic!("{}: {e}", root.display())))
        .filter(|entry| {
            entry.file_type().is_file() && entry.path().extension().is_some_and(|x| x == "rs")
        })
        .map(walkdir::DirEntry::into_path)
        .collect();
    files.sort();
    files
}

/// `path: count` for each code file over [`MAX_CODE_LINES`], in path order.
fn oversized_code_files(root: &Path) -> Vec<String> {
    rust_files(root)
        .iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(root).unwrap_or(file);
            if is_test_code(relative) {
                return None;
            }
            let text =
                fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let lines = text.lines().count();
            (lines > MAX_CODE_LINES).then(|| format!("{}: {lines} lines", relative.display()))
        })
        .collect()
}

/// What is wrong with a README's `text`: its line count, and each line that is too long.
fn readme_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let lines = text.lines().count();
    if lines >= README_MAX_LINES {
        problems.push(format!(
            "README.md: {lines} lines, expected fewer than {README_MAX_LINES}"
        ));
    }
    for (index, line) in text.lines().enumerate() {
        let chars = line.chars().count();
        if chars > README_MAX_LINE_CHARS {
            problems.push(format!(
                "README.md:{}: {chars} characters, expected at most {README_MAX_LINE_CHARS}",
                index + 1
            ));
        }
    }
    problems
}

#[test]
fn no_code_file_is_over_700_lines() {
    let oversized = oversized_code_files(&repo());
    assert!(
        oversized.is_empty(),
        "code files over {MAX_CODE_LINES} lines (split each by responsibility; test code goes \
         in a `tests.rs` or a `tests/` folder, which are not counted):\n{}",
        oversized.join("\n")
    );
}

#[test]
fn the_readme_is_short_and_its_lines_too() {
    let path = repo().join("README.md");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let problems = readme_problems(&text);
    assert!(
        problems.is_empty(),
        "the README is a summary (move detail into docs/):\n{}",
        problems.join("\n")
    );
}

/// The rules themselves, on a tree and a text made for them: the limits are exact (700 lines
/// pass, 701 fail; 249 README lines pass, 250 fail), test code is exempt however long, and
/// every offender is listed with its count.
#[test]
fn the_limits_flag_exactly_what_breaks_them() {
    let root = std::env::temp_dir().join(format!("fedshard-limits-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let lines = |n: usize| "x\n".repeat(n);
    let files = [
        ("src/at_limit.rs", lines(700)),
        ("src/over.rs", lines(701)),
        ("src/module/tests.rs", lines(2000)),
        ("tests/end_to_end.rs", lines(2000)),
        ("crate/src/round/tests/oracles.rs", lines(2000)),
        ("crate/src/deep/over.rs", lines(900)),
        ("target/debug/build/generated.rs", lines(2000)),
        (".hidden/big.rs", lines(2000)),
        ("src/notes.md", lines(2000)),
    ];
    for (path, text) in &files {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    let found = oversized_code_files(&root);
    fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        found,
        [
            "crate/src/deep/over.rs: 900 lines",
            "src/over.rs: 701 lines"
        ]
    );

    assert!(readme_problems(&lines(249)).is_empty());
    let long = format!("{}\n{}\n", "a".repeat(400), "é".repeat(401));
    assert_eq!(
        readme_problems(&(lines(248) + &long)),
        [
            "README.md: 250 lines, expected fewer than 250",
            "README.md:250: 401 characters, expected at most 400"
        ]
    );
}
