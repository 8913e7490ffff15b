"""Run by test_preflight.py in its own process (each check needs a session with its own settings).
Prints one JSON line: check name -> the SetupError message (or "no error")."""

from __future__ import annotations

import json
import os
import sys

from torchspark import Network, datasets, models
from torchspark.errors import SetupError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session

CHECKS = {
    "dynamic_allocation": {"spark.dynamicAllocation.enabled": "true", "spark.shuffle.service.enabled": "false",
                           "spark.dynamicAllocation.shuffleTracking.enabled": "true"},
    # (pyspark's builder keeps earlier options: switch dynamic allocation off again explicitly)
    "executor_without_torch": {"spark.pyspark.python": sys.argv[1] if len(sys.argv) > 1 else "python3",
                               "spark.dynamicAllocation.enabled": "false"},
}

out = {}
for name, conf in CHECKS.items():
    if "spark.pyspark.python" in conf:  # PySpark picks the workers' interpreter from this variable
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    spark = local_session(cores=2, conf=conf, app_name=f"torchspark-preflight-{name}")
    try:
        data = datasets.synthetic_classification(64, 4, 2, seed=0)
        master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2)
        net = Network(models.mlp(4, 4, 2), seed=0)
        SparkNetwork(spark, net, master, progress=False).fit(spark.sparkContext.parallelize(data.split(16), 2))
        out[name] = "no error"
    except SetupError as e:
        out[name] = str(e)
    finally:
        spark.stop()
print(json.dumps(out))
