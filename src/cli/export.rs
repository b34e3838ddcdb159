//! `fedshard export RUN_DIR --onnx OUT.onnx`: a finished run's global model as an ONNX file
//! that onnxruntime and PyTorch load (docs/onnx.md, "Export"); `--initial CONFIG` writes the
//! model a config's round 1 starts from instead, with no run.
//!
//! Why `--initial`: the initial model exported and read back as `kind = "onnx"` must train to
//! the same bytes as the config's own model, which is how the ONNX path is shown to be the
//! same computation (`exported_digits_cnn_trains_to_the_main_jobs_digest`).

use crate::config::Config;
use anyhow::{Context, bail};
use clap::{ArgGroup, Args};
use fedshard_training::models::net::Architecture;
use fedshard_training::models::onnx::export::to_onnx;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["run", "initial"])))]
pub struct ExportArgs {
    /// A run folder of `fedshard run` (its `config.toml` and final `model.bin`).
    pub run: Option<PathBuf>,
    /// Instead of a run: the initial model of this config (its seeded draw, or an ONNX model's
    /// own initializers), the one its round 1 starts from.
    #[arg(long, value_name = "CONFIG")]
    pub initial: Option<PathBuf>,
    /// The ONNX file to write; an existing regular file is replaced, anything else refused.
    #[arg(long, value_name = "OUT.onnx")]
    pub onnx: PathBuf,
}

/// Writes the model and returns the line that says what was written.
pub fn export(args: &ExportArgs) -> anyhow::Result<String> {
    let (config, model, source) = match (&args.run, &args.initial) {
        (Some(dir), _) => {
            let (config, model) = super::eval::load_run(dir)?;
            (config, model, format!("run {}", dir.display()))
        }
        (None, Some(path)) => {
            let config = Config::load(path)?;
            let model = config.model()?.initial_state(config.run.seed)?;
            (
                config,
                model,
                format!("initial model of {}", path.display()),
            )
        }
        (None, None) => unreachable!("clap requires RUN_DIR or --initial"),
    };
    let Some(architecture) = config.model.architecture() else {
        bail!(
            "{source}: the {} model has no ONNX form (export writes the neural, softmax and onnx \
             kinds)",
            config.model.kind()
        );
    };
    let bytes = to_onnx(&architecture, &model).with_context(|| source.clone())?;
    let replaced = write_file(&args.onnx, &bytes)?;
    // A model read from ONNX keeps its file's graph and opset; a shipped one is written at ours.
    let graph = match architecture {
        Architecture::Onnx { .. } => "its file's graph and opset".to_string(),
        _ => format!("opset {}", fedshard_training::models::onnx::write::OPSET),
    };
    Ok(format!(
        "{} {} ({} bytes): the {source} as ONNX ({graph})",
        if replaced { "replaced" } else { "wrote" },
        args.onnx.display(),
        bytes.len(),
    ))
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so a
/// reader never sees half a model. Refuses a `path` that exists and is not a regular file (a
/// folder, a link, a device); returns whether a regular file was replaced.
fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<bool> {
    let replaced = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => true,
        Ok(meta) => bail!(
            "--onnx {}: it exists and is not a regular file ({}); refusing to replace it",
            path.display(),
            if meta.is_dir() {
                "a folder"
            } else if meta.file_type().is_symlink() {
                "a symbolic link"
            } else {
                "a special file"
            }
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => bail!("--onnx {}: {e}", path.display()),
    };
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        bail!(
            "--onnx {}: the folder {} does not exist",
            path.display(),
            folder.display()
        );
    }
    let name = path
        .file_name()
        .with_context(|| format!("--onnx {}: not a file name", path.display()))?;
    let partial = folder.join(format!(".{}.partial", name.to_string_lossy()));
    let io = |e: std::io::Error| anyhow::anyhow!("--onnx {}: {e}", partial.display());
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial)
        .map_err(io)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    drop(file);
    if let Err(e) = written.and_then(|()| fs::rename(&partial, path)) {
        let _ = fs::remove_file(&partial);
        bail!("--onnx {}: {e}", path.display());
    }
    Ok(replaced)
}
