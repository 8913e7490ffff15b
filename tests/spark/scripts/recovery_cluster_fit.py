"""Run by test_recovery_cluster.py in its own process: a local-cluster Spark with 3 one-core executors trains with 2
workers; mid-fit a fault hits the executor JVM under rank 1 (``kill``: SIGKILL; ``stop``: SIGSTOP, resumed at the
end). Prints one JSON line: accuracies (undisturbed and recovered), the failure records, the processes involved."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/spark: _faults

from _faults import Fault, executor_jvm  # noqa: E402

from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.errors import WorkerError  # noqa: E402
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "kill"
spark = local_session(master="local-cluster[3,1,1024]", app_name="torchspark-recovery", rendezvous_timeout_s=120)
fault = Fault(signal.SIGKILL if mode == "kill" else signal.SIGSTOP, target=executor_jvm)
out: dict = {"mode": mode}
try:
    sc = spark.sparkContext
    train, test = datasets.digits("train"), datasets.digits("test")
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=5, num_workers=2,
                                              rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=20)

    def fit(listener=None) -> tuple[Network, SparkNetwork, float]:
        net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
        spark_net = SparkNetwork(spark, net, master, progress=False)
        if listener is not None:
            spark_net.add_progress_listener(listener)
        t = time.time()
        try:
            spark_net.fit(sc.parallelize(train.split(64), 2), epochs=3)
        finally:
            spark_net.delete_temp_files()
        return net, spark_net, time.time() - t

    net, _, out["undisturbed_seconds"] = fit()
    out["undisturbed_accuracy"] = net.evaluate(test).accuracy()
    try:
        net, spark_net, out["seconds"] = fit(fault)
        out["accuracy"] = net.evaluate(test).accuracy()
        summary = spark_net.training_stats.summary()
        out["failures"], out["recovered_from"] = summary["failures"], summary["recovered_from"]
    except WorkerError as e:
        out["error"] = str(e)
    out["jvms"], out["workers"], out["all_pids"] = fault.hit, fault.workers, sorted(fault.all_pids)
    out["driver_pid"] = os.getpid()
finally:
    if mode == "stop":
        for pid in fault.hit:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
    spark.stop()
print(json.dumps(out))
