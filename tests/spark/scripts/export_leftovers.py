"""Run by test_private_exports_spark.py in its own process: fit with a default export, print the private export
directory as one JSON line, then either return without closing anything ("exit": interpreter exit must remove it)
or wait to be killed ("hang": SIGKILL leaves it for the next run's stale-owner cleanup)."""

from __future__ import annotations

import json
import os
import sys
import time

from torchspark import Network, datasets, models, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session

how = sys.argv[1]  # "exit", "hang", or "hang-explicit EXPORT_DIRECTORY" (an explicit export_directory)
spark = local_session(cores=1, app_name="torchspark-export-leftovers", rendezvous_timeout_s=120)
data = datasets.synthetic_classification(64, 6, 3, seed=0)
master = ParameterAveragingTrainingMaster(
    batch_size_per_worker=8,
    num_workers=1,
    rdd_training_approach="export",
    export_directory=sys.argv[2] if how == "hang-explicit" else None,
)
spark_net = SparkNetwork(
    spark, Network(models.mlp(6, 8, 3), updater=optim.SGD(lr=0.05), seed=0), master, progress=False
)
spark_net.fit(spark.sparkContext.parallelize(data.split(16), 2), epochs=1)
directory = (
    spark_net.preparation.private_dirs[0]
    if how != "hang-explicit"
    else next(iter(spark_net.preparation.exports.values())).directory
)
print(json.dumps({"directory": directory, "files": len(os.listdir(directory)), "pid": os.getpid()}), flush=True)
if how.startswith("hang"):
    time.sleep(600)
