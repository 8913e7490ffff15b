"""The GPU check: does torchspark train, encode and communicate correctly on this machine's GPU, and how fast.

Run: ``python benchmarks/gpu_check.py [--out gpu_check.json] [--quick] [--budget-s 420]``

Needs only torch and torchspark's core dependencies (no Spark, no Java, nothing downloaded); runs from a source
checkout without installing (it puts ``src/`` on the path). With CUDA every check runs on ``cuda:0``; without, the
same checks run on the CPU at small sizes and the output says so. Each check runs on its own: one that raises is
recorded as ``error`` with its message and the others still run; a check whose API this build lacks (a keyword
other changes add: ``precision=``, ``compile=``, ``accumulate_steps=``) is ``n/a``; checks that would start after
the time budget (``--budget-s``; default 420 s, ``--quick`` 120 s) are ``skipped``. Progress is printed as it goes.

The checks (``_gpu_checks.py`` holds them; each row's ``figures`` in the JSON holds every number):

a. ``fit_device_vs_cpu``: an MLP fitted with SGD on the device and on the CPU from the same weights and data; the
   parameters agree within 1e-4 (float32 with TF32 off; the rest is the summation order of the matrix products).
b. ``codec_bit_equal``: the threshold codec on the device against the CPU's on the same input, at ~0.1% and ~1%
   density (sparse) and ~20% (bitmap): the message bytes, the residual afterwards and the decoded values bit-equal.
c. ``codec_throughput``: encode and decode GB/s of float32 update (4 N bytes / time) on the device against the
   device's own ``copy_`` of the same bytes, at 0.1% and 1% density on a 20M-element vector (2M with ``--quick``),
   timed with CUDA events (median of the repetitions).
d. ``parallel_averaging`` / ``parallel_sharing``: ParallelWrapper with two workers on the GPU(s) present (two on one
   GPU talk over gloo, which nccl refuses; one per GPU with nccl), replicas identical; averaging also equals the same
   fit with CPU workers within 1e-4. The row says which backend ran.
e. ``precision_bf16`` / ``precision_fp16``, ``accumulation_fit``, ``accumulation_masters``, ``compile``: mixed
   precision steps against fp32; ``fit(accumulate_steps=4)`` against one batch 4x as large (SGD, within 1e-5); the
   masters' ``accumulate_steps`` through ParallelWrapper (averaging on one worker equals ``Network.fit``);
   ``torch.compile`` (``compile=True`` on CUDA, the compiler-free ``"aot_eager"`` backend on CPU) against eager,
   with the flat parameter views still the module's parameters.
f. ``pinned_memory``: samples/s of a worker fit (the worker loop, prefetch 2) with ``pin_memory`` on and off, and
   how many pinned host buffers each run took (on a GPU: some with, none without; on the CPU nothing is pinned).

Writes one JSON (``--out``) with every figure and prints a table: check, device, result, status. Exit code 0 when
no check failed or raised.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import _gpu_checks as G  # noqa: E402

#: statuses that make the run fail (exit code 1); "n/a" (API not in this build) and "skipped" (budget) do not
FAILING = ("fail", "error")


def environment(device: str) -> dict[str, Any]:
    """What ran the check: versions, the device, and whether it was a GPU."""
    info: dict[str, Any] = {
        "device": device,
        "cuda": device.startswith("cuda"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if info["cuda"]:
        info.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_count=torch.cuda.device_count(),
            cuda_runtime=torch.version.cuda,
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
        )
    return info


def run_checks(ctx: G.Context, names: list[str]) -> list[dict[str, Any]]:
    """Every named check, in order, each guarded: its rows, or one ``error`` / ``skipped`` row."""
    rows: list[dict[str, Any]] = []
    for name in names:
        if ctx.left() <= 0:
            rows += [
                G.row(n, ctx.device, "skipped", f"time budget of {ctx.budget_s:.0f} s spent")
                for n in G.CHECKS[name].rows
            ]
            print(f"[{ctx.elapsed():6.1f}s] {name}: skipped (budget spent)", flush=True)
            continue
        print(f"[{ctx.elapsed():6.1f}s] {name} ...", flush=True)
        start = time.perf_counter()
        try:
            got = G.CHECKS[name].run(ctx)
        except Exception as e:  # noqa: BLE001 - one check's failure must not stop the others
            got = [G.row(n, ctx.device, "error", f"{type(e).__name__}: {e}"[:400]) for n in G.CHECKS[name].rows]
        seconds = time.perf_counter() - start
        for r in got:
            r["seconds"] = round(seconds, 2)
            print(f"[{ctx.elapsed():6.1f}s]   {r['check']}: {r['status']}: {r['result']}", flush=True)
        rows += got
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (check, device, result, status), ready for BENCHMARKS.md."""
    lines = ["| check | device | result | status |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['device']} | {r['result'].replace('|', '/')} | {r['status']} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_check.json", help="where to write the JSON with every figure")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions (a smoke test)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="checks that would start later than this many seconds are skipped (default 420, --quick 120)",
    )
    parser.add_argument("--device", default=None, help="cuda:0 or cpu (default: cuda:0 when CUDA is available)")
    parser.add_argument("--only", default=None, help="comma-separated subset of " + ", ".join(G.CHECKS))
    args = parser.parse_args(argv)
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    names = list(G.CHECKS) if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(G.CHECKS))
    if unknown:
        parser.error(f"unknown checks {unknown}; known: {list(G.CHECKS)}")
    budget = args.budget_s if args.budget_s is not None else (120.0 if args.quick else 420.0)
    ctx = G.Context(device=device, quick=args.quick, budget_s=budget)
    info = environment(device)
    where = f"{info.get('gpu', '')} ({device})" if info["cuda"] else "the CPU: no CUDA here, small sizes"
    print(
        f"torchspark GPU check on {where}; torch {torch.__version__}; budget {budget:.0f} s"
        + (" (--quick)" if args.quick else ""),
        flush=True,
    )
    with G.exact_float32():
        rows = run_checks(ctx, names)
    failed = [r["check"] for r in rows if r["status"] in FAILING]
    report = {
        **info,
        "quick": args.quick,
        "budget_s": budget,
        "total_seconds": round(ctx.elapsed(), 1),
        "ran_on_gpu": info["cuda"],
        "checks": rows,
        "failed": failed,
        "expected_checks": [n for name in names for n in G.CHECKS[name].rows],
    }
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print()
    if not info["cuda"]:
        print("NOTE: no CUDA on this machine: every check ran on the CPU (small sizes); nothing was measured on a GPU.")
    print(table(rows))
    print(
        f"\n{len(rows)} rows, {len(failed)} failed ({', '.join(failed) or 'none'}); {ctx.elapsed():.1f} s; "
        f"wrote {args.out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
