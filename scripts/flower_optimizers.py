"""Reference values for fedshard's server optimizers (strategies/src/server_optimizer_tests.rs).

Runs Flower's own strategies (FedAvgM, FedAdagrad, FedAdam, FedYogi from flwr 1.42) for three
rounds on fixed client results and writes their global models to
tests/fixtures/flower/optimizers.json, with the inputs. Outside the build:
    python3 -m venv ../ref && ../ref/bin/pip install flwr
    ../ref/bin/python scripts/flower_optimizers.py
"""
import json
import os

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi

rng = np.random.default_rng(7)
SHAPES = [(3,), (2, 2)]
initial = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
SAMPLES = [10, 30, 20]
ROUNDS = 3
# Each round's client models, absolute values (the optimizers see only their FedAvg mean).
rounds = [
    [[(initial[k] + rng.normal(scale=0.5, size=s)).astype(np.float32) for k, s in enumerate(SHAPES)]
     for _ in SAMPLES]
    for _ in range(ROUNDS)
]

STRATEGIES = {
    "momentum": (lambda p: FedAvgM(initial_parameters=p, server_learning_rate=1.0, server_momentum=0.9),
                 {"kind": "momentum", "lr": 1.0, "momentum": 0.9}),
    "adagrad": (lambda p: FedAdagrad(initial_parameters=p, eta=0.1, tau=1e-9),
                {"kind": "adagrad", "lr": 0.1, "beta1": 0.0, "tau": 1e-9}),
    "adam": (lambda p: FedAdam(initial_parameters=p, eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-9),
             {"kind": "adam", "lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-9}),
    "yogi": (lambda p: FedYogi(initial_parameters=p, eta=0.01, beta_1=0.9, beta_2=0.99, tau=1e-3),
             {"kind": "yogi", "lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}),
}


def fit_res(tensors, n):
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(tensors), n, {})


out = {
    "flwr": __import__("flwr").__version__,
    "initial": [t.ravel().tolist() for t in initial],
    "samples": SAMPLES,
    "rounds": [[[t.ravel().tolist() for t in client] for client in r] for r in rounds],
    "optimizers": [],
}
for name, (make, table) in STRATEGIES.items():
    strategy = make(ndarrays_to_parameters(initial))
    models = []
    for server_round, clients in enumerate(rounds, start=1):
        results = [(None, fit_res(c, n)) for c, n in zip(clients, SAMPLES)]
        params, _ = strategy.aggregate_fit(server_round, results, [])
        models.append([t.ravel().astype(np.float64).tolist() for t in parameters_to_ndarrays(params)])
    out["optimizers"].append({"table": table, "models": models})

path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "flower", "optimizers.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print(f"wrote {path}")
