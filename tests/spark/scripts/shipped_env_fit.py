"""Run by test_shipping.py in its own process: trains on local-cluster[2,1,1024] whose executors run only the
interpreter of a packed venv shipped with ``spark.archives`` (Spark's "Python Package Management" recipe).

argv: ARCHIVE MODEL_DIR. MODEL_DIR holds ``shipped_model.py``, a module the archive also carries but this
test's own environment does not: the driver imports it from MODEL_DIR, the executors can only get it from the
archive. Prints one JSON line with what the executors' Python workers report about themselves and the result.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

archive, model_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, model_dir)

from pyspark.sql import SparkSession  # noqa: E402

from torchspark import Network, datasets, optim  # noqa: E402
from torchspark.shipping import archive_conf  # noqa: E402
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork  # noqa: E402

conf = archive_conf(archive)
# a driver started as `python script.py` reads the workers' interpreter from this variable (Spark's guide)
os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]

import shipped_model  # noqa: E402  (from MODEL_DIR on the driver)


def describe(_: object) -> dict:
    """What one executor Python worker is: its interpreter, prefix, where its packages come from."""
    import os as _os
    import sys as _sys

    import numpy
    import pyspark
    import torch

    import torchspark

    try:
        import shipped_model as marker

        token = marker.TOKEN
    except ImportError:
        token = None
    torch_dir = _os.path.dirname(torch.__file__)
    return {
        "pid": _os.getpid(),
        "cwd": _os.getcwd(),
        "executable": _sys.executable,
        "prefix": _sys.prefix,
        "base_prefix": _sys.base_prefix,
        "path": list(_sys.path),
        "token": token,
        "spark_home": _os.environ.get("SPARK_HOME"),
        "pyspark": pyspark.__file__,
        "torch_include": _os.path.isdir(_os.path.join(torch_dir, "include")),
        "modules": {m.__name__: _os.path.realpath(m.__file__) for m in (torch, numpy, torchspark)},
    }


builder = SparkSession.builder.master("local-cluster[2,1,1024]").appName("torchspark-shipped-env")
for key, value in {
    **conf,
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.locality.wait": "0",
    "spark.ui.enabled": "false",
    "spark.barrier.sync.timeout": "120",
    "spark.python.worker.reuse": "true",
    "spark.python.daemon.module": "torchspark.spark._daemon",
    "spark.ui.showConsoleProgress": "false",
}.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
try:
    sc = spark.sparkContext
    before = sc.parallelize(range(8), 8).map(describe).collect()
    train, test = datasets.digits("train"), datasets.digits("test")
    net = Network(shipped_model.build(), updater=optim.Adam(lr=1e-3), seed=0)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, averaging_frequency=5, num_workers=2, rng_seed=0, rendezvous_timeout_s=120
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.fit(sc.parallelize(train.split(64), 4), epochs=4)
    spark_net.delete_temp_files()
    after = sc.parallelize(range(8), 8).map(describe).collect()
    print(
        json.dumps(
            {
                "driver": {"pid": os.getpid(), "executable": sys.executable, "prefix": sys.prefix},
                "workers": before + after,
                "accuracy": net.evaluate(test).accuracy(),
                "token": shipped_model.TOKEN,
            }
        )
    )
finally:
    app_id = spark.sparkContext.applicationId
    spark.stop()
    # local-cluster executors work (and unpack the archive) in SPARK_HOME/work/<app id>: remove this run's
    from pyspark.find_spark_home import _find_spark_home

    shutil.rmtree(os.path.join(_find_spark_home(), "work", app_id), ignore_errors=True)
