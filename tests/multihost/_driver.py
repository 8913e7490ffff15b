"""A torchspark driver for the namespace cluster, run by ``test_multihost.py`` in its own interpreter (one
SparkContext per process; the suite's own session is a local one).

Usage: ``_driver.py OUT_DIR SCENARIO [SCENARIO...]`` with the Spark settings as JSON in ``TORCHSPARK_CLUSTER_CONF``
(:meth:`NetnsCluster.run_driver`). A scenario is ``name:kind`` plus ``key=value`` options joined by commas, e.g.
``avg:averaging`` or ``ports:sharing,network_mask=198.18.5.0/24,port_range=41000-41050``. For each it writes
``OUT_DIR/<name>.safetensors`` (parameters and updater state) and ``OUT_DIR/<name>.json`` (what every worker
reported about its transport).
"""

from __future__ import annotations

import json
import os
import sys

from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _scenario import build, parse  # noqa: E402

from torchspark.spark import SparkNetwork  # noqa: E402


def main() -> None:
    from pyspark.sql import SparkSession

    out_dir, specs = sys.argv[1], sys.argv[2:]
    builder = SparkSession.builder.appName("torchspark-multihost")
    for key, value in json.loads(os.environ["TORCHSPARK_CLUSTER_CONF"]).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        for spec in specs:
            name, kind, options = parse(spec)
            net, master, data = build(kind, options, export_directory=os.path.join(out_dir, f"export-{name}"))
            spark_net = SparkNetwork(spark, net, master, progress=False)
            spark_net.fit(spark.sparkContext.parallelize(data, 2), epochs=1)
            spark_net.delete_temp_files()
            save_file(
                {"params": net.params().contiguous(), "updater": net.updater_state().contiguous()},
                os.path.join(out_dir, f"{name}.safetensors.tmp"),
            )
            os.replace(os.path.join(out_dir, f"{name}.safetensors.tmp"), os.path.join(out_dir, f"{name}.safetensors"))
            report = [
                {"rank": r.rank, "examples": r.examples, "threads": r.threads, "network": getattr(r, "network", None)}
                for r in spark_net.last_results
            ]
            with open(os.path.join(out_dir, f"{name}.json.tmp"), "w") as f:
                json.dump(report, f)
            os.replace(os.path.join(out_dir, f"{name}.json.tmp"), os.path.join(out_dir, f"{name}.json"))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
