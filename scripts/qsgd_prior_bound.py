#!/usr/bin/env python3
"""How far any QSGD-KLMS prior can take `config/klms-mnist-qsgd.toml`: a numpy simulation.

QSGD-KLMS sends a sample of each client's QSGD distribution `q_k` (s = 1, one norm for the
whole update: `q_kj(±1) = |v_kj| / ‖v_k‖` on the side of `v_kj`'s sign) in about
`KL(q_k ‖ p)` bits, where `p` is a prior over `{−1, 0, +1}` per value that the server and the
client share. This script replays the federation of the shipped config (the 10 000 MNIST
digits that `fedshard data mnist` caches, 8 000 train, 10 clients with Dirichlet(0.5) label
skew, softmax regression, 2 epochs of SGD with momentum 0.9 at learning rate 0.05 and batch
32, every client every round, the model moved by the mean of the clients' exact QSGD samples)
and measures, per client and round, the KL of `q_k` against:

- `shipped`: fedshard's prior, `(n_j(s) + β f_t(s)) / (n_j + β)` with β = 100 over last
  round's decoded symbols (`protocol/src/uplink/qsgd.rs`);
- `history`: the best mixture found of that prior with the client's own earlier decoded
  symbols (an exponential average, weight 0.1, γ = 0.8) and all clients' last-round symbols
  (weight 0.003 each): side information the server also has;
- `round-mean`: the mean of this round's `q_k` over the clients. For a product prior shared
  by the clients of a round, the mean KL `(1/C) Σ_k KL(q_k ‖ p)` is smallest at exactly this
  `p`, so no broadcast prior, whatever history it is built from, can go below this line. The
  server cannot build it (it needs every `q_k` before any is sent);
- `own-previous-q`: `0.7 q_k(t−1) + 0.3 f_t`, the client's own previous distribution: per-client
  side information that would beat the bound, but only the client has it (the server sees one
  sample of it).

It also counts the bits of Elias-coded QSGD (`qsgd-elias`, `protocol/src/uplink/wire.rs`: a
32-bit norm, Elias gamma of the non-zero count plus one, each gap and a sign bit) for the same
samples, and prints, for each prior, the most a coder that spent exactly the KL plus the 32-bit
norm could save against it. This is a simulation of the config, not fedshard's run: the
partition and the training order differ, so compare its figures with docs/klms.md's measured
ones in kind, not to the bit.

Not part of the build or the tests. Needs numpy (`python3 -m venv ../np && ../np/bin/pip
install numpy`) and the cached digits (`fedshard data mnist`):

    ../np/bin/python scripts/qsgd_prior_bound.py [--seeds 3] [--rounds 30] [--from-round 5]

Prints one JSON line per seed and one for the mean over seeds.
"""

import argparse
import json
import os

import numpy as np

PIXELS, CLASSES = 784, 10
D = PIXELS * CLASSES + CLASSES
TENSORS = [slice(0, PIXELS * CLASSES), slice(PIXELS * CLASSES, D)]


def load_mnist():
    root = os.path.join(os.path.expanduser("~"), ".cache", "fedshard", "mnist")
    xs, ys = [], []
    for label in range(CLASSES):
        path = os.path.join(root, f"{label}.json")
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: run `fedshard data mnist` first")
        with open(path) as f:
            x = np.array(json.load(f)["data"], dtype=np.float32).reshape(-1, PIXELS)
        xs.append(x)
        ys.append(np.full(len(x), label))
    return np.concatenate(xs), np.concatenate(ys)


def dirichlet_split(labels, clients, alpha, rng):
    parts = [[] for _ in range(clients)]
    for label in range(CLASSES):
        ids = np.flatnonzero(labels == label)
        cuts = (np.cumsum(rng.dirichlet([alpha] * clients)) * len(ids)).astype(int)[:-1]
        for c, part in enumerate(np.split(ids, cuts)):
            parts[c] += list(part)
    return [np.array(p) for p in parts]


def gradient(w, x, y):
    z = x @ w[: PIXELS * CLASSES].reshape(PIXELS, CLASSES) + w[PIXELS * CLASSES :]
    z -= z.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return np.concatenate([(x.T @ p).ravel(), p.sum(0)])


def local_update(w, x, y, ids, rng, epochs=2, lr=0.05, batch=32, momentum=0.9):
    start, w, m, ids = w, w.copy(), np.zeros_like(w), ids.copy()
    for _ in range(epochs):
        rng.shuffle(ids)
        for at in range(0, len(ids), batch):
            b = ids[at : at + batch]
            m = momentum * m + gradient(w, x[b], y[b])
            w -= lr * m
    return w - start


def qsgd_distribution(v):
    a = np.abs(v) / np.linalg.norm(v)
    q = np.zeros((len(v), 3))
    q[:, 0] = np.where(v < 0, a, 0.0)
    q[:, 2] = np.where(v > 0, a, 0.0)
    q[:, 1] = 1.0 - q[:, 0] - q[:, 2]
    return q


def kl_bits(q, p):
    m = q > 0
    return float((q[m] * np.log2(q[m] / p[m])).sum())


def gamma_bits(x):
    return 2 * int(np.floor(np.log2(x))) + 1


def elias_bits(symbols):
    nonzero = np.flatnonzero(symbols)
    gaps = np.diff(np.concatenate([[-1], nonzero]))
    return 32 + gamma_bits(len(nonzero) + 1) + sum(gamma_bits(g) + 1 for g in gaps)


def tensor_frequencies(counts):
    f = np.zeros((D, 3))
    for t in TENSORS:
        n = counts[t].sum(0)
        f[t] = (n + 1) / (n.sum() + 3)
    return f


def simulate(seed, rounds, from_round, clients=10, beta=100.0):
    rng = np.random.default_rng(seed)
    x, y = load_mnist()
    order = rng.permutation(len(x))
    x, y = x[order][:8000], y[order][:8000]
    parts = dirichlet_split(y, clients, 0.5, rng)
    w = np.zeros(D)
    counts = previous_q = None
    own = [np.zeros((D, 3)) for _ in range(clients)]
    own_weight = np.zeros(clients)
    rows = {k: [] for k in ["shipped", "history", "round-mean", "own-previous-q"]}
    elias = []
    for t in range(rounds):
        updates = [local_update(w, x, y, parts[c], rng) for c in range(clients)]
        qs = [qsgd_distribution(v) for v in updates]
        symbols = []
        for q in qs:
            u = rng.random(D)
            symbols.append(np.where(u < q[:, 0], -1, np.where(u < q[:, 0] + q[:, 2], 1, 0)))
        if counts is not None and t >= from_round:
            f = tensor_frequencies(counts)
            shipped = (counts + beta * f) / (counts.sum(1, keepdims=True) + beta)
            mean_q = np.mean(qs, 0)
            for c, q in enumerate(qs):
                mine = own[c] / max(own_weight[c], 1e-12)
                history = 0.1 * mine + 0.003 * counts + (1 - 0.1 - 0.003 * clients) * f
                history[:, 1] = 1 - history[:, 0] - history[:, 2]
                rows["shipped"].append(kl_bits(q, shipped))
                rows["history"].append(kl_bits(q, history))
                rows["round-mean"].append(kl_bits(q, mean_q))
                rows["own-previous-q"].append(kl_bits(q, 0.7 * previous_q[c] + 0.3 * f))
            elias += [elias_bits(s) for s in symbols]
        counts = np.zeros((D, 3))
        for c, s in enumerate(symbols):
            one_hot = np.zeros((D, 3))
            one_hot[np.arange(D), s + 1] = 1
            counts += one_hot
            own[c] = 0.8 * own[c] + one_hot
            own_weight[c] = 0.8 * own_weight[c] + 1
        previous_q = qs
        w = w + np.mean([np.linalg.norm(v) * s for v, s in zip(updates, symbols)], 0)
    elias_mean = float(np.mean(elias))
    kl = {k: float(np.mean(v)) for k, v in rows.items()}
    return {
        "seed": seed,
        "elias_bits": elias_mean,
        "kl_bits": kl,
        "ceiling_vs_elias": {k: elias_mean / (v + 32) for k, v in kl.items()},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--from-round", type=int, default=5)
    args = parser.parse_args()
    results = [simulate(s, args.rounds, args.from_round) for s in range(1, args.seeds + 1)]
    for r in results:
        print(json.dumps(r))
    mean = lambda key: {k: float(np.mean([r[key][k] for r in results])) for k in results[0][key]}
    print(json.dumps({
        "seeds": args.seeds,
        "elias_bits": float(np.mean([r["elias_bits"] for r in results])),
        "kl_bits": mean("kl_bits"),
        "ceiling_vs_elias": mean("ceiling_vs_elias"),
    }))


if __name__ == "__main__":
    main()
