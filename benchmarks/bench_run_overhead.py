"""Per-call overhead of ``torchspark.launch.run`` vs ``pyspark.ml.torch.distributor.TorchDistributor`` on the same
function: wall time from the call to its return for a function that does almost nothing distributed (join the
``torch.distributed`` group over gloo, one ``all_reduce`` of one number, leave, rank 0 returns the sum).

Run: ``.venv/bin/python benchmarks/bench_run_overhead.py [--repeats 3] [--workers 2]``

Routes, one classic ``local[2]`` session (``torchspark.spark.local_session``) for all of them, in turn:

- ``torchspark local``: ``run(fn, num_workers=2, local_mode=True)`` (processes forked from the preloaded fork server);
- ``TorchDistributor local``: ``TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(fn)``
  (``torchrun`` on the driver);
- ``torchspark spark``: ``run(fn, num_workers=2, spark=spark)`` (one barrier ``mapInArrow`` stage);
- ``TorchDistributor spark``: ``TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fn)``
  (``torchrun`` inside each barrier task).

Each route is called once untimed (warm-up: the fork server, Spark's Python workers), then ``--repeats`` times;
the table gives the median and the range. The machine's load average is recorded before and after: on a shared
machine the absolute times move with it. Writes ``benchmarks/results/run_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def tiny(value: float) -> float:
    """Join the group, all-reduce one number, leave; rank 0 returns the sum."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([value])
    dist.all_reduce(t)
    rank = dist.get_rank()
    dist.destroy_process_group()
    return float(t.item()) if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--routes", default="ts-local,td-local,ts-spark,td-spark")
    args = parser.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor

    from torchspark.launch import run
    from torchspark.spark import local_session

    spark = local_session(cores=args.workers, app_name="bench-run-overhead")
    n = args.workers
    routes = {
        "ts-local": ("torchspark local", lambda: run(tiny, 1.0, num_workers=n, local_mode=True)),
        "td-local": (
            "TorchDistributor local",
            lambda: TorchDistributor(num_processes=n, local_mode=True, use_gpu=False).run(tiny, 1.0),
        ),
        "ts-spark": ("torchspark spark", lambda: run(tiny, 1.0, num_workers=n, spark=spark)),
        "td-spark": (
            "TorchDistributor spark",
            lambda: TorchDistributor(num_processes=n, local_mode=False, use_gpu=False).run(tiny, 1.0),
        ),
    }
    load_before = os.getloadavg()
    results = {}
    for key in args.routes.split(","):
        name, call = routes[key]
        answers = [call()]  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            answers.append(call())
            times.append(time.perf_counter() - start)
        wrong = sum(a != float(n) for a in answers)  # rank 0's value is the sum over the ranks
        results[name] = {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "max_s": max(times),
            "all_s": times,
            "wrong_answers": wrong,
            "answers": [repr(a) for a in answers],
        }
        if wrong:
            print(f"{name}: {wrong} of {len(answers)} calls did not return rank 0's sum: {answers}", flush=True)
        print(f"{name:24s} median {statistics.median(times):6.2f} s  ({min(times):.2f}-{max(times):.2f})", flush=True)
    load_after = os.getloadavg()
    spark.stop()
    record = {
        "workers": n,
        "repeats": args.repeats,
        "load_before": load_before,
        "load_after": load_after,
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "results": results,
    }
    out = Path(__file__).resolve().parent / "results" / "run_overhead.json"
    out.write_text(json.dumps(record, indent=2))
    print(f"load average before {load_before}, after {load_after}; wrote {out}")


if __name__ == "__main__":
    main()
