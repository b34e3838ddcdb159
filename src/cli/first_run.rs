//! What a first-time user meets: an example under every command's `--help`, the configs that
//! ship when a config is missing or not found, and the nearest shipped name to a mistyped one.
//!
//! The examples live in one table here rather than in each command's module, so that a test
//! can check that every command has one and that every example parses.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::error::{ContextKind, ErrorKind};
use clap::{CommandFactory, FromArgMatches};

use super::{Cli, Command};

/// One example per command (by its path of subcommand names), shown under its `--help`.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("", "fedshard run config/digits-cnn.toml"),
    (
        "probs",
        "fedshard probs --strategy collective --clients 5 --n 2 --spectrum spectrum.json",
    ),
    (
        "sample",
        "fedshard sample --method conditional-poisson --draws 10000 --pi pi.json",
    ),
    (
        "widths",
        "fedshard widths config/digits-cnn.toml --strategy fedrolex --keep-ratio 0.25 --round 3",
    ),
    (
        "run",
        "fedshard run config/digits-linear.toml --out runs/tour-seed1",
    ),
    (
        "serve",
        "fedshard serve config/digits-linear.toml --listen 127.0.0.1:7000 --secret-file fedshard.secret",
    ),
    (
        "join",
        "fedshard join config/digits-linear.toml --server 127.0.0.1:7000 --clients 0-9 --secret-file fedshard.secret",
    ),
    (
        "cert",
        "fedshard cert --out certs --names 10.0.0.1,server.example",
    ),
    (
        "bench",
        "fedshard bench orchestration --clients 1000 --rounds 3",
    ),
    (
        "bench orchestration",
        "fedshard bench orchestration --clients 1000 --rounds 3",
    ),
    (
        "bench train",
        "fedshard bench train --model digits-cnn --seconds 8",
    ),
    ("bench job", "fedshard bench job config/digits-cnn.toml"),
    (
        "data partition",
        "fedshard data partition config/digits-cnn-dense.toml --seed 2",
    ),
    (
        "bench round",
        "fedshard bench round --model digits-cnn --clients 10 --samples 200 --batch 8",
    ),
    ("bench kernels", "fedshard bench kernels"),
    (
        "bench cluster",
        "fedshard bench cluster --nodes 3 --clients-per-node 100 --rounds 5",
    ),
    (
        "compare",
        "fedshard compare config/digits-linear.toml --strategies top-n,unbiased --keep-ratios 0.2,mixed --seeds 2 --rounds 10",
    ),
    ("eval", "fedshard eval runs/tour-seed1 --keep-top 0.2,1"),
    (
        "export",
        "fedshard export runs/tour-seed1 --onnx runs/tour-seed1/model.onnx",
    ),
    (
        "report",
        "fedshard report runs/tour-seed1 runs/tour-seed2 --out runs/tour-report",
    ),
    (
        "oneshot",
        "fedshard oneshot ridge --runs 2 --gammas 0.5,1.0",
    ),
    (
        "oneshot ridge",
        "fedshard oneshot ridge --nodes 500 --dim 50 --runs 50",
    ),
    ("data", "fedshard data mnist"),
    ("data shakespeare", "fedshard data shakespeare"),
    ("data mnist", "fedshard data mnist"),
    (
        "data export-digits",
        "fedshard data export-digits --out data/digits",
    ),
];

/// The clap command with each example attached as `after_help` (hidden commands keep none).
pub fn command() -> clap::Command {
    fn attach(cmd: clap::Command, path: &str) -> clap::Command {
        let example = EXAMPLES.iter().find(|(p, _)| *p == path).map(|(_, e)| *e);
        let cmd = match example {
            Some(example) => cmd.after_help(format!("Example:\n  {example}")),
            None => cmd,
        };
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        names.into_iter().fold(cmd, |cmd, name| {
            let sub_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path} {name}")
            };
            cmd.mut_subcommand(&name, |sub| attach(sub, &sub_path))
        })
    }
    attach(Cli::command(), "").after_help(format!(
        "Example (the main job):\n  {}\n\nConfigs that ship: {}\nRead more: README.md and docs/.",
        EXAMPLES[0].1,
        shipped_list()
    ))
}

/// Parses a command line; a clap error is returned with, where a config is missing, the
/// configs that ship appended.
pub fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    Cli::from_arg_matches(&matches)
}

/// Parses `std::env::args`, printing clap's message (and the shipped configs where a config
/// argument is missing) and exiting on an error or `--help`.
pub fn parse() -> Cli {
    match try_parse_from(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            let missing_config = e.kind() == ErrorKind::MissingRequiredArgument
                && e.get(ContextKind::InvalidArg)
                    .is_some_and(|v| v.to_string().contains("CONFIG"));
            let _ = e.print();
            if missing_config {
                eprintln!(
                    "\nConfigs that ship (in {}): {}",
                    config_dir().join("").display(),
                    shipped_list()
                );
            }
            std::process::exit(e.exit_code());
        }
    }
}

/// The folder of shipped configs: `config/` under the current folder when there is one (a
/// checkout), else the one this binary was built from.
fn config_dir() -> PathBuf {
    let here = Path::new("config");
    if here.is_dir() {
        here.to_path_buf()
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config")
    }
}

/// The shipped configs' file names (`digits-cnn.toml`, …), sorted; empty when the folder is gone.
pub fn shipped() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(config_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".toml"))
        .collect();
    names.sort();
    names
}

fn shipped_list() -> String {
    let names: Vec<String> = shipped()
        .into_iter()
        .map(|n| {
            if n == "digits-cnn.toml" {
                format!("{n} (the main job)")
            } else {
                n
            }
        })
        .collect();
    if names.is_empty() {
        "none found".to_string()
    } else {
        names.join(", ")
    }
}

/// The shipped config nearest to `wanted` (a path typed by the user), if one is near enough:
/// compared by file stem, so `digits-cn`, `config/digit-cnn.toml` and `digits_cnn` all find
/// `digits-cnn.toml`.
pub fn nearest(wanted: &Path, shipped: &[String]) -> Option<String> {
    let stem = wanted
        .file_stem()?
        .to_string_lossy()
        .to_lowercase()
        .replace('_', "-");
    shipped
        .iter()
        .map(|name| {
            let candidate = name.trim_end_matches(".toml");
            let distance = if candidate.starts_with(&stem) && stem.len() >= 3 {
                0
            } else {
                strsim::levenshtein(&stem, candidate)
            };
            (distance, name)
        })
        .filter(|(distance, name)| *distance <= 3.max(name.len() / 4))
        // Among equals (several names the typed one begins), the shortest: `digits-cn` is
        // `digits-cnn`, not `digits-cnn-dense`.
        .min_by_key(|(distance, name)| (*distance, name.len()))
        .map(|(_, name)| name.clone())
}

/// Fails with the nearest shipped config and the list of them when nothing is at `path`, and
/// says what is there when it is not a readable regular file (a directory, a FIFO, a device).
fn check_config(path: &Path) -> anyhow::Result<()> {
    if path.exists() {
        return crate::config::read_config_file(path).map(drop);
    }
    let names = shipped();
    let hint = match nearest(path, &names) {
        Some(name) => format!("did you mean {}? ", config_dir().join(name).display()),
        None => String::new(),
    };
    anyhow::bail!(
        "config file {} not found; {hint}configs that ship (in {}): {}",
        path.display(),
        config_dir().join("").display(),
        shipped_list()
    )
}

/// The CONFIG argument of a command that takes one.
pub fn config_arg(command: &Command) -> Option<&Path> {
    match command {
        Command::Run(args) => args.config.as_deref(),
        Command::Serve(args) => args.config.as_deref(),
        Command::Compare(args) => Some(args.config.as_path()),
        Command::Join(args) => Some(args.config.as_path()),
        Command::Bench(super::bench::BenchArgs {
            what: super::bench::BenchWhat::Job(args),
        }) => Some(args.config.as_path()),
        Command::Export(args) => args.initial.as_deref(),
        _ => None,
    }
}

/// Checks the config path of a command that reads one before anything starts.
pub fn check(command: &Command) -> anyhow::Result<()> {
    config_arg(command).map_or(Ok(()), check_config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subcommand_paths(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        out.push(path.to_string());
        for sub in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            let sub_path = if path.is_empty() {
                sub.get_name().to_string()
            } else {
                format!("{path} {}", sub.get_name())
            };
            subcommand_paths(sub, &sub_path, out);
        }
    }

    #[test]
    fn every_command_has_an_example_that_parses() {
        let mut paths = Vec::new();
        subcommand_paths(&Cli::command(), "", &mut paths);
        for path in &paths {
            let Some((_, example)) = EXAMPLES.iter().find(|(p, _)| p == path) else {
                panic!("`fedshard {path}` has no example in first_run::EXAMPLES");
            };
            let words = example.split_whitespace();
            if let Err(e) = try_parse_from(words) {
                panic!("the example of `fedshard {path}` does not parse: {example}\n{e}");
            }
        }
        for (path, _) in EXAMPLES {
            assert!(
                paths.iter().any(|p| p == path),
                "example for unknown command `{path}`"
            );
        }
    }

    #[test]
    fn help_shows_the_example() {
        let e = try_parse_from(["fedshard", "bench", "train", "--help"]).expect_err("help exits");
        assert_eq!(e.kind(), ErrorKind::DisplayHelp);
        assert!(
            e.to_string()
                .contains("fedshard bench train --model digits-cnn"),
            "{e}"
        );
    }

    #[test]
    fn a_mistyped_subcommand_gets_the_nearest_name() {
        let e = try_parse_from(["fedshard", "comapre"]).expect_err("unknown subcommand");
        assert_eq!(e.kind(), ErrorKind::InvalidSubcommand);
        assert!(e.to_string().contains("'compare'"), "{e}");
    }

    #[test]
    fn a_mistyped_config_gets_the_nearest_shipped_one() {
        let names: Vec<String> = [
            "digits-cnn-dense.toml",
            "digits-cnn.toml",
            "digits-linear.toml",
            "mnist-mlp.toml",
        ]
        .map(String::from)
        .to_vec();
        for typed in [
            "config/digits-cn.toml",
            "digit-cnn.toml",
            "digits_cnn",
            "config/digits-cnn",
        ] {
            assert_eq!(
                nearest(Path::new(typed), &names).as_deref(),
                Some("digits-cnn.toml"),
                "{typed}"
            );
        }
        assert_eq!(
            nearest(Path::new("mnist-mpl.toml"), &names).as_deref(),
            Some("mnist-mlp.toml")
        );
        assert_eq!(nearest(Path::new("/tmp/my-experiment.toml"), &names), None);
    }

    /// A directory or a device at the config's path is named for what it is, not "not found",
    /// and /dev/zero is refused before a byte of it is read.
    #[test]
    fn a_config_path_that_is_no_regular_file_says_what_it_is() {
        let dir = tempfile::tempdir().expect("temp dir");
        let e = format!("{:#}", check_config(dir.path()).expect_err("a directory"));
        assert!(
            e.contains("a folder, not a regular file") && !e.contains("not found"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            check_config(Path::new("/dev/zero")).expect_err("a device")
        );
        assert!(e.contains("/dev/zero: a device, not a regular file"), "{e}");
    }

    #[test]
    fn a_missing_config_is_an_error_naming_the_nearest_and_the_shipped_ones() {
        let cli = try_parse_from(["fedshard", "run", "config/digits-cn.toml"]).expect("parses");
        let e = check(&cli.command).expect_err("no such file").to_string();
        assert!(
            e.contains("config file config/digits-cn.toml not found"),
            "{e}"
        );
        assert!(e.contains("did you mean"), "{e}");
        assert!(e.contains("digits-cnn.toml (the main job)"), "{e}");
        let shipped = shipped();
        assert!(
            shipped.iter().any(|n| n == "digits-linear.toml"),
            "{shipped:?}"
        );
        let cli = try_parse_from(["fedshard", "run", "config/digits-cnn.toml"]).expect("parses");
        check(&cli.command).expect("the main job's config is there");
    }

    #[test]
    fn run_without_a_config_is_a_missing_argument() {
        let e = try_parse_from(["fedshard", "run"]).expect_err("config required");
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert!(
            e.get(ContextKind::InvalidArg)
                .is_some_and(|v| v.to_string().contains("CONFIG")),
            "{e}"
        );
    }
}
