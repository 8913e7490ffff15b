"""MNIST-format IDX files -> RDD[DataSet] -> SparkNetwork (parameter averaging) -> distributed evaluation.

Point it at the four MNIST files (gzipped or not, local paths or any fsspec URL such as ``hdfs://``)::

    python examples/mnist_idx_spark.py \\
        --train-images train-images-idx3-ubyte.gz --train-labels train-labels-idx1-ubyte.gz \\
        --test-images t10k-images-idx3-ubyte.gz --test-labels t10k-labels-idx1-ubyte.gz --epochs 2

On a cluster: ``--master spark://host:7077`` (or run it through spark-submit, see docs/guides/deploying.md).
Any IDX images file of N x H x W unsigned bytes works; the network is LeNet sized to H x W.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from typing import Any

from torchspark import Network, datasets, models, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, session_scope

log = logging.getLogger("examples.mnist_idx_spark")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-images", required=True)
    p.add_argument("--train-labels", required=True)
    p.add_argument("--test-images", help="default: evaluate on the training files")
    p.add_argument("--test-labels")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="minibatch size on each worker")
    p.add_argument("--averaging-frequency", type=int, default=5, help="minibatches between parameter averages")
    p.add_argument("--num-workers", type=int, default=2, help="training workers (Spark task slots)")
    p.add_argument("--partitions", type=int, default=8, help="partitions of the training RDD")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--master", default=None, help="Spark master (default: the active session, else local[workers])")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # 1. the IDX files -> one DataSet (features (N, 1, H, W) in [0, 1], int64 labels) on the driver
    train = datasets.read_idx(args.train_images, args.train_labels)
    test = train if args.test_images is None else datasets.read_idx(args.test_images, args.test_labels)
    _, _, height, width = train.features.shape
    with session_scope(cores=args.num_workers, master=args.master, app_name="mnist-idx") as spark:
        sc = spark.sparkContext
        # 2. an RDD of small DataSets; SparkNetwork re-batches them to batch_size per worker
        rdd = sc.parallelize(train.split(args.batch_size), args.partitions)
        net = Network(models.lenet(1, 10, height, width), updater=optim.Adam(lr=args.lr), seed=args.seed)
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=args.batch_size,
            num_workers=args.num_workers,
            averaging_frequency=args.averaging_frequency,
            rng_seed=args.seed,
        )
        spark_net = SparkNetwork(spark, net, master, progress=False)
        try:
            spark_net.fit(rdd, epochs=args.epochs)
            # 3. evaluation runs on the executors, one Evaluation per partition, merged on the driver
            evaluation = spark_net.evaluate(sc.parallelize(test.split(256), args.partitions))
        finally:
            spark_net.delete_temp_files()
    log.info("%s", evaluation.stats())
    return {
        "examples": len(train),
        "image_shape": [height, width],
        "accuracy": evaluation.accuracy(),
        "epochs": net.epoch,
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(main()))
