#!/usr/bin/env python3
"""The dense main job as a Flower simulation: the other framework a researcher would reach
for, timed beside `fedshard bench job`.

The federation of `config/digits-cnn-dense.toml`, as `scripts/torch_fedavg.py` builds it (the
same data, partition, CNN and recipe; `--partition FILE` trains on fedshard's own partition and
test split): 20 virtual SuperNodes, one per client, run by Flower's simulation runtime on Ray;
40 rounds of `flwr.server.strategy.FedAvg` sampling 10 of them (`fraction_fit = 0.5`), each
training 2 epochs of SGD (learning rate 0.05, momentum 0.5, weight decay 1e-4) at batch 8 from
the global model, shuffled every epoch, the update weighted by its sample count; the test
accuracy evaluated centrally after every round (`evaluate_fn`), as fedshard does. Each client
takes one CPU (`client_resources`), so Ray runs as many at once as `--cpus` (default: every
core, as `fedshard bench job` uses every core).

Not part of the build or the tests: run it in a throwaway venv outside the repository,

    python3 -m venv ../flwrref && ../flwrref/bin/pip install "flwr[simulation]" torch numpy scikit-learn
    ../flwrref/bin/python scripts/flower_fedavg.py

and compare with `fedshard bench job config/digits-cnn-dense.toml` run right after it
(docs/performance.md, "The main job against Flower"). Prints one JSON line; Flower's own log
goes to standard error.
"""

import argparse
import json
import os
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from flwr.client import NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from flower_orchestration import simulate
from torch_fedavg import federation_data
from torch_reference import DigitsCnn

ARGS = None


def data():
    """The federation's data, the same in every Ray worker (drawn from the run seed)."""
    torch.set_num_threads(1)
    return federation_data(np.random.default_rng(ARGS.seed), ARGS.partition)


def get_weights(model):
    return [v.cpu().numpy() for v in model.state_dict().values()]


def set_weights(model, weights):
    keys = model.state_dict().keys()
    model.load_state_dict(OrderedDict((k, torch.tensor(w)) for k, w in zip(keys, weights)))


class DigitsClient(NumPyClient):
    def __init__(self, rows, x_all, y_all, seed):
        self.rows, self.x_all, self.y_all = rows, x_all, y_all
        self.rng = np.random.default_rng(seed)
        self.model = DigitsCnn()

    def fit(self, parameters, config):
        set_weights(self.model, parameters)
        opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.5, weight_decay=1e-4)
        for _ in range(2):
            order = self.rows[self.rng.permutation(len(self.rows))]
            for s in range(0, len(order), 8):
                batch = order[s : s + 8]
                loss = F.cross_entropy(self.model(self.x_all[batch]), self.y_all[batch])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return get_weights(self.model), len(self.rows), {}


def client_fn(context: Context):
    x_all, y_all, parts, _ = data()
    client = int(context.node_config["partition-id"])
    return DigitsClient(parts[client], x_all, y_all, ARGS.seed * 1000 + client).to_client()


ACCURACY = {}


def server_fn(context: Context):
    x_all, y_all, _, test = data()
    torch.manual_seed(ARGS.seed)
    model = DigitsCnn()

    def evaluate(server_round, parameters, config):
        set_weights(model, parameters)
        with torch.no_grad():
            logits = model(x_all[test])
        ACCURACY["final"] = (logits.argmax(1) == y_all[test]).float().mean().item()
        return F.cross_entropy(logits, y_all[test]).item(), {"accuracy": ACCURACY["final"]}

    strategy = FedAvg(
        fraction_fit=0.5,
        fraction_evaluate=0.0,
        min_fit_clients=10,
        min_evaluate_clients=0,
        min_available_clients=20,
        evaluate_fn=evaluate,
        initial_parameters=ndarrays_to_parameters(get_weights(model)),
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ARGS.rounds))


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    parser.add_argument("--partition", metavar="FILE")
    ARGS = parser.parse_args()
    started = time.perf_counter()
    simulate(server_fn, client_fn, 20, ARGS.cpus)
    wall = time.perf_counter() - started
    import flwr

    print(
        json.dumps(
            {
                "job": "digits-cnn dense FedAvg in Flower",
                "rounds": ARGS.rounds,
                "cpus": ARGS.cpus,
                "flwr": flwr.__version__,
                "torch": torch.__version__,
                "wall_s": round(wall, 2),
                "final_accuracy": round(ACCURACY.get("final", float("nan")), 4),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
