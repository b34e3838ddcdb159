#!/usr/bin/env python3
"""The dense main job in pfl-research (Apple's `pfl`, PyTorch backend): the simulator a
researcher would otherwise reach for, timed beside `fedshard bench job`.

The federation of `config/digits-cnn-dense.toml`, as `scripts/torch_fedavg.py` builds it (the
same data, partition, CNN and recipe; `--partition FILE` trains on fedshard's own partition and
test split): 40 central iterations of FedAvg (`pfl.algorithm.FederatedAveraging`, central SGD
at learning rate 1, updates weighted by sample counts), a cohort of 10 users each, every user
training 2 epochs of SGD (learning rate 0.05, momentum 0.5, weight decay 1e-4) at batch 8 from
the central model, and the test accuracy evaluated centrally after every iteration
(`CentralEvaluationCallback`), as fedshard does. `pfl`'s `SimulatedBackend` trains the cohort's
users one after another in this process (its multi-process mode, one worker per GPU or core
set, is for larger cohorts than 10). Its user sampler draws each user independently
(`random`); fedshard's `uniform` selector draws 10 distinct clients. pfl's datasets iterate
their rows in order, so a user's rows are shuffled when it is drawn (once a round; the plain
loop and fedshard shuffle every epoch).

Not part of the build or the tests: run it in a throwaway venv outside the repository,

    python3 -m venv ../pflref && ../pflref/bin/pip install pfl torch numpy scikit-learn
    taskset -c 0 ../pflref/bin/python scripts/pfl_fedavg.py

and compare with `taskset -c 0 fedshard bench job config/digits-cnn-dense.toml` run right
after it (docs/performance.md, "The main job against pfl-research"). Prints one JSON line.
"""

import argparse
import functools
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

# pfl picks its framework from the first model module imported.
from pfl.model.pytorch import PyTorchModel
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted

from torch_fedavg import federation_data
from torch_reference import DigitsCnn


class PflDigitsCnn(DigitsCnn):
    """The digits CNN with the `loss` and `metrics` methods `pfl` trains and evaluates through."""

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=False):
        self.eval() if eval else self.train()
        logits = self(x)
        rows = len(y)
        return {
            "loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), rows),
            "accuracy": Weighted((logits.argmax(1) == y).sum().item(), rows),
        }


class EveryRound(CentralEvaluationCallback):
    """Central evaluation after every central iteration, the first included, and not before
    training (pfl's callback skips iteration 0 and evaluates before training instead); keeps
    the last accuracy."""

    accuracy = float("nan")

    def on_train_begin(self, *, model):
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        stop, metrics = self._eval(model)
        self.accuracy = float(metrics.to_simple_dict()["Central val | accuracy"])
        return stop, metrics


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--partition", metavar="FILE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x_all, y_all, parts, test = federation_data(rng, args.partition)

    started = time.perf_counter()

    def user_dataset(user):
        # pfl's `Dataset` iterates its rows in order every epoch, and a client's rows come
        # grouped by class, so they are shuffled each time the user is drawn.
        rows = parts[user][rng.permutation(len(parts[user]))]
        return Dataset(raw_data=[x_all[rows], y_all[rows]], user_id=user)

    training = FederatedDataset(
        make_dataset_fn=user_dataset,
        user_sampler=get_user_sampler("random", list(range(len(parts)))),
    )
    network = PflDigitsCnn()
    model = PyTorchModel(
        model=network,
        local_optimizer_create=functools.partial(
            torch.optim.SGD, momentum=0.5, weight_decay=1e-4
        ),
        central_optimizer=torch.optim.SGD(network.parameters(), lr=1.0),
    )
    backend = SimulatedBackend(
        training_data=training, val_data=None, postprocessors=[WeightByDatapoints()]
    )
    evaluation = EveryRound(
        Dataset(raw_data=[x_all[test], y_all[test]]),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        frequency=1,
    )
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            evaluation_frequency=1,
            train_cohort_size=10,
            val_cohort_size=None,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=0.05, local_num_epochs=2, local_batch_size=8
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[evaluation],
    )
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "job": "digits-cnn dense FedAvg in pfl-research",
                "rounds": args.rounds,
                "threads": args.threads,
                "pfl": __import__("pfl").__version__,
                "torch": torch.__version__,
                "wall_s": round(wall, 2),
                "final_accuracy": round(evaluation.accuracy, 4),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
