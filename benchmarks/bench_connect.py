"""Spark Connect vs the classic session: per-fit overhead and steady samples/s of ``SparkNetwork.fit(DataFrame)``.

Run: ``.venv/bin/python benchmarks/bench_connect.py [--quick] [--reps 3] [--models mlp,lenet]``

Each route runs in its own child process (a Connect client switches pyspark into Connect mode for the whole
process): ``classic_export`` (a classic ``local[2]`` session, the default ``rdd_training_approach="export"``),
``classic_direct`` (the same with ``"direct"``: minibatches built from the DataFrame and kept in memory),
``classic_arrow`` (the same session with ``dataframe_route="barrier_arrow"``: the Connect route's one barrier
``mapInArrow`` stage on a classic session) and ``connect`` (a Spark Connect server process on ``local[2]``, the
client in the child: one barrier ``mapInArrow`` stage streaming the rows). Same data in every route: ``n`` rows
generated on the server (``features`` 784 doubles, ``label`` 0-9), cached and counted before timing;
ParameterAveragingTrainingMaster with 2 workers, batch 32 per worker, averaging every 5. After one warm-up fit,
each repetition times a 1-epoch and a 3-epoch fit: steady samples/s = 2 n / (T3 - T1), per-fit overhead =
T1 - n / steady. Writes ``benchmarks/results/connect.json`` and prints a table; BENCHMARKS.md "Spark Connect"
holds the numbers of a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROUTES = ("classic_export", "classic_direct", "classic_arrow", "connect")


def _frame(spark: Any, n: int) -> Any:
    from pyspark.sql import functions as F

    features = F.array(*[F.rand(seed=i) for i in range(784)])
    df = spark.range(n).select(features.alias("features"), (F.rand(seed=999) * 10).cast("long").alias("label"))
    df = df.repartition(2).cache()
    df.count()
    return df


def _network(model: str) -> Any:
    from torchspark import Network, models, optim

    module = models.mlp(784, 500, 10) if model == "mlp" else models.lenet(1, 10, 28, 28)
    return Network(module, updater=optim.SGD(lr=0.01, momentum=0.9), seed=0)


def child(route: str, model: str, n: int, reps: int) -> dict[str, Any]:
    """Time the fits of one route in this process; returns the figures."""
    from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork, local_session

    server = None
    if route == "connect":
        from torchspark.spark.connect import start_connect_server

        server = start_connect_server("local[2]")
        spark = server.session()
    else:
        spark = local_session(cores=2, quiet=True)
    try:
        df = _frame(spark, n)
        approach = "direct" if route == "classic_direct" else "export"
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=32,
            num_workers=2,
            averaging_frequency=5,
            rdd_training_approach=approach,
            dataframe_route="barrier_arrow" if route == "classic_arrow" else "rdd",
        )
        shape = (1, 28, 28) if model == "lenet" else None
        net = _network(model)
        with SparkNetwork(spark, net, master, progress=False) as spark_net:

            def fit(epochs: int) -> float:
                start = time.perf_counter()
                spark_net.fit(df, epochs=epochs, feature_shape=shape)
                return time.perf_counter() - start

            fit(1)  # warm-up: Python workers, torch imports, the export or the cache
            t1s, t3s = [], []
            for _ in range(reps):
                t1s.append(fit(1))
                t3s.append(fit(3))
        steady = [2 * n / (t3 - t1) for t1, t3 in zip(t1s, t3s)]
        overhead = [t1 - n / s for t1, s in zip(t1s, steady)]
        return {
            "route": route,
            "model": model,
            "n": n,
            "t1": t1s,
            "t3": t3s,
            "samples_per_s": steady,
            "overhead_s": overhead,
        }
    finally:
        spark.stop()
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", default="mlp,lenet")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        route, model, n = args.child.split(":")
        print("RESULT " + json.dumps(child(route, model, int(n), args.reps)), flush=True)
        return
    sizes = {"mlp": 4096 if args.quick else 16384, "lenet": 2048 if args.quick else 8192}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    rows = []
    for model in args.models.split(","):
        for route in args.routes.split(","):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    f"{route}:{model}:{sizes[model]}",
                    "--reps",
                    str(1 if args.quick else args.reps),
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=3600,
            )
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{route} {model} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(line[len("RESULT ") :]))
            r = rows[-1]
            print(
                f"{model:6s} {route:15s} samples/s median {statistics.median(r['samples_per_s']):9,.0f} "
                f"(min {min(r['samples_per_s']):,.0f} max {max(r['samples_per_s']):,.0f})  per-fit overhead "
                f"median {statistics.median(r['overhead_s']):.2f} s",
                flush=True,
            )
    results = ROOT / "benchmarks" / "results" / "connect.json"
    results.write_text(json.dumps({"load_average": os.getloadavg(), "rows": rows}, indent=1))
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
