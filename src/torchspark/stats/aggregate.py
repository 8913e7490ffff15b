"""Reducing millions of events to what a report can draw: time buckets, binned durations, downsampled series.

Pure numpy functions; the HTML report (`torchspark.stats.html`) draws their results.
"""

from __future__ import annotations

import numpy as np

__all__ = ["timeline_occupancy", "stacked_fractions", "log_histogram", "downsample_series", "mean_by_key"]


def timeline_occupancy(
    worker: np.ndarray,
    phase: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    n_workers: int,
    n_phases: int,
    t0: float,
    t1: float,
    buckets: int,
) -> np.ndarray:
    """Seconds each worker spent in each phase within each of ``buckets`` equal time buckets of ``[t0, t1]``.

    Steps:
      1. Covered time up to ``t`` of one (worker, phase) group is ``C(t) = sum_{s<t}(t - s) - sum_{e<t}(t - e)``
         over its starts ``s`` and ends ``e`` (``min(t - s, d) = (t - s) - max(t - e, 0)``).
      2. With sorted starts / ends and prefix sums, ``C`` at the ``buckets + 1`` edges costs two searchsorted calls.
      3. Bucket occupancy is the difference of ``C`` at consecutive edges.
    Times are shifted by ``t0`` first so the prefix sums keep sub-millisecond precision on epoch-second values.

    Args:
        worker, phase: int codes, shape (n,).
        start, duration: float seconds, shape (n,).
        n_workers, n_phases: sizes of the code tables.
        t0, t1: time range to cover (``t1 > t0``).
        buckets: number of columns (a few hundred is plenty for a screen).

    Returns:
        float64 array (n_workers, n_phases, buckets) of seconds; overlapping events of one group add up.
    """
    edges = np.linspace(0.0, t1 - t0, buckets + 1)
    out = np.zeros((n_workers, n_phases, buckets))
    if start.size == 0:
        return out
    s_all = start - t0
    e_all = s_all + duration
    key = worker.astype(np.int64) * n_phases + phase
    order = np.argsort(key, kind="stable")
    key_sorted = key[order]
    bounds = np.flatnonzero(np.diff(key_sorted)) + 1
    for idx in np.split(order, bounds):
        k = int(key[idx[0]])
        cover = _covered(np.sort(s_all[idx]), edges) - _covered(np.sort(e_all[idx]), edges)
        out[k // n_phases, k % n_phases] = np.diff(cover)
    return np.maximum(out, 0.0)  # rounding can leave -1e-12


def _covered(points_sorted: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``sum_{p < t} (t - p)`` for each ``t``."""
    n = np.searchsorted(points_sorted, t, side="left")
    prefix = np.concatenate([[0.0], np.cumsum(points_sorted)])
    return n * t - prefix[n]


def stacked_fractions(occupancy: np.ndarray, bucket_seconds: float) -> np.ndarray:
    """Cumulative per-phase busy fractions per bucket, for a stacked timeline.

    Args:
        occupancy: (workers, phases, buckets) seconds from `timeline_occupancy`.
        bucket_seconds: bucket width in seconds.

    Returns:
        (workers, phases, buckets) array in [0, 1]: ``out[w, p, b]`` is the fraction of bucket ``b`` that worker
        ``w`` spent in phases ``0..p``. Where a worker's phases overlap (nested timers) and add up to more than the
        bucket, the fractions are scaled down to sum to 1.
    """
    frac = occupancy / bucket_seconds if bucket_seconds > 0 else np.zeros_like(occupancy)
    total = frac.sum(axis=1, keepdims=True)
    frac = np.where(total > 1.0, frac / np.maximum(total, 1e-300), frac)
    return np.clip(np.cumsum(frac, axis=1), 0.0, 1.0)


def log_histogram(values: np.ndarray, bins: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Counts of positive ``values`` in log-spaced bins (durations span orders of magnitude).

    Returns:
        ``(edges, counts)`` with ``len(edges) == len(counts) + 1``; zeros are counted in the first bin.
    """
    v = values[np.isfinite(values)]
    if v.size == 0:
        return np.array([0.0, 1.0]), np.zeros(1, dtype=np.int64)
    positive = v[v > 0]
    lo = positive.min() if positive.size else 1e-9
    hi = max(v.max(), lo * 1.0001)
    if hi / lo < 1.01:  # all durations nearly equal: widen a little so there is something to look at
        lo, hi = lo / 1.5, hi * 1.5
    edges = np.geomspace(lo, hi, bins + 1)
    counts, _ = np.histogram(np.clip(v, lo, hi), bins=edges)
    return edges, counts


def downsample_series(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: ``x`` sorted, split into equal-count groups, each replaced by its mean.

    Means keep the trend of a noisy loss curve; spikes shrink (this is a picture, not an audit).
    """
    order = np.argsort(x, kind="stable")
    x, y = x[order].astype(np.float64), y[order].astype(np.float64)
    if x.size <= max_points:
        return x, y
    starts = np.linspace(0, x.size, max_points + 1).astype(np.int64)[:-1]
    sizes = np.diff(np.concatenate([starts, [x.size]]))
    return np.add.reduceat(x, starts) / sizes, np.add.reduceat(y, starts) / sizes


def mean_by_key(key: np.ndarray, values: np.ndarray, reduce: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """Group ``values`` by integer ``key`` (e.g. step): returns ``(unique keys, mean or sum per key)``."""
    keys, inverse = np.unique(key, return_inverse=True)
    sums = np.bincount(inverse, weights=values.astype(np.float64), minlength=keys.size)
    if reduce == "sum":
        return keys, sums
    return keys, sums / np.bincount(inverse, minlength=keys.size)
