"""Run by test_session_settings.py in its own process, started without PYSPARK_PYTHON: a ``local_session`` with
its own ``spark.task.cpus`` and ``rendezvous_timeout_s`` cannot share a JVM with the suite's session.

Prints one JSON line: the session's settings as Spark reports them, what the executors' Python workers see, and
the torch thread count each training worker used."""

from __future__ import annotations

import json
import os
import sys

from torchspark import Network, datasets, models, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session

TASK_CPUS = 3  # more than this 2-core machine's torch default, so a worker left at the default is caught


def worker_view(_: object) -> list[tuple[str, int]]:
    """What a barrier task sees: its interpreter and process id (both tasks run at once, so two workers)."""
    from pyspark import BarrierTaskContext

    BarrierTaskContext.get().barrier()
    return [(sys.executable, os.getpid())]


def main() -> dict[str, object]:
    spark = local_session(
        cores=2 * TASK_CPUS,
        rendezvous_timeout_s=77,
        app_name="torchspark-session-settings",
        conf={"spark.task.cpus": str(TASK_CPUS)},
    )
    try:
        sc = spark.sparkContext
        conf = sc.getConf()
        keys = (
            "spark.locality.wait",
            "spark.python.worker.reuse",
            "spark.barrier.sync.timeout",
            "spark.pyspark.python",
            "spark.task.cpus",
        )
        views = [sc.parallelize(range(2), 2).barrier().mapPartitions(worker_view).collect() for _ in range(2)]
        data = datasets.synthetic_classification(64, 4, 2, seed=0)
        master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2)
        snet = SparkNetwork(
            spark, Network(models.mlp(4, 4, 2), updater=optim.SGD(lr=0.1), seed=0), master, progress=False
        )
        snet.fit(sc.parallelize(data.split(16), 2))
        snet.delete_temp_files()
        return {
            "conf": {k: conf.get(k, None) for k in keys},
            "driver_python": sys.executable,
            "worker_pythons": sorted({exe for view in views for exe, _ in view}),
            "first_job_pids": sorted(pid for _, pid in views[0]),
            "second_job_pids": sorted(pid for _, pid in views[1]),
            "worker_threads": [r.threads for r in snet.last_results],
        }
    finally:
        spark.stop()


if __name__ == "__main__":
    print(json.dumps(main()))
