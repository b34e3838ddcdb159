#!/usr/bin/env python3
"""PyTorch reference throughput for `fedshard bench train`: the same networks, the same
recipe (SGD, momentum 0.9, weight decay 1e-4 except the MLP), the same batch sizes, one
thread, CPU (or `--device cuda`, beside `fedshard bench train --device cuda`). Prints one JSON line per (model, batch) in samples per second of training
steps (forward, backward, optimiser step), measured after a warm-up.

Not part of the build or the tests: run it in a throwaway venv outside the repository,

    python3 -m venv ../torchref && ../torchref/bin/pip install torch numpy scikit-learn
    ../torchref/bin/python scripts/torch_reference.py --seconds 5

and compare with `fedshard bench train --model M --batch B` run right after it on the same
machine (docs/performance.md records both).
"""

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class DigitsCnn(nn.Module):
    """fedshard's `digits-cnn` (training/src/models/cnn.rs), dense."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 16, 3, padding=1)
        self.norm0 = nn.GroupNorm(2, 16)
        self.conv1 = nn.Conv2d(16, 32, 3, padding=1)
        self.norm1 = nn.GroupNorm(2, 32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.norm2 = nn.GroupNorm(2, 64)
        self.fc0 = nn.Linear(256, 128)
        self.norm3 = nn.LayerNorm(128)
        self.fc1 = nn.Linear(128, classes)

    def forward(self, x):
        h = x.view(-1, 1, 8, 8)
        h = F.relu(self.norm0(self.conv0(h)))
        h = F.relu(self.norm1(self.conv1(h)))
        h = F.max_pool2d(h, 2)
        h = F.relu(self.norm2(self.conv2(h)))
        h = F.avg_pool2d(h, 2)
        h = F.relu(self.norm3(self.fc0(h.flatten(1))))
        return self.fc1(h)


class Block(nn.Module):
    """A pre-norm GPT-2 block (training/src/models/blocks.rs)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        n, t, d = x.shape
        h = self.ln1(x)
        split = lambda y: y.view(n, t, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(
            split(self.q(h)), split(self.k(h)), split(self.v(h)), is_causal=True
        )
        x = x + self.o(a.transpose(1, 2).reshape(n, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class CharTransformer(nn.Module):
    """fedshard's `char-transformer`: vocab 81, context 80, d 128, 4 heads, 3 blocks."""

    def __init__(self, vocab=81, context=80, d=128, heads=4, blocks=3):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Parameter(torch.randn(context, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(blocks))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        h = self.tokens(x) + self.positions[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h)).flatten(0, 1)


def setup(model):
    """The network, inputs, targets and weight decay of one benchmark model."""
    if model == "char-transformer":
        x = torch.randint(0, 81, (200, 81))
        return CharTransformer(), x[:, :80], x[:, 1:].reshape(200, 80), 1e-4, True
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    if model == "digits-mlp":
        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        return net, x, y, 0.0, False
    return DigitsCnn(), x, y, 1e-4, False


def rate(model, batch, seconds, device):
    torch.manual_seed(0)
    net, x, y, decay, per_position = setup(model)
    net, x, y = net.to(device), x.to(device), y.to(device)
    # CUDA runs asynchronously: a pass is timed only once its kernels have finished.
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=decay)
    steps_per_pass = max(1, min(len(x), batch * 20) // batch)

    def one_pass():
        for s in range(steps_per_pass):
            rows = slice(s * batch, (s + 1) * batch)
            logits = net(x[rows])
            target = y[rows].reshape(-1) if per_position else y[rows]
            loss = F.cross_entropy(logits, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync()
        return steps_per_pass * batch

    one_pass()
    samples, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        samples += one_pass()
    return samples / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--runs",
        default="digits-mlp:32,digits-cnn:32,digits-cnn:8,digits-cnn:1,char-transformer:10",
        help="comma-separated model:batch pairs",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for run in args.runs.split(","):
        model, batch = run.split(":")
        samples = rate(model, int(batch), args.seconds, args.device)
        print(
            json.dumps(
                {
                    "model": model,
                    "batch": int(batch),
                    "threads": args.threads,
                    "device": args.device,
                    "torch": torch.__version__,
                    "samples_per_second": round(samples, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
