#!/usr/bin/env python3
"""Reference fixtures for loading ONNX models exported by PyTorch (tests/fixtures/onnx/).

Not part of the build, the tests or CI: the fixtures it writes are committed, and this script
only regenerates them. Run it from the repository root with a throwaway venv outside the
repository:

    python3 -m venv ../ref
    ../ref/bin/pip install torch onnx onnxruntime onnxscript numpy
    ../ref/bin/python scripts/onnx_fixtures.py            # [--out DIR]

For each of three small models -- `mlp` (input [N,64], the 8x8 digits flattened), `lenet`
(input [N,1,28,28], MNIST) and `resnet_gn` (input [N,1,8,8], GroupNorm + one residual block +
GELU + global average pool) -- it writes into tests/fixtures/onnx/:

  <name>.onnx         torch.onnx.export(dynamo=False, opset_version=13, do_constant_folding=False),
                      dynamic batch dimension "N"; initializer names are the PyTorch parameter
                      names (e.g. "fc1.weight").
  <name>.dynamo.onnx  the same model through the dynamo exporter at opset 18 (skipped, with the
                      reason printed and recorded, if that exporter fails).
  <name>.json         the oracle, for a fixed batch of N=4 (seeded inputs, fixed labels):
                        "input": {"shape", "data"} (flat, row-major f32), "labels",
                        "output": the logits {"shape", "data"},
                        "loss": mean cross-entropy of the logits against the labels,
                        "grads": {ONNX value name in <name>.onnx (the initializer, or the Identity
                                 output of a deduplicated one): {"shape", "data"}} for every
                                 trainable parameter (gradient of that mean loss),
                        "sgd_lr": 0.1, "after_step_output": the logits after one plain SGD step
                                 (no momentum, no weight decay) with those grads,
                        "ops": {file: {op_type: count}}, "files": per exported file its opset,
                                 exporter, initializers (-> PyTorch parameter), ORT check, notes.

What the exporters do to parameters (recorded per file under "files" in the JSON): the
TorchScript exporter (eval mode) deduplicates initializers of equal values, so in
resnet_gn.onnx the freshly initialised GroupNorm affine parameters (all gamma = 1, beta = 0)
survive as the initializers stem_gn.weight/bias only, and block_gn{1,2}.weight/bias are the
outputs of Identity nodes reading them; the dynamo exporter's optimizer folds each
Unsqueeze(gamma/beta) into an anonymous [8,1,1] initializer (val_*) and merges the equal ones,
so resnet_gn.dynamo.onnx names no GroupNorm parameter at all ("shared_initializers", with the
summed "tied_grad" a loader training that tensor would get). The JSON grads follow PyTorch (one
gradient per parameter), keyed by the value names of <name>.onnx.

Two further models exercise the operators added later, with per-model options (OPTIONS):
`bn_cnn` (input [N,1,8,8]: BatchNorm2d, LeakyReLU, a dilated depthwise and a dilated conv,
overlapping padded pools, Dropout, LogSoftmax; TorchScript at opset 13, dynamo at opset 18
without its optimizer, which would fold BatchNorm into the convolutions) whose oracle runs in
train mode (batch statistics, fedshard's rule; Dropout kept in eval mode), and `mixer` (input
[N,64]: LayerNorm, transpose, softmax, GELU, tanh, sigmoid, unsqueeze/squeeze; TorchScript at
opset 17 for LayerNormalization, dynamo at opset 20 for Gelu). resnet_gn is also exported by
dynamo at opset 21 (resnet_gn.opset21.onnx: GroupNormalization nodes, their equal gamma/beta
merged, "shared_initializers" with the tied gradient).

Every exported file is run in onnxruntime (CPU, one thread) on the fixed batch and on batches of
1 and 3; the logits must match PyTorch to 1e-5 (max abs diff) or the script fails; and the
grads, applied with lr 0.1 to the initializers of each file that can hold an untied step (all
but resnet_gn.dynamo.onnx), must reproduce after_step_output in onnxruntime. Floats are
written as the shortest decimal that round-trips the f32 value (zeros as 0). Deterministic:
fixed seeds, torch.set_num_threads(1), deterministic algorithms; rerunning with the same versions
rewrites identical bytes (the .dynamo.onnx files embed the exporter's metadata: versions, and
stack traces naming this script's absolute path).
"""
import argparse
import collections
import copy
import json
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LR = 0.1
LABELS = [7, 2, 1, 0]  # fixed labels of the N=4 batch
TOL = 1e-5


class Mlp(nn.Module):
    """[N,64] -> Linear(64,32) -> ReLU -> Linear(32,10)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class LeNet(nn.Module):
    """[N,1,28,28] -> Conv(1,6,5,pad 2) -> ReLU -> MaxPool2 -> Conv(6,16,5) -> ReLU -> AvgPool2
    -> Flatten -> Linear(400,120) -> ReLU -> Linear(120,84) -> ReLU -> Linear(84,10)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool2 = nn.AvgPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = self.flatten(x)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class ResNetGn(nn.Module):
    """[N,1,8,8] -> Conv3x3(1,8,no bias) -> GroupNorm(2,8) -> ReLU
    -> residual block [Conv3x3(8,8,no bias) -> GN -> ReLU -> Conv3x3(8,8,no bias) -> GN, + skip]
    -> ReLU -> Conv3x3(8,16,stride 2,pad 1) -> GELU (exact, erf) -> AdaptiveAvgPool2d(1)
    -> Flatten -> Linear(16,10).

    GroupNorm keeps its fresh initialisation (gamma = 1, beta = 0): the case where a parser
    that simplifies Mul-by-one / Add-zero would drop the affine parameters."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.stem_gn = nn.GroupNorm(2, 8)
        self.block_conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.block_gn1 = nn.GroupNorm(2, 8)
        self.block_conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.block_gn2 = nn.GroupNorm(2, 8)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.stem_gn(self.stem(x)))
        y = F.relu(self.block_gn1(self.block_conv1(x)))
        y = self.block_gn2(self.block_conv2(y))
        x = F.relu(x + y)
        x = F.gelu(self.down(x))
        return self.fc(self.flatten(self.pool(x)))


class BnCnn(nn.Module):
    """[N,1,8,8] -> Conv3x3(1,8,pad 1) -> BatchNorm2d(8) -> LeakyReLU(0.1)
    -> depthwise dilated Conv3x3(8,8,groups 8,dilation 2,pad 2) -> BatchNorm2d(8) -> ReLU
    -> MaxPool(3,stride 2,pad 1) -> dilated Conv3x3(8,16,dilation 2,pad 2) -> ReLU
    -> AvgPool(3,stride 1,pad 1) -> Dropout(0.25) -> AdaptiveAvgPool2d(1) -> Flatten
    -> Linear(16,10) -> LogSoftmax.

    The oracle runs it in train mode (BatchNorm on the batch's statistics, fedshard's rule)
    with Dropout in eval mode (an identity, fedshard's rule); the files are exported in eval
    mode. BatchNorm's affine parameters and running statistics are seeded away from 1 and 0
    so that no exporter deduplicates them."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.LeakyReLU(0.1)
        self.dw = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool1 = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=2, dilation=2)
        self.pool2 = nn.AvgPool2d(3, stride=1, padding=1)
        self.drop = nn.Dropout(0.25)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(16, 10)
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.weight.copy_(0.5 + torch.rand(8, generator=g))
                bn.bias.copy_(0.1 * torch.randn(8, generator=g))
                bn.running_mean.copy_(0.1 * torch.randn(8, generator=g))
                bn.running_var.copy_(0.5 + torch.rand(8, generator=g))

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.pool1(F.relu(self.bn2(self.dw(x))))
        x = self.pool2(F.relu(self.conv2(x)))
        x = self.flatten(self.gap(self.drop(x)))
        return F.log_softmax(self.fc(x), dim=1)


class Mixer(nn.Module):
    """[N,64] -> view [N,4,16] -> LayerNorm(16) -> transpose(1,2) -> softmax(-1) -> flatten
    -> Linear(64,32) -> LayerNorm(32) -> GELU -> Linear(32,32) -> tanh * sigmoid
    -> unsqueeze(1).squeeze(1) -> Dropout(0.1) -> Linear(32,10).

    LayerNorm's affine parameters are seeded away from 1 and 0 (no deduplication)."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(16)
        self.fc1 = nn.Linear(64, 32)
        self.ln2 = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 32)
        self.drop = nn.Dropout(0.1)
        self.fc3 = nn.Linear(32, 10)
        g = torch.Generator().manual_seed(12)
        with torch.no_grad():
            for ln in (self.ln1, self.ln2):
                ln.weight.copy_(0.5 + torch.rand(ln.weight.shape, generator=g))
                ln.bias.copy_(0.1 * torch.randn(ln.bias.shape, generator=g))

    def forward(self, x):
        x = self.ln1(x.view(-1, 4, 16)).transpose(1, 2)
        x = torch.softmax(x, dim=-1).flatten(1)
        x = F.gelu(self.ln2(self.fc1(x)))
        h = self.fc2(x)
        x = (torch.tanh(h) * torch.sigmoid(h)).unsqueeze(1).squeeze(1)
        return self.fc3(self.drop(x))


def doc_line(cls):
    return " ".join(l.strip() for l in cls.__doc__.split("\n\n")[0].split("\n"))


# Per model: the TorchScript exporter's opset (LayerNormalization needs 17), the dynamo
# exporter's (20 has Gelu), and whether the oracle trains in train mode (BatchNorm's batch
# statistics; Dropout kept in eval mode).
# "extra": further dynamo exports at other opsets (resnet_gn at 21, where GroupNorm is one
# GroupNormalization node rather than its decomposition).
OPTIONS = {
    "resnet_gn": {"legacy_opset": 13, "dynamo_opset": 18, "train_mode": False,
                  "extra": [("resnet_gn.opset21.onnx", 21)]},
    "bn_cnn": {"legacy_opset": 13, "dynamo_opset": 18, "train_mode": True},
    "mixer": {"legacy_opset": 17, "dynamo_opset": 20, "train_mode": False},
}

MODELS = [
    # name, class, model seed, input shape of one sample, description
    ("mlp", Mlp, 1, (64,), "8x8 digits flattened; Linear(64,32) -> ReLU -> Linear(32,10)"),
    ("lenet", LeNet, 2, (1, 28, 28), LeNet.__doc__.split("\n")[0] + " " + LeNet.__doc__.split("\n")[1].strip()),
    ("resnet_gn", ResNetGn, 3, (1, 8, 8), " ".join(l.strip() for l in ResNetGn.__doc__.split("\n")[:4])),
    ("bn_cnn", BnCnn, 4, (1, 8, 8), doc_line(BnCnn)),
    ("mixer", Mixer, 5, (64,), doc_line(Mixer)),
]


def f32_list(t):
    """Flat row-major list of Python floats, each the shortest decimal that round-trips its f32."""
    a = np.ascontiguousarray(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t,
                             dtype=np.float32).reshape(-1)
    out = [0 if v == 0 else float(np.format_float_scientific(v, unique=True)) for v in a]  # zeros (and -0) as 0
    assert np.array_equal(np.array(out, dtype=np.float32), a), "f32 round trip"
    return out


def tensor_json(t):
    return {"shape": list(t.shape), "data": f32_list(t)}


def make_input(shape, seed):
    """Pixel-like values k/16, k in 0..16: exact in f32 and short in decimal."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 17, shape, generator=g).to(torch.float32) / 16.0


def op_counts(model):
    c = collections.Counter(n.op_type for n in model.graph.node)
    return dict(sorted(c.items()))


def map_initializers(model, torch_model):
    """Where each PyTorch parameter lives in the ONNX graph.

    Returns (onnx_to_param, identity_aliases, shared, others, missing, notes):
      onnx_to_param     ONNX value name -> parameter, for the parameters the graph still names:
                        an initializer (by name, else by identical values and shape), or the
                        output of an Identity node reading one (see below);
      identity_aliases  Identity output -> initializer: the TorchScript exporter deduplicates
                        initializers of equal values (in eval mode) and the later parameters are
                        read through Identity nodes;
      shared            initializer -> the parameters it stands for when that is more than one
                        (Identity aliases, or the dynamo exporter's optimizer constant-folding the
                        Unsqueeze of a parameter into a new, reshaped initializer and merging equal
                        ones): a loader that trains this initializer trains them tied;
      others            the remaining initializers (shapes, small constants);
      missing           parameters found nowhere (an error)."""
    params = {k: v.detach().numpy() for k, v in torch_model.named_parameters()}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    mapping, others, notes = {}, {}, []
    for name, arr in inits.items():
        if name in params and params[name].shape == arr.shape and np.array_equal(params[name], arr):
            mapping[name] = name
            continue
        hits = [k for k, v in params.items() if v.shape == arr.shape and np.array_equal(v, arr)]
        if len(hits) == 1:
            mapping[name] = hits[0]
            notes.append(f"initializer {name!r} holds parameter {hits[0]!r} under another name")
    aliases = {}
    for n in model.graph.node:
        if n.op_type == "Identity" and n.input[0] in mapping and n.output[0] in params:
            target = aliases.get(n.input[0], n.input[0])
            if np.array_equal(params[n.output[0]], inits[target]):
                mapping[n.output[0]] = n.output[0]
                aliases[n.output[0]] = target
                notes.append(f"parameter {n.output[0]!r} is no initializer: the exporter deduplicated it "
                             f"into {target!r} (equal values) and reads it through an Identity node")
    shared = {}
    for out, init in aliases.items():
        shared.setdefault(init, {"params": [mapping[init]], "how": "Identity aliases"})["params"].append(out)
    found = set(mapping.values())
    for name, arr in inits.items():
        if name in mapping or not np.issubdtype(arr.dtype, np.floating):
            continue
        hits = [k for k, v in params.items() if k not in found and v.size == arr.size
                and np.array_equal(v.reshape(-1), arr.reshape(-1))]
        if hits:
            shared[name] = {"params": hits, "shape": list(arr.shape),
                            "how": "constant-folded (reshaped) by the exporter's optimizer"
                                   + (", equal ones merged" if len(hits) > 1 else "")}
            notes.append(f"parameters {hits} are no named initializer: the exporter folded them into "
                         f"{name!r} {list(arr.shape)}")
    for name, arr in inits.items():
        if name not in mapping and name not in shared:
            others[name] = {"shape": list(arr.shape), "dtype": str(arr.dtype)}
            if arr.size <= 16:
                others[name]["value"] = arr.reshape(-1).tolist()
    in_shared = {p for v in shared.values() for p in v["params"]}
    missing = sorted(set(params) - found - in_shared)
    if missing:
        notes.append(f"parameters with no initializer of the same values: {missing}")
    return mapping, aliases, shared, others, missing, notes


def ort_logits(path, x):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return sess.run(None, {name: x.numpy()})[0]


def check_file(path, torch_model, x, extra_batches):
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    with torch.no_grad():
        ref = torch_model(x).numpy()
    got = ort_logits(path, x)
    diff = float(np.max(np.abs(got - ref)))
    assert got.shape == ref.shape, (path, got.shape, ref.shape)
    assert diff < TOL, f"{path}: onnxruntime logits differ from PyTorch by {diff}"
    for xb in extra_batches:  # the batch dimension really is dynamic
        with torch.no_grad():
            r = torch_model(xb).numpy()
        d = float(np.max(np.abs(ort_logits(path, xb) - r)))
        assert d < TOL, f"{path}: batch {xb.shape[0]}: onnxruntime differs by {d}"
    g = model.graph
    inp, out = g.input[0], g.output[0]
    dims = lambda vi: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
    return model, {
        "ort_max_abs_diff": diff,
        "input_name": inp.name, "input_dims": dims(inp),
        "output_name": out.name, "output_dims": dims(out),
        "opset_imports": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "nodes": len(g.node),
        "functions": [f.name for f in model.functions],
    }


def export_legacy(m, x, path, opset=13):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), path, dynamo=False, opset_version=opset, input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
                          do_constant_folding=False, export_params=True, keep_initializers_as_inputs=False)


def export_dynamo(m, x, path, opset=18):
    n = torch.export.Dim("N", min=1, max=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The optimizer folds an eval-mode BatchNorm into the convolution before it (the
        # running statistics into the weights); a trained BatchNorm must stay a node.
        optimize = not any(isinstance(mod, nn.BatchNorm2d) for mod in m.modules())
        prog = torch.onnx.export(m, (x,), dynamo=True, opset_version=opset, optimize=optimize, input_names=["input"],
                                 output_names=["logits"], dynamic_shapes=({0: n},), external_data=False)
    prog.save(path, external_data=False)


def run_model(name, cls, seed, sample_shape, desc, out_dir, want_dynamo):
    torch.manual_seed(seed)
    model = cls().eval()
    x = make_input((4,) + sample_shape, 100 + seed)
    extra = [make_input((1,) + sample_shape, 200 + seed), make_input((3,) + sample_shape, 300 + seed)]
    y = torch.tensor(LABELS)

    # Export first, from the untouched model.
    files, ops, notes = {}, {}, []
    opts = OPTIONS.get(name, {"legacy_opset": 13, "dynamo_opset": 18, "train_mode": False})
    exports = [(f"{name}.onnx", "torchscript (dynamo=False)", opts["legacy_opset"], export_legacy)]
    if want_dynamo:
        exports.append((f"{name}.dynamo.onnx", "dynamo (torch.export)", opts["dynamo_opset"], export_dynamo))
    for fname, exporter, opset, fn in exports:
        path = os.path.join(out_dir, fname)
        try:
            fn(copy.deepcopy(model), x, path, opset)
        except Exception as e:  # noqa: BLE001 -- record why and go on without this file
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            print(f"  {fname}: export FAILED, skipped: {msg}")
            files[fname] = {"exists": False, "exporter": exporter, "opset": opset, "error": msg}
            if os.path.exists(path):
                os.remove(path)
            continue
        if os.path.exists(path + ".data"):
            raise SystemExit(f"{path}: exporter wrote external data; fixtures must be one file")
        onnx_model, info = check_file(path, model, x, extra)
        mapping, aliases, shared, others, missing, mnotes = map_initializers(onnx_model, model)
        if missing:
            raise SystemExit(f"{path}: {mnotes[-1]}")
        ops[fname] = op_counts(onnx_model)
        files[fname] = {"exists": True, "exporter": exporter, "opset": opset,
                        "onnx_to_param": mapping, "identity_aliases": aliases,
                        "shared_initializers": shared, "other_initializers": others,
                        "notes": mnotes, **info}
        print(f"  {fname}: opset {opset}, {info['nodes']} nodes, ORT max|diff| {info['ort_max_abs_diff']:.3g}, "
              f"input {info['input_name']}{info['input_dims']} output {info['output_name']}{info['output_dims']}")
        print(f"    ops: {ops[fname]}")
        print(f"    initializers: {[i.name for i in onnx_model.graph.initializer]}")
        if any(k != v for k, v in mapping.items()):
            print(f"    onnx name -> parameter: { {k: v for k, v in mapping.items() if k != v} }")
        for k, v in aliases.items():
            print(f"    Identity alias: {k} <- {v}")
        for k, v in shared.items():
            print(f"    initializer {k} stands for {v['params']} ({v['how']})")
        for k, v in others.items():
            print(f"    other initializer: {k} {v}")
        for s in mnotes:
            print(f"    note: {s}")

    for fname, opset in (opts.get("extra", []) if want_dynamo else []):
        path = os.path.join(out_dir, fname)
        export_dynamo(copy.deepcopy(model), x, path, opset)
        onnx_model, info = check_file(path, model, x, extra)
        ops[fname] = op_counts(onnx_model)
        # The optimizer merges initializers of equal values (a fresh GroupNorm's γ = 1, β = 0):
        # a named parameter's initializer then stands for the equal parameters left unnamed.
        inits = {i.name: numpy_helper.to_array(i) for i in onnx_model.graph.initializer}
        params = {k: v.detach().numpy() for k, v in model.named_parameters()}
        shared = {}
        for iname, arr in inits.items():
            if iname not in params:
                continue
            hits = [k for k, v in params.items() if k not in inits and v.shape == arr.shape
                    and np.array_equal(v, arr)]
            if hits:
                shared[iname] = {"params": [iname] + hits,
                                 "how": "merged (equal values) by the exporter's optimizer"}
        missing = sorted(set(params) - set(inits) - {p for v in shared.values() for p in v["params"]})
        if missing:
            raise SystemExit(f"{path}: parameters with no initializer: {missing}")
        files[fname] = {"exists": True, "exporter": "dynamo (torch.export)", "opset": opset,
                        "shared_initializers": shared, **info}
        print(f"  {fname}: opset {opset}, {info['nodes']} nodes, ORT max|diff| {info['ort_max_abs_diff']:.3g}")
        print(f"    ops: {ops[fname]}")
        for k, v in shared.items():
            print(f"    initializer {k} stands for {v['params']} ({v['how']})")

    # Grads are keyed by the legacy file's ONNX value names: the initializer names, or for a
    # deduplicated parameter the output of its Identity node; both are the PyTorch names here.
    legacy = files[f"{name}.onnx"]
    param_to_onnx = {p: o for o, p in legacy["onnx_to_param"].items()}

    m = copy.deepcopy(model)
    if opts["train_mode"]:
        m.train()
        for mod in m.modules():
            if isinstance(mod, nn.Dropout):
                mod.eval()
        notes.append("oracle in train mode: BatchNorm normalises by the batch's statistics "
                     "(biased variance); Dropout in eval mode (an identity)")
    logits = m(x)
    loss = F.cross_entropy(logits, y)  # mean over the batch
    loss.backward()
    unnamed = [p for p, _ in m.named_parameters() if p not in param_to_onnx]
    if unnamed:
        raise SystemExit(f"{name}.onnx: parameters with no ONNX name: {unnamed}")
    grads = {param_to_onnx[p]: tensor_json(t.grad) for p, t in m.named_parameters()}
    pgrad = {p: t.grad for p, t in m.named_parameters()}
    for f in files.values():  # what a loader that trains a shared initializer as one tensor gets
        for init, v in f.get("shared_initializers", {}).items():
            shape = v.get("shape", list(pgrad[v["params"][0]].shape))
            v["tied_grad"] = tensor_json(sum(pgrad[p] for p in v["params"]).reshape(shape))
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.0, weight_decay=0.0)
    opt.step()
    with torch.no_grad():
        after = m(x)
        after_loss = F.cross_entropy(after, y)

    if name == "resnet_gn":
        notes.append("GroupNorm weight/bias are freshly initialised (gamma = 1, beta = 0) on purpose: "
                     "a parser that simplifies Mul-by-one / Add-zero drops them; they are still trainable "
                     "parameters with non-zero gradients (see grads).")
    for p, t in model.named_parameters():
        if t.requires_grad and float(t.detach().abs().max()) == 0.0:
            notes.append(f"parameter {p} is all zeros at export")

    return {
        "model": name,
        "description": desc,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__,
                     "numpy": np.__version__},
        "seeds": {"model": seed, "input": 100 + seed},
        "train_mode": opts["train_mode"],
        "files": files,
        "ops": ops,
        "notes": notes,
        "input": tensor_json(x),
        "labels": LABELS,
        "output": tensor_json(logits),
        "loss": f32_list(loss.reshape(1))[0],
        "grads_note": "PyTorch semantics: one gradient per parameter, keyed by its ONNX value name in "
                      f"{name}.onnx (an initializer, or an Identity output where the exporter deduplicated "
                      "equal initializers); files.*.shared_initializers.*.tied_grad is the gradient of a "
                      "shared initializer trained as one tensor (the sum over the parameters it stands for).",
        "grads": grads,
        "sgd_lr": LR,
        "after_step_output": tensor_json(after),
        "after_step_loss": f32_list(after_loss.reshape(1))[0],
    }


def check_after_step(path, fixture):
    """Apply the fixture's grads to the ONNX file itself (untying Identity aliases) and check that
    onnxruntime reproduces after_step_output: the grads are keyed and shaped as the file names them."""
    model = onnx.load(path)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    orig = {k: numpy_helper.to_array(v) for k, v in inits.items()}
    for name, gr in fixture["grads"].items():
        grad = np.array(gr["data"], dtype=np.float32).reshape(gr["shape"])
        if name in inits:
            arr = orig[name]
            inits[name].CopyFrom(numpy_helper.from_array((arr - np.float32(LR) * grad).astype(np.float32), name))
        else:  # an Identity output: give the parameter its own initializer
            node = next(n for n in g.node if n.op_type == "Identity" and n.output[0] == name)
            arr = orig[node.input[0]]
            g.node.remove(node)
            g.initializer.append(numpy_helper.from_array((arr - np.float32(LR) * grad).astype(np.float32), name))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.array(fixture["input"]["data"], dtype=np.float32).reshape(fixture["input"]["shape"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    want = np.array(fixture["after_step_output"]["data"], dtype=np.float32).reshape(got.shape)
    d = float(np.max(np.abs(got - want)))
    assert d < TOL, f"{path}: after one SGD step onnxruntime differs by {d}"
    return d


def dump(obj, indent=0):
    """JSON with structure indented but number lists on one line (keeps diffs and sizes sane)."""
    pad, pad1 = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad1}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(pad1 + dump(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, separators=(",", ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "onnx"))
    ap.add_argument("--no-dynamo", action="store_true", help="write only the opset-13 files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {ort.__version__}, "
          f"numpy {np.__version__}; writing {args.out}")
    written = []
    for name, cls, seed, shape, desc in MODELS:
        print(f"{name}:")
        fixture = run_model(name, cls, seed, shape, desc, args.out, not args.no_dynamo)
        path = os.path.join(args.out, f"{name}.json")
        with open(path, "w") as f:
            f.write(dump(fixture) + "\n")
        print(f"  loss {fixture['loss']!r}, after one SGD step {fixture['after_step_loss']!r}")
        for fname, f in fixture["files"].items():
            # a folded, merged initializer cannot hold the untied step; Identity aliases are untied
            # a train-mode oracle (batch statistics) is not what onnxruntime computes
            if fixture["train_mode"]:
                continue
            if f["exists"] and all(v["how"] == "Identity aliases" for v in f["shared_initializers"].values()):
                d = check_after_step(os.path.join(args.out, fname), fixture)
                print(f"  {fname}: grads applied in the ONNX graph reproduce after_step_output (max|diff| {d:.3g})")
        written += [os.path.join(args.out, k) for k, v in fixture["files"].items() if v["exists"]] + [path]
    print("sizes:")
    for p in written:
        print(f"  {os.path.getsize(p):>9} {os.path.relpath(p, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
