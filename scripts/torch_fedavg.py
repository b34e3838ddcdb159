#!/usr/bin/env python3
"""The main job as a plain PyTorch FedAvg loop: what a user would write instead of fedshard.

The federation of `config/digits-cnn.toml` with every client training the dense model (as
`fedshard run` does with `keep_ratios` left at its default of 1.0): the 1 797 8x8 digits
(scikit-learn's copy of the set fedshard embeds), 20% held out stratified by class, the rest
split over 20 clients with Dirichlet(1.0) label skew and lognormal(0.5) sizes (at least 20
samples each); 40 rounds of 10 clients drawn uniformly, each training 2 epochs of SGD
(learning rate 0.05, momentum 0.5 fresh every round, weight decay 1e-4) at batch 8 from the
global model; FedAvg weighted by sample counts; the test accuracy evaluated after every
round, as fedshard does. The clients train one after another in this process (one thread by
default), the way a Flower simulation on one core would run them, without its overhead.

Not part of the build or the tests: run it in a throwaway venv outside the repository,

    python3 -m venv ../torchref && ../torchref/bin/pip install torch numpy scikit-learn
    ../torchref/bin/python scripts/torch_fedavg.py

and compare with `fedshard bench job` on a dense copy of the config (docs/performance.md,
"The main job against a PyTorch FedAvg loop", gives the commands). Prints one JSON line.
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from torch_reference import DigitsCnn


def partition(labels, clients, alpha, size_sigma, min_samples, rng):
    """Client index lists: lognormal sizes, then each client's labels by Dirichlet(alpha)."""
    classes = np.unique(labels)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    sizes = rng.lognormal(0.0, size_sigma, clients)
    sizes = np.maximum(min_samples, np.floor(sizes / sizes.sum() * len(labels))).astype(int)
    parts = []
    for size in sizes:
        mix = rng.dirichlet(np.full(len(classes), alpha))
        want = rng.multinomial(size, mix)
        part = []
        for c, n in zip(classes, want):
            take = min(n, len(pools[c]))
            part += [pools[c].pop() for _ in range(take)]
        # A class that ran dry is made up from whatever is left, so sizes hold.
        while len(part) < size and any(pools.values()):
            c = max(pools, key=lambda k: len(pools[k]))
            part.append(pools[c].pop())
        parts.append(np.array(part))
    return parts


def federation_data(rng, partition_file=None):
    """The digits as tensors (features scaled to [0, 1]), each client's row indices and the
    test rows: the script's own draws from `rng` (20% held out stratified by class, the rest
    split by `partition`), or those of `partition_file`, the output of `fedshard data partition`
    (to train on fedshard's exact partition and test split)."""
    digits = load_digits()
    x_all = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y_all = torch.tensor(digits.target, dtype=torch.long)
    test = np.concatenate(
        [
            rng.permutation(np.flatnonzero(digits.target == c))[
                : round(0.2 * np.sum(digits.target == c))
            ]
            for c in range(10)
        ]
    )
    train = np.setdiff1d(np.arange(len(y_all)), test)
    parts = [train[p] for p in partition(digits.target[train], 20, 1.0, 0.5, 20, rng)]
    if partition_file:
        with open(partition_file) as f:
            given = json.load(f)
        parts = [np.array(p) for p in given["clients"]]
        test = np.array(given["test"])
    return x_all, y_all, parts, test


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    # `he`: fedshard's initialisation (weights U(±√(6/fan_in)), biases U(±1/√fan_in)) instead of
    # PyTorch's default (weights U(±1/√fan_in)): to tell the initialisation's share of the two
    # programs' accuracy gap (docs/performance.md).
    parser.add_argument("--init", choices=["torch", "he"], default="torch")
    # `weights`: weight decay on the conv and linear weights only, as fedshard's Frobenius decay,
    # instead of on every parameter (biases and norm scales too).
    parser.add_argument("--decay", choices=["all", "weights"], default="all")
    # The output of `fedshard data partition config/digits-cnn-dense.toml --seed S` (the digit
    # rows of each client and of the test set): train on fedshard's partition and test split
    # instead of the script's own draws, to compare the two programs on the same data.
    parser.add_argument("--partition", metavar="FILE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    x_all, y_all, parts, test = federation_data(rng, args.partition)

    started = time.perf_counter()
    model = DigitsCnn()
    if args.init == "he":
        with torch.no_grad():
            for layer in model.modules():
                if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
                    fan_in = layer.weight[0].numel()
                    layer.weight.uniform_(-((6.0 / fan_in) ** 0.5), (6.0 / fan_in) ** 0.5)
    train_seconds = 0.0
    for _ in range(args.rounds):
        chosen = rng.choice(len(parts), 10, replace=False)
        global_state = {k: v.clone() for k, v in model.state_dict().items()}
        total, summed = 0, None
        t0 = time.perf_counter()
        for c in chosen:
            model.load_state_dict(global_state)
            if args.decay == "all":
                groups = [{"params": list(model.parameters()), "weight_decay": 1e-4}]
            else:
                weights = [
                    m.weight
                    for m in model.modules()
                    if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
                ]
                others = [p for p in model.parameters() if all(p is not w for w in weights)]
                groups = [
                    {"params": weights, "weight_decay": 1e-4},
                    {"params": others, "weight_decay": 0.0},
                ]
            opt = torch.optim.SGD(groups, lr=0.05, momentum=0.5)
            idx = parts[c]
            for _ in range(2):
                order = idx[rng.permutation(len(idx))]
                for s in range(0, len(order), 8):
                    rows = order[s : s + 8]
                    loss = F.cross_entropy(model(x_all[rows]), y_all[rows])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            weight = len(idx)
            state = model.state_dict()
            if summed is None:
                summed = {k: v.detach().clone() * weight for k, v in state.items()}
            else:
                for k, v in state.items():
                    summed[k] += v.detach() * weight
            total += weight
        train_seconds += time.perf_counter() - t0
        model.load_state_dict({k: v / total for k, v in summed.items()})
        with torch.no_grad():
            accuracy = (model(x_all[test]).argmax(1) == y_all[test]).float().mean().item()
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "job": "digits-cnn dense FedAvg",
                "rounds": args.rounds,
                "threads": args.threads,
                "torch": torch.__version__,
                "wall_s": round(wall, 2),
                "train_s": round(train_seconds, 2),
                "final_accuracy": round(accuracy, 4),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
