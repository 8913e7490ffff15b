"""Run as a script by test_driver_jvm.py: a fit on its own local Spark session whose driver JVM is SIGKILLed at
the first progress report; prints the error the fit raised as ``ERROR <class>: <message>``."""

from __future__ import annotations

import os
import signal
import sys
import traceback

from pyspark.sql import SparkSession
from torch import nn

from torchspark import Network, datasets, optim
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this venv's
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    sc = spark.sparkContext
    data = sc.parallelize(datasets.synthetic_classification(512, 8, 3, seed=1).split(8), 2)
    net = Network(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)), updater=optim.SGD(lr=0.1), seed=0)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2, max_failures=1)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    pid = sc._gateway.proc.pid

    def kill(_update: object) -> None:
        os.kill(pid, signal.SIGKILL)

    spark_net.add_progress_listener(kill)
    try:
        spark_net.fit(data, epochs=1000)
    except BaseException as e:  # noqa: BLE001 - the test reads what was raised
        traceback.print_exc()  # on stderr: where py4j's error came from, when the test fails
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        sys.exit(0)
    print("ERROR none: the fit ended", flush=True)


if __name__ == "__main__":
    main()
