"""Run by test_elastic_cluster.py in its own process: a local-cluster Spark with 2 one-core executors trains with 2
workers and ``min_workers=1``, once undisturbed (the accuracy reference) and once with the executor under rank 1
gone for good: when rank 1 reports from epoch 1 on, the driver is told to kill that executor
(``SparkContext.killExecutor``, which also lowers the application's executor target, so the standalone master does
not replace it) and its JVM is SIGKILLed. The fit must go on with 1 worker from the checkpoint of epoch 1.

Usage: ``elastic_cluster_fit.py CHECKPOINT_DIR``. Prints one JSON line: both accuracies, the summary's failures,
world changes and examples, the executors left, and the processes involved (or ``error``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/spark: _faults

from _faults import Fault, executor_jvm  # noqa: E402

from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session  # noqa: E402
from torchspark.spark.preflight import executor_count  # noqa: E402


def _fit(spark, checkpoints: str, listener=None) -> tuple[Network, SparkNetwork]:
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=5,
        num_workers=2,
        min_workers=1,
        rng_seed=0,
        collect_training_stats=True,
        rendezvous_timeout_s=20,
        checkpoint_directory=checkpoints,
    )
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    if listener is not None:
        spark_net.add_progress_listener(listener)
    try:
        spark_net.fit(spark.sparkContext.parallelize(datasets.digits("train").split(64), 2), epochs=3)
    finally:
        spark_net.delete_temp_files()
    return net, spark_net


def gone_for_good(sc):
    """A :class:`Fault` target: the executor JVM above a Python worker, after telling the driver to kill that
    executor without a replacement (its id read from the JVM's ``--executor-id`` argument)."""

    def target(pid: int) -> int | None:
        jvm = executor_jvm(pid)
        if jvm is None:
            return None
        with open(f"/proc/{jvm}/cmdline", "rb") as f:
            args = f.read().decode().split("\0")
        executor_id = args[args.index("--executor-id") + 1]
        sc._jsc.sc().killExecutor(executor_id)
        return jvm

    return target


def main(base: str) -> None:
    spark = local_session(master="local-cluster[2,1,1024]", app_name="torchspark-elastic", rendezvous_timeout_s=120)
    result: dict = {"driver_pid": os.getpid()}
    try:
        net, _ = _fit(spark, os.path.join(base, "undisturbed"))
        result["undisturbed_accuracy"] = net.evaluate(datasets.digits("test")).accuracy()
        deadline = time.monotonic() + 120
        while executor_count(spark.sparkContext) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        fault = Fault(signal.SIGKILL, target=gone_for_good(spark.sparkContext))
        try:
            net, spark_net = _fit(spark, os.path.join(base, "elastic"), fault)
            summary = spark_net.training_stats.summary()
            result.update(
                accuracy=net.evaluate(datasets.digits("test")).accuracy(),
                failures=summary["failures"],
                world_changes=summary["world_changes"],
                examples=summary["examples"],
                epoch=net.epoch,
                results=len(spark_net.last_results),
            )
        except Exception:
            result["error"] = traceback.format_exc()
        result["executors_after"] = executor_count(spark.sparkContext)
        result["jvms"], result["workers"], result["all_pids"] = fault.hit, fault.workers, sorted(fault.all_pids)
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # the background lane of tests/background.py: a directory of its own, removed after
        with tempfile.TemporaryDirectory(prefix="torchspark-elastic-") as tmp:
            main(tmp)
