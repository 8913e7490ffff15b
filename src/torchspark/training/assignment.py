"""Which worker trains which minibatch: one deterministic plan shared by Spark and ParallelWrapper.

Minibatches keep one global order; after an optional seeded permutation, minibatch ``p`` of ``L`` goes to worker
``p * n // L``: contiguous, equal (+-1) blocks. Because Spark's export and direct routes and ParallelWrapper all
use this plan, they train on identical per-worker sequences for the same seed.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import numpy as np

__all__ = ["assign_balanced", "split_for_workers"]

T = TypeVar("T")


def assign_balanced(total: int, num_workers: int, rng_seed: int | None) -> np.ndarray:
    """Worker index of each minibatch ``0..total-1``: contiguous, equal (+-1) blocks after an optional permutation.

    Returns ``(worker, position)`` pairs packed as an ``(total, 2)`` int64 array: minibatch ``g`` goes to
    ``worker[g]`` at ``position[g]`` in that worker's order.
    """
    order = np.arange(total) if rng_seed is None else np.random.default_rng(rng_seed).permutation(total)
    slot = np.empty(total, dtype=np.int64)
    slot[order] = np.arange(total)  # slot[g]: where minibatch g lands in the permuted order
    workers = slot * num_workers // max(total, 1)
    return np.stack([workers, slot], axis=1)


def split_for_workers(items: Sequence[T], num_workers: int, rng_seed: int | None) -> list[list[T]]:
    """``items`` split into per-worker lists following :func:`assign_balanced`."""
    plan = assign_balanced(len(items), num_workers, rng_seed)
    buckets: list[list[tuple[int, T]]] = [[] for _ in range(num_workers)]
    for item, (w, pos) in zip(items, plan):
        buckets[int(w)].append((int(pos), item))
    return [[x for _, x in sorted(b, key=lambda t: t[0])] for b in buckets]
