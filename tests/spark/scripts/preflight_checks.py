"""Run by test_preflight.py in its own process: each check needs a session with its own settings, so the checks
run one after the other, each on a fresh session (the previous one stopped), in one process.

Usage: ``preflight_checks.py [--python PYTHON] CHECK [CHECK ...]`` with CHECK in :data:`CHECKS`; PYTHON is the
interpreter the executors get for ``executor_without_torch``. Prints one JSON line: check name -> the SetupError
message (or "no error")."""

from __future__ import annotations

import json
import os
import sys

from torchspark import Network, datasets, models
from torchspark.errors import SetupError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session


def _checks(python: str) -> dict[str, dict[str, str]]:
    return {
        "dynamic_allocation": {
            "spark.dynamicAllocation.enabled": "true",
            "spark.shuffle.service.enabled": "false",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        },
        "executor_without_torch": {"spark.pyspark.python": python},
    }


#: the order the checks run in, whatever order they are asked for: the JVM outlives a stopped session and keeps
#: its settings as defaults for the next one; every session sets spark.pyspark.python again, but nothing turns
#: spark.dynamicAllocation.enabled off again, so that check comes last
CHECKS = ("executor_without_torch", "dynamic_allocation")


def run_check(name: str, conf: dict[str, str]) -> str:
    """The SetupError message a fit on a session with ``conf`` raises, or "no error"."""
    saved = os.environ.get("PYSPARK_PYTHON")
    if "spark.pyspark.python" in conf:  # PySpark picks the workers' interpreter from this variable
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    try:
        spark = local_session(cores=2, conf=conf, app_name=f"torchspark-preflight-{name}")
    finally:  # read when the context starts: the next check's session gets the interpreter it had before
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved
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
    args = sys.argv[1:]
    python = "python3"
    if args[:1] == ["--python"]:
        python, args = args[1], args[2:]
    unknown = [c for c in args if c not in CHECKS]
    if unknown or not args:
        sys.exit(f"unknown or no check(s) {unknown}; one or more of {list(CHECKS)}")
    confs = _checks(python)
    print(json.dumps({check: run_check(check, confs[check]) for check in sorted(set(args), key=CHECKS.index)}))
