"""A Spark Connect client for the namespace cluster, run by ``test_connect_cluster.py`` inside the client namespace
(which reaches the Connect server's port and nothing behind it; no worker can reach it).

Usage: ``_connect_client.py OUT_DIR sc://HOST:PORT MODE [MODE...]`` with MODE ``averaging`` or ``sharing``. For each
it trains :func:`build` on the cluster through ``SparkNetwork(...).fit(DataFrame)``, evaluates the result there, and
writes ``OUT_DIR/<mode>.safetensors`` (parameters and updater state) and ``OUT_DIR/<mode>.json`` (where every worker
ran, the cluster's and the local evaluation, whether the client used a progress channel).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from safetensors.torch import save_file

from torchspark import DataSet, Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

BATCH = 8
SEED = 7
EPOCHS = 2


def network() -> Network:
    return Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1, momentum=0.9), seed=0)


def data() -> DataSet:
    return datasets.synthetic_classification(100, 12, 3, seed=1)  # 12 full minibatches + one of 4 examples


def settings(mode: str) -> tuple[int | None, dict[str, Any]]:
    """(rng_seed, the mode's own options), shared by the cluster run and the test's ParallelWrapper reference (the
    same choices as tests/connect/test_connect_fit.py)."""
    if mode == "averaging":
        return SEED, {"averaging_frequency": 3}
    return None, {"threshold_algorithm": AdaptiveThreshold(initial=1e-3)}


def master(mode: str) -> Any:
    rng_seed, own = settings(mode)
    cls = ParameterAveragingTrainingMaster if mode == "averaging" else SharedTrainingMaster
    return cls(
        batch_size_per_worker=BATCH,
        num_workers=2,
        rng_seed=rng_seed,
        rendezvous_timeout_s=120,
        collect_training_stats=True,
        **own,
    )


def main() -> None:
    from pyspark.sql import SparkSession

    from torchspark.spark.connect.jobs import client_is_local

    out_dir, url, modes = sys.argv[1], sys.argv[2], sys.argv[3:]
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        ds = data()
        rows = [(x.double().tolist(), int(y)) for x, y in zip(ds.features, ds.labels)]
        df = spark.createDataFrame(rows, "features array<double>, label long")
        for mode in modes:
            net = network()
            spark_net = SparkNetwork(spark, net, master(mode))  # progress left to the route's own choice
            spark_net.fit(df, epochs=EPOCHS)
            on_cluster = spark_net.evaluate(df)
            local = net.evaluate(ds)
            save_file(
                {"params": net.params().contiguous(), "updater": net.updater_state().contiguous()},
                os.path.join(out_dir, f"{mode}.safetensors"),
            )
            report = {
                "workers": [
                    {
                        "rank": r.rank,
                        "examples": r.examples,
                        "executor": r.executor,
                        "address": (r.network or {}).get("address"),
                    }
                    for r in spark_net.last_results
                ],
                "summary_executors": spark_net.training_stats.summary().get("executors"),
                "progress_channel": client_is_local(spark),
                "cluster_accuracy": on_cluster.accuracy(),
                "cluster_confusion": on_cluster.confusion_matrix().tolist(),
                "local_accuracy": local.accuracy(),
                "local_confusion": local.confusion_matrix().tolist(),
            }
            with open(os.path.join(out_dir, f"{mode}.json"), "w") as f:
                json.dump(report, f)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
