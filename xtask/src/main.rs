//! `cargo xtask`: fedshard's project tasks, chiefly `cargo xtask test`, the README's test command,
//! which installs what the end-to-end tests need when it is missing and then runs every test.
//! `cargo xtask wan` runs a federation over network namespaces with rate-limited links.
//! Depends on no crate of the workspace, so it builds without building fedshard; `wan` parses
//! its flags with clap and reads fedshard's TOML and JSON with toml and serde_json.

mod deps;
mod netns;
mod wan;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask test [ARGS...]   set up, then `cargo test --workspace ARGS...`
       cargo xtask deps             only the set-up
       cargo xtask wan …            a federation over network namespaces (`cargo xtask wan --help`)

The set-up installs what the end-to-end tests need when it is missing: the system packages
prometheus, chromium, nodejs and npm (with apt-get, as root or with sudo without a password)
and the pinned dashboard-schema npm packages (scripts/dashboard-schema/check.sh --install).
Without the rights to install, it stops before testing and names the command to run.

example: cargo xtask test -p fedshard --test prometheus";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let repo = repo_root();
    match args.first().map(String::as_str) {
        Some("test") => match deps::ensure(&repo, &target_dir(&repo)) {
            Ok(()) => cargo_test(&repo, &args[1..]),
            Err(message) => fail(&message),
        },
        Some("deps") => match deps::ensure(&repo, &target_dir(&repo)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => fail(&message),
        },
        Some("wan") => wan::main(&repo, &args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => fail(&format!("unknown task `{other}`\n\n{USAGE}")),
        None => fail(&format!("no task given\n\n{USAGE}")),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("cargo xtask: error: {message}");
    ExitCode::from(2)
}

/// The workspace root: this crate lives in `xtask/` directly under it.
fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Cargo's target directory as the tests see it (`CARGO_TARGET_TMPDIR` lies under it), so that
/// the schema packages land where `tests/dashboards.rs` looks for them.
fn target_dir(repo: &Path) -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => repo.join(dir),
        _ => repo.join("target"),
    }
}

/// Runs `cargo test --workspace ARGS...` in the workspace root and exits with its status.
fn cargo_test(repo: &Path, args: &[String]) -> ExitCode {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let line = ["cargo", "test", "--workspace"]
        .iter()
        .map(|w| w.to_string())
        .chain(args.iter().cloned());
    println!(
        "cargo xtask test: running `{}`",
        line.collect::<Vec<_>>().join(" ")
    );
    match Command::new(cargo)
        .current_dir(repo)
        .args(["test", "--workspace"])
        .args(args)
        .status()
    {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1)),
        Err(e) => fail(&format!("cannot run cargo: {e}")),
    }
}
