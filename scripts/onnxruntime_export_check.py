#!/usr/bin/env python3
"""onnxruntime's outputs for an ONNX file that `fedshard export` wrote (tests/fixtures/onnx/).

Not part of the build, the tests or CI: the oracle it writes is committed, and this script only
regenerates it. Run it from the repository root with the venv of scripts/onnx_fixtures.py:

    ../ref/bin/python scripts/onnxruntime_export_check.py   # [--model tests/fixtures/onnx/digits_cnn.onnx]

It checks the file with onnx.checker (full_check), runs it in onnxruntime (CPU, default graph
optimisations off so that the file's own nodes run) on a fixed batch of 8 seeded inputs in
[0, 1), and writes <name>.onnxruntime.json next to it: {"input": {"shape", "data"}, "output":
{"shape", "data"}, "versions"}. The test `onnx_export_runs_in_onnxruntime_with_fedshards_logits`
(training/src/models/onnx/tests_export.rs) compares fedshard's logits of the same file with it.
"""
import argparse
import json
import pathlib

import numpy as np
import onnx
import onnxruntime as ort

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="tests/fixtures/onnx/digits_cnn.onnx")
args = parser.parse_args()
path = pathlib.Path(args.model)

model = onnx.load(path)
onnx.checker.check_model(model, full_check=True)
dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:]
x = np.random.default_rng(20261129).random([8, *dims], dtype=np.float32)

options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
(y,) = session.run(None, {model.graph.input[0].name: x})

out = path.with_name(path.name.removesuffix(".onnx") + ".onnxruntime.json")
out.write_text(
    json.dumps(
        {
            "model": path.name,
            "versions": {"onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__},
            "input": {"shape": list(x.shape), "data": [float(v) for v in x.ravel()]},
            "output": {"shape": list(y.shape), "data": [float(v) for v in y.ravel()]},
        },
        indent=1,
    )
    + "\n"
)
print(f"{out}: logits {list(y.shape)}, first row {np.round(y[0], 4).tolist()}")
