"""Run by test_options_refused.py in its own process: on local-cluster[2,1,1024] (two executor JVMs, one task slot
each) the import check must reach both executors, ``workers_per_node=1`` must train one worker per executor and
``workers_per_node=2`` must be refused. Prints one JSON line with the results."""

from __future__ import annotations

import json

from torchspark import Network, datasets, models, optim
from torchspark.errors import SetupError
from torchspark.spark import SharedTrainingMaster, SparkNetwork, local_session
from torchspark.spark.preflight import executor_count, executors_for_workers_per_node, probe_executors

spark = local_session(master="local-cluster[2,1,1024]", app_name="torchspark-options-cluster",
                      rendezvous_timeout_s=120)
try:
    sc = spark.sparkContext
    executors = executors_for_workers_per_node(sc, 1, wait_s=120)  # waits for both executors to register
    probed = probe_executors(sc)
    data = datasets.synthetic_classification(128, 6, 3, seed=0)
    net = Network(models.mlp(6, 8, 3), updater=optim.SGD(lr=0.1), seed=0)
    spark_net = SparkNetwork(spark, net, SharedTrainingMaster(batch_size_per_worker=8, workers_per_node=1),
                             progress=False)
    spark_net.fit(sc.parallelize(data.split(16), 4))
    spark_net.delete_temp_files()
    try:
        SparkNetwork(spark, net, SharedTrainingMaster(batch_size_per_worker=8, workers_per_node=2),
                     progress=False).fit(sc.parallelize(data.split(16), 4))
        refused = "no error"
    except SetupError as e:
        refused = str(e)
    print(json.dumps({"executor_count": executor_count(sc), "workers_for_one_per_node": executors,
                      "probed": sorted(probed), "versions": sorted(set(probed.values())),
                      "trained_ranks": sorted(r.rank for r in spark_net.last_results),
                      "examples": [r.examples for r in spark_net.last_results], "two_per_node": refused}))
finally:
    spark.stop()
