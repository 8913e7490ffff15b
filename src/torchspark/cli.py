"""The ``torchspark`` command: train, evaluate and predict with Spark (or ParallelWrapper) from the shell."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any, Sequence

from torchspark.errors import TorchSparkError

__all__ = ["main", "build_parser"]

log = logging.getLogger("torchspark.cli")

MODELS = ("lenet", "mlp")
UPDATERS = ("adam", "sgd", "adamw", "rmsprop", "adagrad")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchspark",
        description="Distributed training of PyTorch networks on Apache Spark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train a zoo model on a built-in dataset",
        description="Train a zoo model on the built-in digits dataset (or batch files) with Spark, print the "
        "evaluation on the test split, and write the model and metrics.json to --output.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    train.add_argument("--dataset", default="digits", choices=["digits"], help="built-in training dataset")
    train.add_argument("--model", default="lenet", choices=MODELS, help="zoo model to train")
    train.add_argument("--epochs", type=int, default=8, help="passes over the training data")
    train.add_argument("--mode", default="averaging", choices=["averaging"],
                       help="training master: synchronous parameter averaging")
    train.add_argument("--master", default=None,
                       help="Spark master URL (default local[WORKERS]); e.g. local-cluster[2,1,1024], spark://h:7077")
    train.add_argument("--workers", type=int, default=2, help="training workers (Spark task slots)")
    train.add_argument("--batch-size-per-worker", type=int, default=16, help="minibatch size on each worker")
    train.add_argument("--averaging-frequency", type=int, default=5,
                       help="minibatches between parameter averages (averaging mode)")
    train.add_argument("--updater", default="adam", choices=UPDATERS, help="optimizer")
    train.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    train.add_argument("--seed", type=int, default=0, help="seed for weights and data shuffling")
    train.add_argument("--output", default="torchspark-output", help="directory for the model and metrics.json")
    train.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    return parser


def _updater(name: str, lr: float) -> Any:
    from torchspark import optim

    specs = {"adam": optim.Adam, "sgd": optim.SGD, "adamw": optim.AdamW, "rmsprop": optim.RMSprop,
             "adagrad": optim.AdaGrad}
    return specs[name](lr=lr)


def _model(name: str, sample_shape: Sequence[int], n_classes: int) -> Any:
    from torchspark import models

    c, h, w = sample_shape
    if name == "lenet":
        return models.lenet(c, n_classes, h, w)
    return models.mlp(c * h * w, 128, n_classes)


def cmd_train(args: argparse.Namespace) -> int:
    from torchspark import Network, datasets
    from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, check_java, local_session

    check_java()
    train_data = datasets.digits("train")
    test_data = datasets.digits("test")
    net = Network(_model(args.model, tuple(train_data.features.shape[1:]), 10),
                  updater=_updater(args.updater, args.lr), seed=args.seed)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=args.batch_size_per_worker,
        averaging_frequency=args.averaging_frequency,
        num_workers=args.workers,
        rng_seed=args.seed,
    )
    spark = local_session(cores=args.workers, master=args.master)
    try:
        rdd = spark.sparkContext.parallelize(train_data.split(64), max(args.workers, 2))
        spark_net = SparkNetwork(spark, net, master)
        start = time.time()
        spark_net.fit(rdd, epochs=args.epochs)
        seconds = time.time() - start
        spark_net.delete_temp_files()
    finally:
        spark.stop()
    evaluation = net.evaluate(test_data)
    print(evaluation.stats())
    os.makedirs(args.output, exist_ok=True)
    model_dir = os.path.join(args.output, "model")
    net.save(model_dir)
    metrics = {
        "accuracy": evaluation.accuracy(),
        "f1_macro": evaluation.f1(),
        "score": spark_net.get_score(),
        "epochs": args.epochs,
        "workers": args.workers,
        "mode": args.mode,
        "train_seconds": seconds,
        "examples_per_second": len(train_data) * args.epochs / seconds,
    }
    tmp = os.path.join(args.output, ".metrics.json.tmp")
    with open(tmp, "w") as f:
        json.dump(metrics, f, indent=2)
    os.replace(tmp, os.path.join(args.output, "metrics.json"))
    print(f"accuracy {evaluation.accuracy():.4f} on {len(test_data)} test digits; "
          f"model written to {model_dir}, metrics to {os.path.join(args.output, 'metrics.json')}")
    return 0


COMMANDS = {"train": cmd_train}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command](args)
    except TorchSparkError as e:
        print(f"torchspark: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
