#!/usr/bin/env python3
"""Reference values for fedshard's robust aggregators (strategies/src/aggregation/robust/
tests.rs): Flower 1.42's own `aggregate_median`, `aggregate_trimmed_avg`, `aggregate_krum` and
`aggregate_bulyan` (flwr/server/strategy/aggregate.py) run on fixed, seeded inputs.

Not part of the build or the tests: run it in a venv with flwr,

    python3 -m venv ../ref && ../ref/bin/pip install flwr==1.42.0
    ../ref/bin/python scripts/flower_robust.py

Each case is a global model W of two tensors (3 values and 2×2) and the changes ΔW_c of n
clients, with their sample counts; Flower gets the weights w_c = W + ΔW_c in float64 (W holds
values exact in f32, as fedshard's model does), and its output is printed next to the call.
The Rust tests hard-code the printed inputs and outputs (repr: shortest round trip, so a Rust
literal parses to the same f64) and compare within 1e-6. Every number is printed in full, so a
reader can check one by hand.
"""

import numpy as np
from flwr.server.strategy.aggregate import (
    aggregate_bulyan,
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)

SHAPES = [(3,), (2, 2)]


def rust(name, values):
    """A Rust constant: one flat f64 array (the two tensors concatenated, row-major)."""
    body = ", ".join(repr(float(v)) for v in values)
    return f"const {name}: [f64; {len(values)}] = [{body}];"


def flat(ndarrays):
    return np.concatenate([a.ravel() for a in ndarrays])


def tensors(vector):
    out, start = [], 0
    for shape in SHAPES:
        size = int(np.prod(shape))
        out.append(np.asarray(vector[start : start + size], dtype=np.float64).reshape(shape))
        start += size
    return out


def inputs(seed, n, outlier):
    """W exact in f32 (multiples of 1/8); ΔW_c ~ N(0, 0.5²) per value, client `outlier` +40
    on every value (a Byzantine update); sample counts 5..45."""
    rng = np.random.RandomState(seed)
    w = np.round(rng.uniform(-2.0, 2.0, size=7) * 8.0) / 8.0
    changes = rng.normal(0.0, 0.5, size=(n, 7))
    if outlier is not None:
        changes[outlier] += 40.0
    samples = [int(s) for s in rng.randint(5, 46, size=n)]
    return w, changes, samples


def results_of(w, changes, samples):
    return [(tensors(w + c), s) for c, s in zip(changes, samples)]


def case(label, seed, n, outlier):
    w, changes, samples = inputs(seed, n, outlier)
    print(f"// case {label}: seed {seed}, {n} clients, outlier {outlier}")
    print(rust(f"{label}_GLOBAL", w))
    print(f"const {label}_SAMPLES: [f64; {n}] = [{', '.join(f'{s}.0' for s in samples)}];")
    print(f"const {label}_CHANGES: [[f64; 7]; {n}] = [")
    for c in changes:
        print("    [" + ", ".join(repr(float(v)) for v in c) + "],")
    print("];")
    run = lambda: results_of(w, changes, samples)  # Bulyan pops from its list: a fresh one each
    print("// aggregate_median(results)")
    print(rust(f"{label}_MEDIAN", flat(aggregate_median(run()))))
    for beta in [0.0, 0.2, 0.3]:
        tag = f"{int(round(beta * 10))}"
        print(f"// aggregate_trimmed_avg(results, proportiontocut={beta})")
        print(rust(f"{label}_TRIMMED_{tag}", flat(aggregate_trimmed_avg(run(), beta))))
    for f, keep in [(1, 0), (1, 3), (0, 2)]:
        print(f"// aggregate_krum(results, num_malicious={f}, to_keep={keep})")
        print(rust(f"{label}_KRUM_F{f}_KEEP{keep}", flat(aggregate_krum(run(), f, keep))))
    if n >= 7:
        print("// aggregate_bulyan(results, num_malicious=1, aggregation_rule=aggregate_krum, to_keep=0)")
        out = aggregate_bulyan(run(), 1, aggregate_krum, to_keep=0)
        print(rust(f"{label}_BULYAN_F1", flat(out)))
    print("// aggregate_bulyan(results, num_malicious=0, aggregation_rule=aggregate_krum, to_keep=0)")
    print(rust(f"{label}_BULYAN_F0", flat(aggregate_bulyan(run(), 0, aggregate_krum, to_keep=0))))
    print()


def ties():
    """Krum's scores tie: 1-value changes −2, −1, 1, 2, 10, f = 1 (n − f − 2 = 2 closest): −1
    and 1 both score 1 + 4 = 5. Flower's np.argmin keeps the first in results order."""
    results = [([np.array([v])], 1) for v in [-2.0, -1.0, 1.0, 2.0, 10.0]]
    print("// ties: aggregate_krum([-2, -1, 1, 2, 10], num_malicious=1, to_keep=0)")
    print(f"// = {aggregate_krum(results, 1, 0)[0].tolist()!r}")
    swapped = [results[i] for i in [0, 2, 1, 3, 4]]
    print("// ties: aggregate_krum([-2, 1, -1, 2, 10], num_malicious=1, to_keep=0)")
    print(f"// = {aggregate_krum(swapped, 1, 0)[0].tolist()!r}")


if __name__ == "__main__":
    import flwr

    print(f"// flwr {flwr.__version__}, numpy {np.__version__}")
    case("SEVEN", 59, 7, outlier=4)
    case("SIX", 60, 6, outlier=1)
    ties()
