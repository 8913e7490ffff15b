"""Cost model of one gradient-sharing exchange step for N workers (``docs/scaling.md`` explains and uses it).

Run: ``.venv/bin/python benchmarks/scaling_model.py [--params 3.7e6] [--density 1e-3] [--gbit 1]`` prints the
predicted milliseconds per step for N = 4 .. 1,000 and the crossover worker counts. Nothing is measured or written.

The three ways to combine N workers' updates every step, with ``L`` parameters, each worker sending ``k = rho * L``
entries (``rho``: the fraction of parameters a threshold-encoded message carries; 1e-3 is the adaptive threshold's
aim, 1e-2 its upper band), link bandwidth ``B`` bytes/s per direction and a per-message latency ``a``:

- **dense ring all-reduce** (DDP, parameter averaging with ``averaging_frequency=1``): every worker sends and
  receives ``2 (N-1)/N * 4L`` bytes in ``2 (N-1)`` latency-bound steps, and adds ``(N-1)/N * L`` floats;
- **plain all-gather** (``topology="all_gather"``): two gloo allgathers (the sizes, then the messages), each a
  ring of ``N-1`` steps forwarding one worker's message, so every worker receives ``(N-1) m`` bytes
  (``m = 4k + 29``) in ``2 (N-1)`` latencies; then it merges the ``N`` sparse messages into a sum at the union of
  their entries (``min(N k, L)``, ``sparse_decode_sum``) and applies that (bitmap messages: decoded into a fresh
  dense sum, applied densely);
- **sharded** (``topology="sharded"``): an all-to-all of sizes and one of pieces (``~m/N`` each, counted as
  ``2 (N-1)`` latency steps), each worker decodes its shard's ``N`` pieces (``~k`` entries in all) into a fresh
  shard buffer and encodes the shard sum (``s`` bytes: sparse ``8 u`` for ``u = min(k, L/N)`` distinct entries
  when messages do not overlap, or dense ``4 L/N``, whichever is smaller), then the byte all-gather of the ``N``
  shard sums (``2 (N-1)`` latencies, ``(N-1) s`` bytes); a union of at most 1/8 of the parameters stays values at
  its indices and is applied there, a larger one (or dense shard sums) is assembled in a fresh parameter-sized
  buffer ``S_t`` and applied densely.

Constants (``Rates``) are per core of the development VM: per-entry decode and apply, per bitmap element and the
per-message cost from ``bench_codec.py`` and ``profile_sharing_step.py``; the union merge (``sum_entry``) and the
fresh-buffer cost (``fresh_element``) fitted to the namespace-cluster measurements of ``bench_scaling.py``. The
model ignores CPU contention between workers, gloo's own copies and the kernel's TCP work (measured: a few ms per
step at 1 Gbit/s, see docs/scaling.md), and overlap with computation (``overlap=True`` hides up to one compute step
of exchange time).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

__all__ = ["Link", "Rates", "dense_ring_s", "all_gather_s", "sharded_s", "crossover", "message_bytes", "HEADER_BYTES"]

#: torchspark.training.algorithms.sharing.sharded.SPARSE_APPLY_MAX_FRACTION: a sharded step applies S_t at its indices while
#: it has at most this fraction of the parameters non-zero, densely beyond
SPARSE_APPLY_MAX_FRACTION = 1 / 8

#: bytes of an encoded message's header (``torchspark.encoding.wire``) plus the flag byte
HEADER_BYTES = 29


@dataclass(frozen=True)
class Link:
    """One worker's link: ``bandwidth`` bytes/s per direction and ``latency`` seconds per message hop."""

    bandwidth: float = 125e6  # 1 Gbit/s
    latency: float = 50e-6


@dataclass(frozen=True)
class Rates:
    """Per-core CPU costs (seconds). ``sum_entry`` and ``fresh_element`` were fitted to the namespace-cluster
    measurements (``bench_scaling.py``, docs/scaling.md); the others come from ``bench_codec.py`` and
    ``profile_sharing_step.py``."""

    decode_entry: float = 12e-9  # per sparse entry decoded into a dense buffer
    # per entry merged into the sparse union sum (sparse_decode_sum; stable-sort kernel): the cluster's per-entry
    # thread CPU (52.5 ns) less apply and framing, in-process 19-43 ns at L = 3.7 M (the np.unique kernel: 45e-9)
    sum_entry: float = 38e-9
    apply_entry: float = 10e-9  # per entry of params[indices] -= values
    bitmap_element: float = 0.52e-9  # per element of a decoded bitmap
    copy_element: float = 0.28e-9  # per float copied or scanned (torch.nonzero)
    add_float: float = 0.25e-9  # per float added (dense)
    fresh_element: float = 0.8e-9  # per element of a new zeroed float32 buffer (torch.zeros of a shard or of S_t)
    per_message: float = 100e-6  # per message handled: parse, validate, Python


def message_bytes(params: float, density: float) -> float:
    """Bytes of one encoded message: sparse (4 bytes per entry) or the 2-bit bitmap, whichever is smaller."""
    return min(4 * density * params, params / 4) + HEADER_BYTES


def _is_bitmap(params: float, density: float) -> bool:
    return 4 * density * params > params / 4


def _decode_s(params: float, density: float, rates: Rates) -> float:
    k = density * params
    return params * rates.bitmap_element if _is_bitmap(params, density) else k * rates.decode_entry


def dense_ring_s(workers: int, params: float, link: Link, rates: Rates = Rates()) -> float:
    """Seconds for one ring all-reduce of ``params`` float32 values (no compression)."""
    if workers <= 1:
        return 0.0
    share = (workers - 1) / workers
    return 2 * share * 4 * params / link.bandwidth + 2 * (workers - 1) * link.latency + share * params * rates.add_float


def all_gather_s(workers: int, params: float, density: float, link: Link, rates: Rates = Rates()) -> float:
    """Seconds for one plain all-gather step: ring transfer of every message, decode of all, apply of the union."""
    union = min(workers * density * params, params)  # no overlap between the workers' entries: the worst case
    # two ring all-gathers (the sizes, then the messages padded to the largest)
    transfer = (workers - 1) * (2 * link.latency + message_bytes(params, density) / link.bandwidth)
    if _is_bitmap(params, density):  # bitmaps are decoded into a fresh dense sum, applied densely
        decode = workers * (rates.per_message + _decode_s(params, density, rates))
        return transfer + decode + params * (rates.fresh_element + rates.add_float)
    # sparse (the training loop's _exchange_sparse): the N messages merged into a sum at the union's indices
    decode = workers * (rates.per_message + density * params * rates.sum_entry)
    return transfer + decode + union * rates.apply_entry


def sharded_s(workers: int, params: float, density: float, link: Link, rates: Rates = Rates()) -> float:
    """Seconds for one sharded step: all-to-all of sizes and pieces, decode of this shard's pieces, ring all-gather
    of the shard sums (sparse index/value or dense, whichever is smaller), assembly and apply of the union."""
    shard = params / workers
    union = min(workers * density * params, params)
    per_shard = union / workers
    sum_bytes = min(8 * per_shard, 4 * shard) + HEADER_BYTES
    scatter = (
        2 * (workers - 1) * link.latency + (workers - 1) / workers * message_bytes(params, density) / link.bandwidth
    )
    # N pieces (one message's entries) decoded into a fresh shard, which is then scanned for its non-zeros
    pieces = (
        workers * rates.per_message
        + _decode_s(params, density, rates)
        + shard * (rates.fresh_element + rates.copy_element)
    )
    gather = (workers - 1) * (2 * link.latency + sum_bytes / link.bandwidth)  # two ring all-gathers, as above
    dense_sums = 8 * per_shard > 4 * shard
    if dense_sums or union > params * SPARSE_APPLY_MAX_FRACTION:  # a fresh parameter-sized S_t, applied densely
        # dense shard sums are copied in; sparse ones scattered at their indices (measured: not free, see the doc)
        fill = params * rates.copy_element if dense_sums else union * rates.decode_entry
        assemble = workers * rates.per_message + params * rates.fresh_element + fill
        return scatter + pieces + gather + assemble + params * rates.add_float
    # sparse shard sums: S_t stays values at the union's indices, applied there (no parameter-sized buffer)
    assemble = workers * rates.per_message + union * rates.decode_entry
    return scatter + pieces + gather + assemble + union * rates.apply_entry


def crossover(
    first, second, params: float, density: float, link: Link, rates: Rates = Rates(), limit: int = 100_000
) -> int | None:
    """The smallest worker count ``N >= 2`` at which ``second`` is faster than ``first`` (None up to ``limit``).

    ``first`` / ``second`` are :func:`all_gather_s` / :func:`sharded_s`, or :func:`dense_ring_s` wrapped to take
    the density (``lambda n, p, d, l, r: dense_ring_s(n, p, l, r)``).
    """

    def faster(n: int) -> bool:
        return second(n, params, density, link, rates) < first(n, params, density, link, rates)

    previous, n = 1, 2
    while n <= limit:
        if faster(n):  # geometric steps above 64 workers: the first faster count lies in (previous, n]
            return next(m for m in range(previous + 1, n + 1) if faster(m))
        previous, n = n, (n + 1 if n < 64 else int(math.ceil(n * 1.05)))
    return None


def _dense(n: int, p: float, d: float, link: Link, rates: Rates) -> float:
    return dense_ring_s(n, p, link, rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=3.7e6)
    parser.add_argument("--density", type=float, default=1e-3)
    parser.add_argument("--gbit", type=float, default=1.0, help="link bandwidth in Gbit/s")
    parser.add_argument("--latency-us", type=float, default=50.0)
    args = parser.parse_args()
    link = Link(args.gbit * 125e6, args.latency_us * 1e-6)
    print(
        f"L = {args.params:.3g} parameters, density {args.density:g}, {args.gbit:g} Gbit/s, "
        f"{args.latency_us:g} us per hop: ms per step"
    )
    print(f"{'workers':>8} {'dense ring':>11} {'all-gather':>11} {'sharded':>9}")
    for n in (4, 8, 16, 32, 64, 128, 256, 512, 1000):
        print(
            f"{n:>8} {1e3 * dense_ring_s(n, args.params, link):>11.2f} "
            f"{1e3 * all_gather_s(n, args.params, args.density, link):>11.2f} "
            f"{1e3 * sharded_s(n, args.params, args.density, link):>9.2f}"
        )
    print(
        "sharded faster than all-gather from N =", crossover(all_gather_s, sharded_s, args.params, args.density, link)
    )
    print(
        "dense ring faster than all-gather from N =", crossover(all_gather_s, _dense, args.params, args.density, link)
    )


if __name__ == "__main__":
    main()
