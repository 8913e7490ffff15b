"""Run by test_preflight.py in its own process (each check needs a session with its own settings).

Usage: ``preflight_checks.py CHECK [PYTHON]`` with CHECK one of :data:`CHECKS`; PYTHON is the interpreter the
executors get for ``executor_without_torch``. Prints one JSON line: check name -> the SetupError message (or
"no error")."""

from __future__ import annotations

import json
import os
import sys

from torchspark import Network, datasets, models
from torchspark.errors import SetupError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session


def _checks(python: str) -> dict[str, dict[str, str]]:
    return {
        "dynamic_allocation": {"spark.dynamicAllocation.enabled": "true", "spark.shuffle.service.enabled": "false",
                               "spark.dynamicAllocation.shuffleTracking.enabled": "true"},
        "executor_without_torch": {"spark.pyspark.python": python},
    }


CHECKS = tuple(_checks("python3"))


def run_check(name: str, conf: dict[str, str]) -> str:
    """The SetupError message a fit on a session with ``conf`` raises, or "no error"."""
    if "spark.pyspark.python" in conf:  # PySpark picks the workers' interpreter from this variable
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    spark = local_session(cores=2, conf=conf, app_name=f"torchspark-preflight-{name}")
    try:
        data = datasets.synthetic_classification(64, 4, 2, seed=0)
        master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2)
        net = Network(models.mlp(4, 4, 2), seed=0)
        SparkNetwork(spark, net, master, progress=False).fit(spark.sparkContext.parallelize(data.split(16), 2))
        return "no error"
    except SetupError as e:
        return str(e)
    finally:
        spark.stop()


if __name__ == "__main__":
    check = sys.argv[1]
    if check not in CHECKS:
        sys.exit(f"unknown check {check!r}; one of {list(CHECKS)}")
    conf = _checks(sys.argv[2] if len(sys.argv) > 2 else "python3")[check]
    print(json.dumps({check: run_check(check, conf)}))
