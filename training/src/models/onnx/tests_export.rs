//! An ONNX file that `fedshard export` wrote, run by onnxruntime: its logits of a fixed batch
//! (tests/fixtures/onnx/digits_cnn.onnxruntime.json, written outside the build by
//! scripts/onnxruntime_export_check.py) are fedshard's own logits of the same file, so the
//! exported model is the one fedshard trained, as another runtime reads it.

use super::tests::{build, fixture, floats, logits, max_diff, oracle};
use super::*;
use burn::backend::NdArray;

/// The exported digits CNN (its GroupNorm fused with ReLU, pools, Gemm, opset 21): onnxruntime
/// 1.32's logits within 1e-5 of fedshard's.
#[test]
fn onnx_export_runs_in_onnxruntime_with_fedshards_logits() {
    let o = oracle("digits_cnn.onnxruntime");
    let m = OnnxModel::read(&fixture("digits_cnn.onnx")).expect("loads");
    let net = build::<NdArray>(&m, m.initial_state());
    let ours = logits(&net, &o);
    let theirs = floats(&o["output"]);
    assert_eq!(ours.len(), 8 * 10);
    let diff = max_diff(&ours, &theirs);
    eprintln!("digits_cnn.onnx: largest difference from onnxruntime {diff:e}");
    assert!(diff <= 1e-5, "logits differ from onnxruntime's by {diff}");
}
