"""A regression network on Spark: gradient sharing (SharedTrainingMaster), MSE loss, distributed
RegressionEvaluation (MSE, MAE, R^2 per output).

The data is made up so the script runs anywhere: two targets that depend non-linearly on 8 inputs,
``y0 = sin(x0) + x1 * x2`` and ``y1 = 0.5 * x3^2 - x4``, plus noise. Replace ``make_data`` with your own
``DataSet(features (N, F), labels (N, K) float)``. ::

    python examples/regression.py --examples 20000 --epochs 10
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from typing import Any

import torch

from torchspark import DataSet, Network, models, optim
from torchspark.spark import SharedTrainingMaster, SparkNetwork, session_scope

log = logging.getLogger("examples.regression")
N_FEATURES = 8


def make_data(n: int, seed: int) -> DataSet:
    """``n`` examples: features (n, 8) standard normal, two float targets (n, 2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, N_FEATURES, generator=g)
    y = torch.stack([torch.sin(x[:, 0]) + x[:, 1] * x[:, 2], 0.5 * x[:, 3] ** 2 - x[:, 4]], dim=1)
    return DataSet(x, y + 0.05 * torch.randn(y.shape, generator=g))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32, help="minibatch size on each worker")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--master", default=None, help="Spark master (default: the active session, else local[workers])")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    train, test = make_data(args.examples, args.seed), make_data(max(args.examples // 4, 64), args.seed + 1)
    with session_scope(cores=args.num_workers, master=args.master, app_name="regression") as spark:
        sc = spark.sparkContext
        net = Network(
            models.mlp(N_FEATURES, [args.hidden, args.hidden], 2),
            loss="mse",
            updater=optim.Adam(lr=args.lr),
            seed=args.seed,
        )
        test_rdd = sc.parallelize(test.split(256), 2)
        before = SparkNetwork(
            spark, net, SharedTrainingMaster(num_workers=args.num_workers), progress=False
        ).evaluate_regression(test_rdd)
        # gradient sharing: each worker sends only the update entries that crossed the threshold
        master = SharedTrainingMaster(
            batch_size_per_worker=args.batch_size, num_workers=args.num_workers, rng_seed=args.seed
        )
        spark_net = SparkNetwork(spark, net, master, progress=False)
        try:
            spark_net.fit(sc.parallelize(train.split(args.batch_size * 4), 2 * args.num_workers), epochs=args.epochs)
            after = spark_net.evaluate_regression(test_rdd)
        finally:
            spark_net.delete_temp_files()
    log.info(
        "test MSE %.4f -> %.4f, R^2 per target %s",
        before.average_mean_squared_error(),
        after.average_mean_squared_error(),
        [round(after.r_squared(c), 3) for c in range(2)],
    )
    return {
        "mse_before": before.average_mean_squared_error(),
        "mse_after": after.average_mean_squared_error(),
        "r2": [after.r_squared(c) for c in range(2)],
        "mae": [after.mean_absolute_error(c) for c in range(2)],
        # what the workers sent vs what dense float32 exchange would have (kept in the network's extra config)
        "bytes_sent": net.extra_config.get("sharing.bytes_sent"),
        "dense_bytes": net.extra_config.get("sharing.dense_bytes"),
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(main()))
