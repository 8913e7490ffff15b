"""Run by test_recovery_cluster.py in its own process: a local-cluster Spark with 3 one-core executors trains with 2
workers, once undisturbed (the accuracy reference) and then once per fault mode: mid-fit a fault hits the executor
JVM under rank 1 (``kill``: SIGKILL; ``stop``: SIGSTOP, resumed after that fit). One session serves every mode
(starting a local-cluster costs three executor JVMs and their Python workers importing torch); before each faulted
fit the script waits for all 3 executors (Spark's standalone worker replaces a killed executor JVM).

Usage: ``recovery_cluster_fit.py [MODE ...]`` (default: kill stop). Prints one JSON line: ``undisturbed_accuracy``,
``driver_pid`` and per mode its accuracy, failure records and the processes involved (or ``error``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/spark: _faults

from _faults import Fault, executor_jvm  # noqa: E402

from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.errors import WorkerError  # noqa: E402
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session  # noqa: E402
from torchspark.spark.preflight import executor_count  # noqa: E402

EXECUTORS = 3
MODES = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def _fit(spark, listener=None) -> tuple[Network, SparkNetwork, float]:
    sc = spark.sparkContext
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=5,
        num_workers=2,
        rng_seed=0,
        collect_training_stats=True,
        rendezvous_timeout_s=20,
    )
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    if listener is not None:
        spark_net.add_progress_listener(listener)
    t = time.time()
    try:
        spark_net.fit(sc.parallelize(datasets.digits("train").split(64), 2), epochs=3)
    finally:
        spark_net.delete_temp_files()
    return net, spark_net, time.time() - t


def _faulted(spark, mode: str) -> dict:
    out: dict = {"mode": mode}
    deadline = time.monotonic() + 120
    while executor_count(spark.sparkContext) < EXECUTORS and time.monotonic() < deadline:
        time.sleep(0.5)  # a killed executor's replacement registers within seconds
    out["executors_at_start"] = executor_count(spark.sparkContext)
    fault = Fault(MODES[mode], target=executor_jvm)
    try:
        try:
            net, spark_net, out["seconds"] = _fit(spark, fault)
            out["accuracy"] = net.evaluate(datasets.digits("test")).accuracy()
            summary = spark_net.training_stats.summary()
            out["failures"], out["recovered_from"] = summary["failures"], summary["recovered_from"]
        except WorkerError as e:
            out["error"] = str(e)
    finally:
        if mode == "stop":
            for pid in fault.hit:
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
    out["jvms"], out["workers"], out["all_pids"] = fault.hit, fault.workers, sorted(fault.all_pids)
    return out


if __name__ == "__main__":
    modes = sys.argv[1:] or list(MODES)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    spark = local_session(
        master=f"local-cluster[{EXECUTORS},1,1024]", app_name="torchspark-recovery", rendezvous_timeout_s=120
    )
    result: dict = {"driver_pid": os.getpid()}
    try:
        net, _, result["undisturbed_seconds"] = _fit(spark)
        result["undisturbed_accuracy"] = net.evaluate(datasets.digits("test")).accuracy()
        for mode in modes:
            try:
                result[mode] = _faulted(spark, mode)
            except Exception:  # recorded for that mode's test; the next mode still runs
                result[mode] = {"error": traceback.format_exc()}
    finally:
        spark.stop()
    print(json.dumps(result))
