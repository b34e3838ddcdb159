#!/usr/bin/env python3
"""Flower's own cost per client and round, beside `fedshard bench orchestration`: a simulated
federation whose clients return the global model unchanged, so the time is the framework's.

`--clients K` virtual SuperNodes on Flower's simulation runtime (Ray), a model of ten zeros (as
`bench orchestration`'s), `flwr.server.strategy.FedAvg` selecting every client every round
(`fraction_fit = 1`), no client evaluation, each client one CPU of Ray's (so as many at once as
the machine has cores). The server's `evaluate_fn` runs once before the first round and after
each round; the time per round is measured between the first and the last of those calls, so
starting Ray and its workers is left out. Prints one JSON line with the seconds per round and
µs per client per round.

Not part of the build or the tests: run it in a throwaway venv outside the repository,

    python3 -m venv ../flwrref && ../flwrref/bin/pip install "flwr[simulation]" numpy
    ../flwrref/bin/python scripts/flower_orchestration.py --clients 1000

and compare with `fedshard bench orchestration --clients 1000` run right after it
(docs/performance.md, "Orchestration overhead").
"""

import argparse
import json
import os
import time

import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.simulation import run_simulation

ARGS = None
MARKS = []


class EchoClient(NumPyClient):
    def fit(self, parameters, config):
        return parameters, 1, {}


def client_fn(context: Context):
    return EchoClient().to_client()


def server_fn(context: Context):
    def mark(server_round, parameters, config):
        MARKS.append(time.perf_counter())
        return 0.0, {}

    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=ARGS.clients,
        min_evaluate_clients=0,
        min_available_clients=ARGS.clients,
        evaluate_fn=mark,
        initial_parameters=ndarrays_to_parameters([np.zeros(10, dtype=np.float32)]),
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ARGS.rounds))


def simulate(server_fn, client_fn, supernodes, cpus):
    """Runs `supernodes` virtual SuperNodes on Flower's simulation runtime (Ray) with `cpus`
    CPUs, each client taking one of them."""
    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=supernodes,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": cpus},
        },
    )


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    ARGS = parser.parse_args()
    started = time.perf_counter()
    simulate(server_fn, client_fn, ARGS.clients, ARGS.cpus)
    wall = time.perf_counter() - started
    per_round = (MARKS[-1] - MARKS[0]) / ARGS.rounds
    import flwr

    print(
        json.dumps(
            {
                "job": "Flower echo clients",
                "clients": ARGS.clients,
                "rounds": ARGS.rounds,
                "cpus": ARGS.cpus,
                "flwr": flwr.__version__,
                "wall_s": round(wall, 2),
                "seconds_per_round": round(per_round, 4),
                "us_per_client_round": round(per_round / ARGS.clients * 1e6, 1),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
