"""Run by test_local_cluster.py in its own process: a local-cluster Spark (separate executor JVMs and Python
workers) cannot share a JVM with the suite's local[2] session. Prints one JSON line with the results."""

from __future__ import annotations

import json
import os
import sys

from torchspark import Network, datasets, models, optim
from torchspark.spark import SparkNetwork, local_session

mode = sys.argv[1] if len(sys.argv) > 1 else "averaging"
spark = local_session(master="local-cluster[2,1,1024]", app_name="torchspark-local-cluster", rendezvous_timeout_s=120)
try:
    sc = spark.sparkContext
    train, test = datasets.digits("train"), datasets.digits("test")
    rdd = sc.parallelize(train.split(64), 4)
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    if mode == "sharing":
        from torchspark.encoding import AdaptiveThreshold
        from torchspark.spark import SharedTrainingMaster

        master = SharedTrainingMaster(batch_size_per_worker=16, num_workers=2, rng_seed=0,
                                      threshold_algorithm=AdaptiveThreshold(initial=1e-2))
    else:
        from torchspark.spark import ParameterAveragingTrainingMaster

        master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=5, num_workers=2,
                                                  rng_seed=0)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(rdd, epochs=8)
    spark_net.delete_temp_files()
    pids = sorted(set(sc.parallelize(range(8), 4).map(lambda _: os.getpid()).collect()))
    distributed = spark_net.evaluate(sc.parallelize(test.split(50), 3)).accuracy()
    print(json.dumps({"accuracy": net.evaluate(test).accuracy(), "distributed_accuracy": distributed, "executor_pids": pids, "driver_pid": os.getpid(),
                      "extra": {k: v for k, v in net.extra_config.items() if isinstance(v, (int, float, bool))}}))
finally:
    spark.stop()
