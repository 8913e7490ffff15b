"""Run by the local-cluster tests (``tests/spark/conftest.py``'s ``local_cluster_runs``) in its own process: a
local-cluster Spark (separate executor JVMs and Python workers) cannot share a JVM with the suite's local[2]
session. One local-cluster[2,1,1024] session serves every check (starting one costs two executor JVMs and their
Python workers importing torch), each check on fresh networks and masters.

Usage: ``local_cluster_fit.py [CHECK ...]`` with CHECK in :data:`CHECKS` (default: all). Prints one JSON line:
check name -> its results, or ``{"error": traceback}`` if that check raised (the others still run)."""

from __future__ import annotations

import json
import os
import sys
import traceback

from torchspark import Network, datasets, models, optim
from torchspark.errors import SetupError
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork, local_session
from torchspark.spark.preflight import executor_count, executors_for_workers_per_node, probe_executors
from torchspark.training.driver.stats import replica_checksums
from torchspark.training.task import param_checksum


def options(spark) -> dict:
    """The import check must reach both executors, ``workers_per_node=1`` must train one worker per executor and
    ``workers_per_node=2`` must be refused (one task slot each)."""
    sc = spark.sparkContext
    executors = executors_for_workers_per_node(sc, 1, wait_s=120)  # waits for both executors to register
    probed = probe_executors(sc)
    data = datasets.synthetic_classification(128, 6, 3, seed=0)
    net = Network(models.mlp(6, 8, 3), updater=optim.SGD(lr=0.1), seed=0)
    spark_net = SparkNetwork(
        spark, net, SharedTrainingMaster(batch_size_per_worker=8, workers_per_node=1), progress=False
    )
    spark_net.fit(sc.parallelize(data.split(16), 4))
    spark_net.delete_temp_files()
    try:
        SparkNetwork(spark, net, SharedTrainingMaster(batch_size_per_worker=8, workers_per_node=2), progress=False).fit(
            sc.parallelize(data.split(16), 4)
        )
        refused = "no error"
    except SetupError as e:
        refused = str(e)
    return {
        "executor_count": executor_count(sc),
        "workers_for_one_per_node": executors,
        "probed": sorted(probed),
        "versions": sorted(set(probed.values())),
        "trained_ranks": sorted(r.rank for r in spark_net.last_results),
        "examples": [r.examples for r in spark_net.last_results],
        "two_per_node": refused,
    }


def _fit(spark, master) -> dict:
    """LeNet on digits for 8 epochs with ``master``; accuracy here and evaluated on the executors."""
    sc = spark.sparkContext
    train, test = datasets.digits("train"), datasets.digits("test")
    rdd = sc.parallelize(train.split(64), 4)
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(rdd, epochs=8)
    spark_net.delete_temp_files()
    pids = sorted(set(sc.parallelize(range(8), 4).map(lambda _: os.getpid()).collect()))
    distributed = spark_net.evaluate(sc.parallelize(test.split(50), 3)).accuracy()
    return {
        "accuracy": net.evaluate(test).accuracy(),
        "distributed_accuracy": distributed,
        "executor_pids": pids,
        "driver_pid": os.getpid(),
        "extra": {k: v for k, v in net.extra_config.items() if isinstance(v, (int, float, bool))},
        "param_checksums": replica_checksums(spark_net.last_results),
        "checksum": param_checksum(net),
    }


def averaging(spark) -> dict:
    return _fit(
        spark,
        ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=5, num_workers=2, rng_seed=0),
    )


def sharing(spark) -> dict:
    from torchspark.encoding import AdaptiveThreshold

    return _fit(
        spark,
        SharedTrainingMaster(
            batch_size_per_worker=16, num_workers=2, rng_seed=0, threshold_algorithm=AdaptiveThreshold(initial=1e-2)
        ),
    )


#: run in this order: ``options`` first waits for both executors to register
CHECKS = {"options": options, "averaging": averaging, "sharing": sharing}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        sys.exit(f"unknown check(s) {unknown}; choose from {list(CHECKS)}")
    spark = local_session(
        master="local-cluster[2,1,1024]", app_name="torchspark-local-cluster", rendezvous_timeout_s=120
    )
    results: dict = {}
    try:
        for name in names:
            try:
                results[name] = CHECKS[name](spark)
            except Exception:  # recorded for that check's test; the other checks still run
                results[name] = {"error": traceback.format_exc()}
    finally:
        spark.stop()
    print(json.dumps(results))
