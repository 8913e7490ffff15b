"""Run by test_private_exports_spark.py in its own process: fit with a default export, print the private export
directory as one JSON line, then either return without closing anything ("exit": interpreter exit must remove it)
or ("hang EXPORT_DIRECTORY") fit once more into an explicit export directory, print both directories and wait to
be killed (SIGKILL leaves both for the next run's stale-owner cleanup: one driver serves both killed-driver tests)."""

from __future__ import annotations

import json
import os
import sys
import time

from torchspark import Network, datasets, models, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session

how = sys.argv[1]  # "exit" or "hang EXPORT_DIRECTORY"
spark = local_session(cores=1, app_name="torchspark-export-leftovers", rendezvous_timeout_s=120)
data = datasets.synthetic_classification(64, 6, 3, seed=0)


def fit(export_directory: str | None) -> str:
    """Fit once with a default (None) or explicit export; the export's directory (left open: nothing closed)."""
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, num_workers=1, rdd_training_approach="export", export_directory=export_directory
    )
    net = Network(models.mlp(6, 8, 3), updater=optim.SGD(lr=0.05), seed=0)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(spark.sparkContext.parallelize(data.split(16), 2), epochs=1)
    keep.append(spark_net)  # alive until the process ends: no garbage collection cleans up
    if export_directory is None:
        return spark_net.preparation.private_dirs[0]
    return next(iter(spark_net.preparation.exports.values())).directory


keep: list[SparkNetwork] = []
default = fit(None)
report = {"directory": default, "files": len(os.listdir(default)), "pid": os.getpid()}
if how == "hang":
    report["explicit"] = fit(sys.argv[2])
print(json.dumps(report), flush=True)
if how == "hang":
    time.sleep(600)
