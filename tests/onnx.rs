//! `[model] kind = "onnx"` end to end: a PyTorch export trained federated with spectral
//! sharding, and the refusals a config meets before any run.

use fedshard::config::Config;
use fedshard::federation;
use std::path::Path;

/// The shipped config at a test's size: mlp.onnx (64 → 32 → 10) on the digits, both Gemm
/// weights spectral shards for half the clients; it learns well above chance (0.1).
#[test]
fn an_onnx_mlp_learns_the_digits_with_spectral_shards() {
    let text = std::fs::read_to_string("config/onnx-digits-mlp.toml").expect("shipped config");
    let text = text.replace("rounds = 20", "rounds = 15");
    let config = Config::parse(&text, Path::new("config/onnx-digits-mlp.toml")).expect("valid");
    let (_, summary) = federation::run_to_end(&config).expect("run completes");
    assert_eq!(summary.rounds_completed, 15);
    assert!(
        summary.final_accuracy > 0.5,
        "final accuracy {}",
        summary.final_accuracy
    );
    assert!(summary.final_accuracy > summary.per_round[0].accuracy - 1e-9);
}

/// A model whose input does not fit the data (LeNet's 28×28 on the 8×8 digits) is refused
/// when the config is read, naming the field.
#[test]
fn an_onnx_model_of_another_input_shape_is_refused() {
    let text = std::fs::read_to_string("config/onnx-digits-mlp.toml").expect("shipped config");
    let text = text.replace("mlp.onnx", "lenet.onnx");
    let err = Config::parse(&text, Path::new("bad.toml")).expect_err("refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("model.path") && text.contains("lenet.onnx") && text.contains("28, 28"),
        "{text}"
    );
}

/// A missing file is refused naming it.
#[test]
fn a_missing_onnx_file_is_refused_naming_it() {
    let text = std::fs::read_to_string("config/onnx-digits-mlp.toml").expect("shipped config");
    let text = text.replace("mlp.onnx", "absent.onnx");
    let err = Config::parse(&text, Path::new("bad.toml")).expect_err("refused");
    assert!(format!("{err:#}").contains("absent.onnx"), "{err:#}");
}
