"""Where a warm call's fixed cost goes: the timeline of one ``fit`` of one epoch, for Spark averaging and
ParallelWrapper averaging on LeNet (the per-call overhead of bench_throughput.py: ``T(1) - slope``).

Run: ``.venv/bin/python benchmarks/timeline_call.py [--methods spark_avg,pw_avg] [--calls 3] [--write]`` (one to
two minutes). ``--write`` stores ``benchmarks/results/call_timeline.json``.

Each method is set up as in ``bench_throughput.py`` (LeNet, 6,144 samples, 2 workers, batch 32 per worker,
averaging every 5), warmed by one untimed call, then called ``--calls`` times with training stats on. For each call
it prints, on the driver's clock from the call's start: the driver's phases (``broadcast`` = building the task,
``fit`` = the runner from stage/process launch to the last result) and, per worker, the first and last phase it
recorded. ``lead-in`` is from the call's start to the first worker phase (task launch, process spawn, rendezvous,
progress connection, network build), ``training`` the workers' phases, ``tail`` from the last worker phase to the
call's return (results, merge, stats). The medians over calls go into the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import _common as C  # noqa: E402
import bench_throughput as B  # noqa: E402


def timeline(stats: Any, call_start: float, call_end: float) -> dict[str, float]:
    """Seconds from the call's start: driver phases, first/last worker phase, lead-in, tail."""
    ev = stats.events()
    names, workers = list(ev.phase_names), list(ev.worker_names)
    out: dict[str, float] = {"call_s": call_end - call_start}
    driver = workers.index("driver") if "driver" in workers else -1
    for i in range(len(ev.phase)):
        name = names[ev.phase[i]]
        start, dur = float(ev.start[i]), float(ev.duration[i])
        if ev.worker[i] == driver:
            out[f"driver {name} start"] = start - call_start
            out[f"driver {name} s"] = out.get(f"driver {name} s", 0.0) + dur
    wmask = ev.worker != driver
    first = float(ev.start[wmask].min())
    last = float((ev.start[wmask] + ev.duration[wmask]).max())
    for w, wname in enumerate(workers):
        if w == driver:
            continue
        m = ev.worker == w
        by_phase = {names[p]: float(ev.duration[m & (ev.phase == p)].sum()) for p in set(ev.phase[m].tolist())}
        for k, v in by_phase.items():
            out[f"{wname} {k} s"] = v
    out["lead-in s (call start -> first worker phase)"] = first - call_start
    out["training s (first -> last worker phase)"] = last - first
    out["tail s (last worker phase -> call returns)"] = call_end - last
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="spark_avg,pw_avg")
    parser.add_argument("--model", default="lenet", choices=("lenet", "mlp"))
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    args.batch, args.n = 64, 6144 if args.model == "lenet" else 8192
    torch.set_num_threads(2)
    from torchspark.spark import local_session

    spark = local_session(cores=2, app_name="torchspark-timeline")
    data = B.make_data(args.model, args.n)
    results: dict[str, Any] = {}
    try:
        for m in [x.strip() for x in args.methods.split(",") if x.strip()]:
            obj = B.METHOD_CLASSES[m]()
            obj.setup(args.model, data, args, spark)
            obj.run(1)  # warm-up
            target = obj.snet if hasattr(obj, "snet") else obj.pw
            target.collect_training_stats = True
            calls = []
            for _ in range(args.calls):
                t0 = time.time()
                obj.run(1)
                calls.append(timeline(target.training_stats, t0, time.time()))
            obj.teardown()
            keys = sorted({k for c in calls for k in c}, key=lambda k: statistics.median(c.get(k, 0) for c in calls))
            results[m] = {k: statistics.median(c.get(k, 0.0) for c in calls) for k in keys}
            C.log(f"{m}: " + ", ".join(f"{k} {v:.3f}" for k, v in results[m].items()))
    finally:
        spark.stop()
    lines = [f"{args.model}, {args.n} samples, {args.calls} warm calls each; load average {C.load_average()}\n"]
    for m, tl in results.items():
        lines += [f"{B.LABELS[m]}:\n", "| event | seconds (median) |", "|---|---:|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in tl.items()]
        lines.append("")
    print("\n".join(lines))
    if args.write:
        (C.RESULTS_DIR / "call_timeline.json").write_text(
            json.dumps({"args": vars(args), "load_average": C.load_average(), "methods": results}, indent=2)
        )


if __name__ == "__main__":
    main()
