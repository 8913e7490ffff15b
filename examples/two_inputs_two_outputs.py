"""A network with two inputs and two outputs (a MultiDataSet) on Spark: one head classifies, one regresses.

Each example has a 6-number "signal" input and a 3-number "context" input; the classifier head predicts which of
3 classes the signal belongs to, the regression head predicts a score from both inputs. The loss is the sum of
cross-entropy and MSE (``loss=["cross_entropy", "mse"]``). ::

    python examples/two_inputs_two_outputs.py --examples 4000 --epochs 10
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchspark import MultiDataSet, Network, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, session_scope

log = logging.getLogger("examples.two_inputs_two_outputs")


class TwoInTwoOut(nn.Module):
    """signal (N, 6) and context (N, 3) -> class logits (N, 3) and score (N, 1)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.signal = nn.Linear(6, hidden)
        self.context = nn.Linear(3, hidden)
        self.classify = nn.Linear(hidden, 3)
        self.score = nn.Linear(hidden, 1)

    def forward(self, signal: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.signal(signal) + self.context(context))  # (N, hidden)
        return self.classify(h), self.score(h)


def make_data(n: int, seed: int) -> MultiDataSet:
    centers = torch.randn(3, 6, generator=torch.Generator().manual_seed(1234)) * 2  # one task for every split
    g = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, 3, (n,), generator=g)
    signal = centers[classes] + torch.randn(n, 6, generator=g)
    context = torch.randn(n, 3, generator=g)
    score = (signal[:, :1] * 0.5 + context[:, :1] - context[:, 1:2]).clone()  # (n, 1)
    return MultiDataSet([signal, context], [classes, score])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=4000)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="minibatch size on each worker")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--master", default=None, help="Spark master (default: the active session, else local[workers])")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    train, test = make_data(args.examples, args.seed), make_data(max(args.examples // 4, 64), args.seed + 1)
    net = Network(TwoInTwoOut(), loss=["cross_entropy", "mse"], updater=optim.Adam(lr=args.lr), seed=args.seed)
    score_before = net.score(test)
    with session_scope(cores=args.num_workers, master=args.master, app_name="two-in-two-out") as spark:
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=args.batch_size,
            num_workers=args.num_workers,
            averaging_frequency=4,
            rng_seed=args.seed,
        )
        spark_net = SparkNetwork(spark, net, master, progress=False)
        try:
            rdd = spark.sparkContext.parallelize(train.split(args.batch_size * 2), 2 * args.num_workers)
            spark_net.fit(rdd, epochs=args.epochs)
        finally:
            spark_net.delete_temp_files()
    probabilities, score = net.output(test.features)  # softmax of head 1 (N, 3), head 2 as is (N, 1)
    accuracy = (probabilities.argmax(1) == test.labels[0]).float().mean().item()
    mse = torch.mean((score - test.labels[1]) ** 2).item()
    log.info("loss %.3f -> %.3f; class accuracy %.3f; score MSE %.3f", score_before, net.score(test), accuracy, mse)
    return {
        "loss_before": score_before,
        "loss_after": net.score(test),
        "accuracy": accuracy,
        "score_mse": mse,
        "score_variance": test.labels[1].var().item(),
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(main()))
