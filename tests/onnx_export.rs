//! `fedshard export`: a run's model written as ONNX and read back by fedshard's own loader
//! gives the run's logits; the digits CNN's initial model, exported and trained as
//! `kind = "onnx"`, gives the main job's model bit for bit; bad input is refused naming it.

mod common;

use common::{error_of, stdout_of};
use fedshard::config::{Config, Overrides};
use fedshard::federation;
use fedshard_protocol::model::ModelState;
use fedshard_training::models::builder::Builder;
use fedshard_training::models::kernels::Cohort;
use fedshard_training::models::net::Architecture;
use fedshard_training::models::onnx::{OnnxFile, OnnxModel};
use std::path::Path;

/// The committed fixture is what the command writes, byte for byte, and the ONNX config
/// (config/onnx-digits-cnn.toml) trains to the main job's (config/digits-cnn.toml) final
/// model, byte for byte, at 3 rounds: the loader makes the shipped CNN's Builder calls under
/// the same names (GroupNormalization + Relu as the fused GroupNorm, LayerNormalization as
/// LayerNorm) and runs the same kernels. The full 40 rounds give the same digest too
/// (docs/onnx.md, "Export").
#[test]
fn exported_digits_cnn_trains_to_the_main_jobs_digest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("digits_cnn.onnx");
    let out_arg = out.to_str().expect("utf-8 path");
    stdout_of(&[
        "export",
        "--initial",
        "config/digits-cnn.toml",
        "--onnx",
        out_arg,
    ]);
    let written = std::fs::read(&out).expect("written");
    let committed = std::fs::read("tests/fixtures/onnx/digits_cnn.onnx").expect("committed");
    assert!(
        written == committed,
        "tests/fixtures/onnx/digits_cnn.onnx differs from what `fedshard export --initial \
         config/digits-cnn.toml` writes: re-export it"
    );
    let overrides = Overrides {
        rounds: Some(3),
        ..Overrides::default()
    };
    let run = |path: &str| {
        let config = Config::load_with(Path::new(path), &overrides).expect("shipped config");
        let (model, summary) = federation::run_to_end(&config).expect("run completes");
        assert_eq!(summary.rounds_completed, 3);
        model.to_bytes()
    };
    let main = run("config/digits-cnn.toml");
    let onnx = run("config/onnx-digits-cnn.toml");
    assert!(
        main == onnx,
        "the ONNX digits CNN trained to another model than the shipped one"
    );
}

/// Logits of `state` under `architecture` on the first `rows` digits.
fn logits(architecture: &Architecture, state: &ModelState, rows: usize) -> Vec<f32> {
    type B = burn::backend::NdArray;
    let device = Default::default();
    let mut builder = Builder::<B>::given(state, &device);
    let net = architecture.build(&mut builder).expect("builds");
    let digits = fedshard_training::data::digits::load().expect("digits");
    let x = burn::tensor::Tensor::<B, 2>::from_data(
        burn::tensor::TensorData::new(digits.features[..rows * 64].to_vec(), [rows, 64]),
        &device,
    );
    net.forward(x, &Cohort::single(rows))
        .into_data()
        .to_vec::<f32>()
        .expect("f32 logits")
}

/// Trains `config` for 2 rounds into a run folder under `dir`, exports it, and checks that
/// fedshard's ONNX loader reads back exactly the run's model (its initializers are model.bin's
/// tensors) and computes the same logits on 32 digits, bit for bit.
fn export_round_trip(dir: &Path, config: &str) {
    let run = dir.join("run");
    let run_arg = run.to_str().expect("utf-8 path");
    stdout_of(&[
        "run",
        config,
        "--out",
        run_arg,
        "--rounds",
        "2",
        "--quiet",
        "--metrics-addr",
        "off",
    ]);
    let out = dir.join("model.onnx");
    let out_arg = out.to_str().expect("utf-8 path");
    let line = stdout_of(&["export", run_arg, "--onnx", out_arg]);
    assert!(line.starts_with("wrote "), "{line}");
    let trained = ModelState::read_file(&run.join("model.bin")).expect("model.bin");
    let back = OnnxModel::read(&out).expect("the export loads");
    assert_eq!(back.initial_state(), &trained, "{config}");
    let config = Config::load(&run.join("config.toml")).expect("saved config");
    let architecture = config.model.architecture().expect("a network");
    let onnx = Architecture::Onnx {
        path: OnnxFile::read(&out).expect("reads"),
    };
    let (a, b) = (
        logits(&architecture, &trained, 32),
        logits(&onnx, &trained, 32),
    );
    assert!(a == b, "{config:?}: logits differ: {a:?} vs {b:?}");
    // Exporting again over the file replaces it, and says so.
    let line = stdout_of(&["export", run_arg, "--onnx", out_arg]);
    assert!(line.starts_with("replaced "), "{line}");
}

/// A run of the shipped digits CNN and one of a user's ONNX model (the PyTorch MLP fixture):
/// both exports read back as the run's model with its logits.
#[test]
fn an_exported_run_reads_back_with_the_runs_logits() {
    for config in ["config/digits-cnn.toml", "config/onnx-digits-mlp.toml"] {
        let dir = tempfile::tempdir().expect("temp dir");
        export_round_trip(dir.path(), config);
    }
}

/// Bad input is refused with one line naming what is wrong: no run folder, a damaged
/// model.bin, an output that is a folder or whose folder is missing, a model kind without an
/// ONNX form (an architecture fedshard does not write: `export::tests` in the training crate).
#[test]
fn export_refuses_bad_input_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_string();
    let out = path("out.onnx");
    let missing = path("no-run");
    let e = error_of(&["export", &missing, "--onnx", &out]);
    assert!(
        e.contains(&missing) && e.contains("not a run folder"),
        "{e}"
    );

    let run = path("run");
    stdout_of(&[
        "run",
        "config/digits-linear.toml",
        "--out",
        &run,
        "--rounds",
        "1",
        "--quiet",
        "--metrics-addr",
        "off",
    ]);
    std::fs::write(dir.path().join("run/model.bin"), b"not a model").expect("damage it");
    let e = error_of(&["export", &run, "--onnx", &out]);
    assert!(e.contains("model.bin"), "{e}");

    let folder = path("");
    let e = error_of(&[
        "export",
        "--initial",
        "config/digits-cnn.toml",
        "--onnx",
        &folder,
    ]);
    assert!(e.contains("not a regular file"), "{e}");
    let nowhere = path("absent/out.onnx");
    let e = error_of(&[
        "export",
        "--initial",
        "config/digits-cnn.toml",
        "--onnx",
        &nowhere,
    ]);
    assert!(e.contains("absent") && e.contains("does not exist"), "{e}");

    let e = error_of(&[
        "export",
        "--initial",
        "config/mnist-fedpm.toml",
        "--onnx",
        &out,
    ]);
    assert!(e.contains("fedpm") && e.contains("no ONNX form"), "{e}");
    assert!(!Path::new(&out).exists(), "nothing written on a refusal");
}
