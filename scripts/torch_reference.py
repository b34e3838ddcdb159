#!/usr/bin/env python3
"""PyTorch reference throughput for `fedshard bench train`: the same networks, the same
recipe (SGD, momentum 0.9, weight decay 1e-4 except the MLP), the same batch sizes, one
thread, CPU (or `--device cuda`, beside `fedshard bench train --device cuda`). Prints one JSON
line per (model, batch) in samples per second of training steps (forward, backward, optimiser
step), measured after a warm-up, over the whole time and over its fastest pass (up to 20
batches; on a busy machine the figure its neighbours disturb least). The GPU-scale models are
opt-in: `--runs resnet18:8,cct:8`; `--params` prints the parameter counts of the models in
`--runs` instead.

Not part of the build or the tests: run it in a throwaway venv outside the repository,

    python3 -m venv ../torchref && ../torchref/bin/pip install torch numpy scikit-learn
    ../torchref/bin/python scripts/torch_reference.py --seconds 5

and compare with `fedshard bench train --model M --batch B` run right after it on the same
machine (docs/performance.md records both).

`--round` measures a whole federated round instead, the way a Flower or pfl-research simulation
worker runs one: `--clients` clients trained one after another in this one process, each
starting from the same global model (its state dict copied into the client's network), each on
its own `--samples` random rows (drawn as `setup()` draws them, fixed seed), with a fresh SGD
optimiser (lr 0.05, momentum 0.5, the model's own weight decay), `--epochs` epochs shuffled
afresh each epoch at batch `--batch` (the last partial batch included), cross-entropy loss; no
aggregation, as `fedshard bench round` has none. One warm-up round is
not timed; each of the `--repeats` timed rounds prints one JSON line with its seconds and
samples per second (clients × samples × epochs / seconds):

    ../torchref/bin/python scripts/torch_reference.py --round --model resnet18 \
        --clients 10 --samples 500 --batch 8 [--epochs 2] [--device cuda] [--repeats 2]

compared with `fedshard bench round --model M --clients C --batch B --samples N
[--device cuda] [--cohorts on|off]` run right after it on the same machine.
"""

import argparse
import copy
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
    """A pre-norm GPT-2 / CCT block (training/src/models/blocks.rs, `TransformerBlock`)."""

    def __init__(self, d, heads, hidden=None, causal=True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, hidden or 4 * d)
        self.proj = nn.Linear(hidden or 4 * d, d)

    def forward(self, x):
        n, t, d = x.shape
        h = self.ln1(x)
        split = lambda y: y.view(n, t, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(
            split(self.q(h)), split(self.k(h)), split(self.v(h)), is_causal=self.causal
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


def conv_norm(c_in, c_out, kernel, stride):
    """A bias-free "same" convolution and its 2-group GroupNorm (resnet.rs `conv_norm`)."""
    conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False)
    return nn.Sequential(conv, nn.GroupNorm(2, c_out))


class BasicBlock(nn.Module):
    """A ResNet basic block (training/src/models/resnet.rs, `BasicBlock`)."""

    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = conv_norm(c_in, c_out, 3, stride)
        self.conv2 = conv_norm(c_out, c_out, 3, 1)
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = conv_norm(c_in, c_out, 1, stride)

    def forward(self, x):
        h = self.conv2(F.relu(self.conv1(x)))
        return F.relu(h + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(nn.Module):
    """fedshard's `resnet18` (training/src/models/resnet.rs): 3×3 stem, no max-pool, GroupNorm."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = conv_norm(3, 64, 3, 1)
        blocks, c_in = [], 64
        for stage, c_out in enumerate([64, 128, 256, 512]):
            for i in range(2):
                blocks.append(BasicBlock(c_in, c_out, 2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        h = self.blocks(F.relu(self.stem(x.view(-1, 3, 32, 32))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class Cct(nn.Module):
    """fedshard's `cct` (training/src/models/cct.rs): CCT-6/3x2, width 256, 4 heads, MLP ×2."""

    def __init__(self, classes=10, width=256, heads=4, blocks=6, tokens=64):
        super().__init__()
        self.tokenizer0 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.tokenizer1 = nn.Conv2d(64, width, 3, 1, 1, bias=False)
        self.positions = nn.Parameter(torch.randn(tokens, width) * 0.02)
        self.blocks = nn.ModuleList(
            Block(width, heads, 2 * width, causal=False) for _ in range(blocks)
        )
        self.ln = nn.LayerNorm(width)
        self.pool = nn.Linear(width, 1)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        pool = lambda y: F.max_pool2d(F.relu(y), 3, 2, 1)
        h = pool(self.tokenizer1(pool(self.tokenizer0(x.view(-1, 3, 32, 32)))))
        h = h.flatten(2).transpose(1, 2) + self.positions
        for block in self.blocks:
            h = block(h)
        h = self.ln(h)
        # Sequence pooling: a softmax over the tokens weights their mean.
        attention = F.softmax(self.pool(h), dim=1)
        return self.fc((attention.transpose(1, 2) @ h).flatten(1))


def setup(model):
    """The network, inputs, targets and weight decay of one benchmark model."""
    if model == "char-transformer":
        x = torch.randint(0, 81, (200, 81))
        return CharTransformer(), x[:, :80], x[:, 1:].reshape(200, 80), 1e-4, True
    if model in ("resnet18", "cct"):
        # bench_train.rs `images`: 64 synthetic rows of 3×32×32 uniform [0, 1), labels i % 10
        # (not CIFAR), drawn here from torch's seeded generator instead of fedshard's stream.
        x, y = torch.rand(64, 3072), torch.arange(64) % 10
        return (ResNet18() if model == "resnet18" else Cct()), x, y, 1e-4, False
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
    samples, shortest, started = 0, float("inf"), time.perf_counter()
    while time.perf_counter() - started < seconds:
        pass_started = time.perf_counter()
        samples += one_pass()
        shortest = min(shortest, time.perf_counter() - pass_started)
    # The fastest pass as a rate too, as `fedshard bench train` prints it: on a machine whose
    # neighbours come and go, the figure they disturb least.
    return samples / (time.perf_counter() - started), steps_per_pass * batch / shortest


def client_data(model, x, y, samples, generator):
    """One client's `samples` rows, drawn as `setup()` draws its inputs: fresh uniform images
    for resnet18 and cct, fresh random characters for the char-transformer, and rows of the
    digits (`x`, `y`, from setup()) picked at random for the digits models."""
    if model == "char-transformer":
        text = torch.randint(0, 81, (samples, 81), generator=generator)
        return text[:, :80], text[:, 1:]
    if model in ("resnet18", "cct"):
        images = torch.rand(samples, 3072, generator=generator)
        return images, torch.randint(0, 10, (samples,), generator=generator)
    rows = torch.randint(0, len(x), (samples,), generator=generator)
    return x[rows], y[rows]


def round_seconds(model, clients, samples, batch, epochs, repeats, device):
    """The wall-clock seconds of each of `repeats` federated rounds, after one warm-up round."""
    torch.manual_seed(0)
    net, x, y, decay, per_position = setup(model)
    # The global model, and the one network every client trains in turn (a simulation worker
    # keeps one model and overwrites its weights for each client it hosts).
    global_net = net.to(device)
    client_net = copy.deepcopy(global_net)
    # Every client's rows, made once up front and kept on the device: data loading is not
    # what the round measures.
    generator = torch.Generator().manual_seed(1)
    data = []
    for _ in range(clients):
        cx, cy = client_data(model, x, y, samples, generator)
        data.append((cx.to(device), cy.to(device)))
    shuffle = torch.Generator().manual_seed(2)
    # CUDA runs asynchronously: a round is timed only once its kernels have finished.
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def one_round():
        for cx, cy in data:
            # Each client starts from the global model, with a fresh optimiser.
            client_net.load_state_dict(global_net.state_dict())
            opt = torch.optim.SGD(
                client_net.parameters(), lr=0.05, momentum=0.5, weight_decay=decay
            )
            for _ in range(epochs):
                order = torch.randperm(samples, generator=shuffle).to(device)
                for start in range(0, samples, batch):
                    rows = order[start : start + batch]
                    logits = client_net(cx[rows])
                    target = cy[rows].reshape(-1) if per_position else cy[rows]
                    loss = F.cross_entropy(logits, target)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()

    one_round()
    sync()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        one_round()
        sync()
        timings.append(time.perf_counter() - started)
    return timings


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--runs",
        default="digits-mlp:32,digits-cnn:32,digits-cnn:8,digits-cnn:1,char-transformer:10",
        help="comma-separated model:batch pairs (also resnet18:8, cct:8)",
    )
    parser.add_argument("--params", action="store_true", help="print parameter counts, exit")
    # The round mode (see the module docstring); --seconds and --runs do not apply to it.
    parser.add_argument("--round", action="store_true", help="time whole federated rounds")
    parser.add_argument(
        "--model", choices=["digits-mlp", "digits-cnn", "char-transformer", "resnet18", "cct"]
    )
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--samples", type=int, default=500, help="rows per client")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.round:
        if args.model is None:
            parser.error("--round needs --model")
        timings = round_seconds(
            args.model,
            args.clients,
            args.samples,
            args.batch,
            args.epochs,
            args.repeats,
            args.device,
        )
        for seconds in timings:
            record = {
                "mode": "round",
                "model": args.model,
                "device": args.device,
                "clients": args.clients,
                "samples": args.samples,
                "batch": args.batch,
                "epochs": args.epochs,
                "threads": args.threads,
                "seconds": round(seconds, 4),
                "samples_per_s": round(args.clients * args.samples * args.epochs / seconds, 1),
                "torch": torch.__version__,
            }
            print(json.dumps(record), flush=True)
        return
    if args.params:
        for model in dict.fromkeys(run.split(":")[0] for run in args.runs.split(",")):
            count = sum(p.numel() for p in setup(model)[0].parameters())
            print(json.dumps({"model": model, "parameters": count}), flush=True)
        return
    for run in args.runs.split(","):
        model, batch = run.split(":")
        samples, fastest = rate(model, int(batch), args.seconds, args.device)
        print(
            json.dumps(
                {
                    "model": model,
                    "batch": int(batch),
                    "threads": args.threads,
                    "device": args.device,
                    "torch": torch.__version__,
                    "samples_per_second": round(samples, 1),
                    "fastest_pass_samples_per_second": round(fastest, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
