"""What shuffling between epochs costs: steady samples/s of every data route with and without ``rng_seed``.

Run: ``.venv/bin/python benchmarks/bench_shuffle.py [--quick] [--models mlp,lenet] [--routes direct,export,...]``

The workload of issue 29 (the MLP: N examples of 784 features in cached DataSets of 128 on ``local[2]``; LeNet on
28x28 images), parameter averaging every 5 steps, batch 32 per worker, Adam (lr 1e-3). For every route:

- ``direct``: ``SparkNetwork.fit(rdd)`` with ``rdd_training_approach="direct"`` (repartitioned, persisted);
- ``export``: the default route (batch files written once, names sent to the workers);
- ``paths``: ``fit_paths(directory)`` over batch files exported once with ``export_batches``;
- ``dataframe``: ``fit(DataFrame)`` of an ``array<float>`` features column on the classic session;
- ``pw``: ``ParallelWrapper`` (2 processes) on the in-memory DataSet;

three settings: no seed (the unshuffled baseline), ``rng_seed=0`` (the default ``shuffle_scope="worker"``: each
worker reorders its own minibatches every epoch) and ``rng_seed=0, shuffle_scope="global"`` (a new plan across
workers every epoch). Steady samples/s = ``2N / (T(3 epochs) - T(1))`` on one ``SparkNetwork``/wrapper per setting
(its exports are reused; an untimed warm-up call first); the three settings of a route are interleaved over the
repetitions and the table gives medians. The fused plain loop (``torch.optim.Adam(fused=True)``, 2 threads) is
measured in the same run as the scale of every row.

Targets: the seeded (worker-scope) run of every route within 5% of its unshuffled run; and a regression guard:
every route's unshuffled and seeded samples/s, as a ratio to the fused plain loop of the same run, no more than 10%
below the previous run's ratio (``benchmarks/results/shuffle.json``), so a change that slows a route shows up as
"not met".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import bench_throughput as T  # noqa: E402

ROUTES = ("direct", "export", "paths", "dataframe", "pw")
SETTINGS = {"none": (None, "worker"), "seed": (0, "worker"), "seed_global": (0, "global")}
LABELS = {"none": "no seed", "seed": "rng_seed=0 (worker scope)", "seed_global": "rng_seed=0, global scope"}
BATCH = 32


def _master(route: str, seed: int | None, scope: str) -> Any:
    from torchspark.training import ParameterAveragingTrainingMaster

    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH,
        averaging_frequency=5,
        num_workers=2,
        rng_seed=seed,
        shuffle_scope=scope,
        rdd_training_approach="direct" if route == "direct" else "export",
    )


class Inputs:
    """The data of one model in every form the routes take (made once per model)."""

    def __init__(self, spark: Any, model: str, n: int, workdir: str, routes: list[str]) -> None:
        from torchspark.spark import export_batches

        self.model, self.n = model, n
        self.data = T.make_data(model, n)
        self.rdd = spark.sparkContext.parallelize(T.contiguous_chunks(self.data, 128), 2).cache()
        self.rdd.count()
        self.paths_dir = os.path.join(workdir, f"{model}-batches")
        export_batches(self.rdd, self.paths_dir, BATCH)
        self.frame = None
        if "dataframe" in routes:
            self.frame = _frame(spark, self.data, os.path.join(workdir, f"{model}.parquet"))
        self.shape = tuple(self.data.features.shape[1:])


def _frame(spark: Any, data: Any, path: str) -> Any:
    """The data as a cached ``features array<float>, label long`` DataFrame, written as Parquet by pyarrow.

    Building it from Python rows (``createDataFrame`` of lists) takes minutes at 32k x 784 and strains the driver;
    Arrow writes the same columns in a second.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = np.ascontiguousarray(data.features.reshape(len(data.features), -1).numpy(), dtype=np.float32)
    offsets = np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32)
    features = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.reshape(-1)))
    labels = pa.array(data.labels.numpy().astype(np.int64))
    pq.write_table(pa.table({"features": features, "label": labels}), path)
    frame = spark.read.parquet(path).repartition(2).cache()
    frame.count()
    return frame


def _runner(spark: Any, inputs: Inputs, route: str, seed: int | None, scope: str) -> Callable[[int], None]:
    """``run(epochs)`` of one route and setting on one network (exports kept between calls)."""
    from torchspark.parallel import ParallelWrapper
    from torchspark.spark import SparkNetwork

    net = T.make_network(inputs.model)
    if route == "pw":
        pw = ParallelWrapper(
            net,
            num_workers=2,
            training_mode="averaging",
            averaging_frequency=5,
            rng_seed=seed,
            shuffle_scope=scope,
            batch_size_per_worker=BATCH,
            progress=False,
        )
        return lambda epochs: pw.fit(inputs.data, epochs=epochs)
    sn = SparkNetwork(spark, net, _master(route, seed, scope), progress=False)
    if route == "paths":
        return lambda epochs: sn.fit_paths(inputs.paths_dir, epochs=epochs)
    if route == "dataframe":
        return lambda epochs: sn.fit(
            inputs.frame, features_col="features", label_col="label", feature_shape=inputs.shape, epochs=epochs
        )
    return lambda epochs: sn.fit(inputs.rdd, epochs=epochs)


def _steady(run: Callable[[int], None], n: int) -> tuple[float, float]:
    t1, _ = C.timed(lambda: run(1))
    t3, _ = C.timed(lambda: run(3))
    if t3 <= t1:  # noise larger than two epochs: no steady figure from this pair (the median skips it)
        return float("nan"), t1
    return 2 * n / (t3 - t1), t1 - (t3 - t1) / 2


def _plain(inputs: Inputs, epochs: int) -> float:
    import torch

    args = argparse.Namespace(batch=2 * BATCH)
    plain = T.PlainFused()
    plain.setup(inputs.model, inputs.data, args, None)
    plain.run(1)
    t = time.perf_counter()
    plain.run(epochs)
    torch.set_num_threads(2)
    return epochs * inputs.n / (time.perf_counter() - t)


def measure(spark: Any, inputs: Inputs, routes: list[str], reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"plain_fused": [], "routes": {}}
    runners = {(r, s): _runner(spark, inputs, r, *SETTINGS[s]) for r in routes for s in SETTINGS}
    for key, run in runners.items():
        C.log(f"{inputs.model} {key}: warm-up")
        run(1)
    for rep in range(reps):
        out["plain_fused"].append(_plain(inputs, 2))
        for r in routes:
            order = list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))
            for s in order:
                rate, overhead = _steady(runners[(r, s)], inputs.n)
                out["routes"].setdefault(r, {}).setdefault(s, []).append({"steady": rate, "overhead_s": overhead})
                C.log(f"{inputs.model} rep {rep} {r} {s}: {rate:,.0f}/s (+{overhead:.2f} s per call)")
    return out


def _previous() -> dict[str, Any]:
    path = C.RESULTS_DIR / "shuffle.json"
    try:
        return json.loads(path.read_text()).get("ratios", {})
    except (OSError, json.JSONDecodeError):
        return {}


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    previous = _previous()
    rows, targets, ratios = [], [], {}
    for model, res in results.items():
        plain = C.median(res["plain_fused"])
        for route, by_setting in res["routes"].items():
            med = {s: C.median(m["steady"] for m in ms) for s, ms in by_setting.items()}
            over = {s: C.median(m["overhead_s"] for m in ms) for s, ms in by_setting.items()}
            for s in SETTINGS:
                ratios[f"{model}/{route}/{s}"] = med[s] / plain
                rows.append(
                    [
                        model,
                        route,
                        LABELS[s],
                        f"{med[s]:,.0f}",
                        C.fmt(med[s] / plain),
                        C.fmt(med[s] / med["none"]),
                        C.fmt(over[s]),
                    ]
                )
            cost = med["seed"] / med["none"]
            targets.append(
                {
                    "target": f"{model} {route}: rng_seed costs <= 5% (seeded/unseeded >= 0.95)",
                    "measured": f"{cost:.2f}x",
                    "met": cost >= 0.95,
                }
            )
            for s in ("none", "seed"):
                key, old = f"{model}/{route}/{s}", previous.get(f"{model}/{route}/{s}")
                if old:
                    change = ratios[key] / old
                    targets.append(
                        {
                            "target": f"{model} {route} {LABELS[s]}: no regression > 10% vs the last run",
                            "measured": f"{change:.2f}x of the last run",
                            "met": change >= 0.90,
                        }
                    )
    body = "\n".join(
        [
            "## Shuffle between epochs (rng_seed) on every route",
            "",
            f"{C.stamp()} `benchmarks/bench_shuffle.py{' --quick' if args.quick else ''}` (routes {args.routes}, "
            f"{args.reps or 'default'} repetition(s)). Parameter averaging (every 5), batch 32 per worker, 2 workers on `local[2]`; steady "
            "samples/s = 2N / (T(3) - T(1)), medians over interleaved repetitions. `x plain` is the ratio to the fused "
            "plain loop (2 threads, batch 64) of the same run; `x no seed` to the same route without `rng_seed`.",
            "",
            C.markdown_table(["model", "route", "setting", "samples/s", "x plain", "x no seed", "per-call s"], rows),
        ]
    )
    C.write_section(
        "shuffle", body, {"results": results, "ratios": ratios, "targets": targets, "machine": C.machine_info()}
    )
    C.print_table("shuffle", ["model", "route", "setting", "samples/s", "x plain", "x no seed", "per-call s"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, 1 repetition (development)")
    parser.add_argument("--models", default="mlp,lenet")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--n", type=int, default=None, help="examples per epoch (default 32768 MLP, 8192 LeNet)")
    args = parser.parse_args()
    from torchspark.spark import local_session

    # the direct route persists each setting's repartitioned data in the JVM: the default heap is too small for three
    spark = local_session(2, app_name="bench-shuffle", conf={"spark.driver.memory": "6g"})
    reps = args.reps or (1 if args.quick else 3)
    routes = [r for r in args.routes.split(",") if r]
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for model in args.models.split(","):
            n = args.n or (2048 if args.quick else (32768 if model == "mlp" else 8192))
            results[model] = measure(spark, Inputs(spark, model, n, workdir, routes), routes, reps)
    report(results, args)
    spark.stop()


if __name__ == "__main__":
    main()
