"""Threshold codec throughput, single thread, against a memcpy of the same float32 buffer.

Run: ``PYTHONPATH=src python benchmarks/bench_codec.py [--quick] [--n 10000000] [--reps 7]``
(``--quick``: N=2,000,000, 3 repetitions). Writes its section of ``BENCHMARKS.md`` (``--no-write`` to skip).

Prints, per density, encode and decode throughput in GB/s of float32 update (4*N bytes / time) and as a ratio of
``tensor.copy_`` on the same buffer. Encode includes ``residual += update``. "torch path" forces the generic torch
kernels (what CUDA uses) on CPU, to show what the numpy CPU path buys.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from torchspark.encoding import decode, threshold_encode

log = logging.getLogger("bench_codec")


def _best(fn: Callable[[], object], setup: Callable[[], object], reps: int) -> float:
    """Best wall time of ``fn`` over ``reps`` runs, each after an untimed ``setup``."""
    setup()
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        setup()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="N=2,000,000 and 3 repetitions")
    parser.add_argument("--n", type=int, default=None, help="elements (default 10,000,000)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions, best kept (default 7)")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not update BENCHMARKS.md")
    args = parser.parse_args()
    args.n = args.n or (2_000_000 if args.quick else 10_000_000)
    args.reps = args.reps or (3 if args.quick else 7)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = args.n
    gb = 4 * n / 1e9

    src = torch.randn(n)
    dst = torch.empty(n)
    t_copy = _best(lambda: dst.copy_(src), lambda: None, args.reps)
    log.info("N=%d float32 (%.0f MB), 1 thread; memcpy (copy_) %.2f GB/s", n, 4 * n / 1e6, gb / t_copy)
    log.info(
        "%-9s %-11s %-7s %9s %8s %9s %8s %8s",
        "density",
        "path",
        "format",
        "enc GB/s",
        "enc/cpy",
        "dec GB/s",
        "dec/cpy",
        "MB sent",
    )

    update = torch.randn(n)
    residual = torch.empty(n)
    out = torch.zeros(n)
    for density in (0.001, 0.05, 0.2):
        # threshold so that `density` of |update| reaches it, starting from a zero residual each run
        threshold = float(torch.quantile(update[:1_000_000].abs(), 1 - density))
        for force_torch in (False, True):

            def enc(ft: bool = force_torch) -> object:
                return threshold_encode(update, residual, threshold, _force_torch=ft)

            t_enc = _best(enc, residual.zero_, args.reps)
            residual.zero_()
            msg = threshold_encode(update, residual, threshold, _force_torch=force_torch)
            t_dec = _best(lambda ft=force_torch: decode(msg, out, _force_torch=ft), lambda: None, args.reps)
            log.info(
                "%-9s %-11s %-7s %9.2f %8.2f %9.2f %8.2f %8.2f",
                f"{msg.density:.4f}",
                "torch path" if force_torch else "default",
                msg.format,
                gb / t_enc,
                t_copy / t_enc,
                gb / t_dec,
                t_copy / t_dec,
                msg.nbytes / 1e6,
            )
            rows.append(
                {
                    "target_density": density,
                    "density": msg.density,
                    "path": "torch path" if force_torch else "default",
                    "format": msg.format,
                    "enc_gbs": gb / t_enc,
                    "enc_vs_copy": t_copy / t_enc,
                    "dec_gbs": gb / t_dec,
                    "dec_vs_copy": t_copy / t_dec,
                    "mb_sent": msg.nbytes / 1e6,
                }
            )
    if args.write:
        write_report(args, gb / t_copy, rows, time.perf_counter() - t_start)


def write_report(args: argparse.Namespace, copy_gbs: float, rows: list[dict[str, Any]], elapsed: float) -> None:
    """This benchmark's section of BENCHMARKS.md (via benchmarks/_common.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _common as C

    headers = [
        "density",
        "path",
        "format",
        "encode GB/s",
        "encode / memcpy",
        "decode GB/s",
        "decode / memcpy",
        "MB sent",
    ]
    table = [
        [
            f"{r['density']:.4f}",
            r["path"],
            r["format"],
            r["enc_gbs"],
            f"{r['enc_vs_copy']:.2f}x",
            r["dec_gbs"],
            f"{r['dec_vs_copy']:.2f}x",
            r["mb_sent"],
        ]
        for r in rows
    ]
    default = {r["target_density"]: r for r in rows if r["path"] == "default"}
    summary = "; ".join(
        f"{100 * d:g}% density: encode {default[d]['enc_gbs']:.2f} GB/s = {default[d]['enc_vs_copy']:.2f}x memcpy"
        for d in (0.001, 0.05)
        if d in default
    )
    md = [
        "## Threshold codec (encode/decode throughput, 1 core)\n",
        f"{C.stamp()} Run time {elapsed:.0f} s{' (--quick)' if args.quick else ''}.\n",
        f"`benchmarks/bench_codec.py`: N = {args.n:,} float32 elements ({4 * args.n / 1e6:.0f} MB), "
        f"`torch.set_num_threads(1)`, best of {args.reps} repetitions. Throughput is GB/s of float32 update "
        "(4 x N bytes / time); encode includes `residual += update` and the residual update; "
        '"/ memcpy" is the ratio to `tensor.copy_` of the same buffer '
        f'({copy_gbs:.2f} GB/s here). "torch path" forces the generic torch kernels (what CUDA uses) on CPU.\n',
        C.markdown_table(headers, table) + "\n",
        f"Per core: {summary}.\n",
    ]
    C.write_section(
        "codec", "\n".join(md), {"n": args.n, "reps": args.reps, "memcpy_gbs": copy_gbs, "rows": rows, "targets": []}
    )


if __name__ == "__main__":
    main()
