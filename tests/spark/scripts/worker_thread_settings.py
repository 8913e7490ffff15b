"""Run by test_worker_thread_settings_spark.py in its own process (it changes its Python worker's torch settings, so
it must not share the test session's workers): one task slot, so every job runs in the same reused Python worker.

A job sets the worker's torch thread count to 3 and turns flush-denormal on; a fit (whose task sets 1 thread and
flushes denormals) runs; a second job reports what the worker has then. Prints one JSON line per route."""

from __future__ import annotations

import json
import os
import sys

from torchspark import Network, datasets, models, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session


def _set(items: object) -> list[dict]:
    import torch

    for _ in items:  # read the input to its end: a Python worker that leaves input unread is not reused
        pass
    torch.set_num_threads(3)
    torch.set_flush_denormal(True)
    return [_report()]


def _report(items: object = ()) -> dict:
    import torch

    for _ in items:  # type: ignore[attr-defined]
        pass
    flushed = float(torch.full((1,), 1e-39) * 2.0) == 0.0  # a denormal survives unless flushed
    return {"pid": os.getpid(), "threads": torch.get_num_threads(), "flushed": flushed}


spark = local_session(cores=1, app_name="torchspark-worker-thread-settings", rendezvous_timeout_s=120)
sc = spark.sparkContext
data = datasets.synthetic_classification(64, 6, 3, seed=0)
rdd = sc.parallelize(data.split(16), 1)
for via in sys.argv[1:]:
    before = sc.parallelize([0], 1).mapPartitions(_set).collect()[0]
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, num_workers=1, averaging_via=via, averaging_frequency=2
    )
    with SparkNetwork(
        spark, Network(models.mlp(6, 8, 3), updater=optim.SGD(lr=0.05), seed=0), master, progress=False
    ) as spark_net:
        spark_net.fit(rdd, epochs=1)
        trained = [r.threads for r in spark_net.last_results or []]
    after = sc.parallelize([0], 1).mapPartitions(lambda items: [_report(items)]).collect()[0]
    print(json.dumps({"via": via, "before": before, "after": after, "trained_threads": trained}), flush=True)
spark.stop()
