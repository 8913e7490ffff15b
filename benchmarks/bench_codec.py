"""Threshold codec throughput, single thread, against a memcpy of the same float32 buffer.

Run: ``PYTHONPATH=src python benchmarks/bench_codec.py [--n 10000000] [--reps 7]``

Prints, per density, encode and decode throughput in GB/s of float32 update (4*N bytes / time) and as a ratio of
``tensor.copy_`` on the same buffer. Encode includes ``residual += update``. "torch path" forces the generic torch
kernels (what CUDA uses) on CPU, to show what the numpy CPU path buys.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

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
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = args.n
    gb = 4 * n / 1e9

    src = torch.randn(n)
    dst = torch.empty(n)
    t_copy = _best(lambda: dst.copy_(src), lambda: None, args.reps)
    log.info("N=%d float32 (%.0f MB), 1 thread; memcpy (copy_) %.2f GB/s", n, 4 * n / 1e6, gb / t_copy)
    log.info("%-9s %-11s %-7s %9s %8s %9s %8s %8s", "density", "path", "format", "enc GB/s", "enc/cpy",
             "dec GB/s", "dec/cpy", "MB sent")

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
            log.info("%-9s %-11s %-7s %9.2f %8.2f %9.2f %8.2f %8.2f", f"{msg.density:.4f}",
                     "torch path" if force_torch else "default", msg.format, gb / t_enc, t_copy / t_enc,
                     gb / t_dec, t_copy / t_dec, msg.nbytes / 1e6)


if __name__ == "__main__":
    main()
