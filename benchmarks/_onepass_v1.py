"""The previous one-pass kernel (commit 25f4486, issue 29's first codec run): bench_codec.py's A/B baseline only.

Kept verbatim (``cache=False``: a benchmark-only copy needs no on-disk cache) so the benchmark can time it against
today's :mod:`torchspark.encoding._onepass_kernel` in the same run, interleaved rep by rep. It branches per element on
the entry's sign (``i if v > 0 else -i``), which mispredicts about every second entry at 5% density. Not used by
torchspark itself.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__: list[str] = []  # private module

# Elements per block: the block's add and count run as vector code; only a block with an entry at or above the
# threshold is scanned again (cache-hot) to write the message. 64 elements = 256 bytes: measured best of 16..256 at
# 0.1% density (fewer blocks scanned twice) and close to the best at 5%.
BLOCK = 64


@njit(cache=False, nogil=True, inline="always")
def _add_count(r: np.ndarray, u: np.ndarray, t: np.float32) -> int:
    """``r += u`` (block views); returns how many entries reach ``|r| >= t``. Vectorised: no branch on the data."""
    hits = 0
    for j in range(r.shape[0]):
        v = r[j] + u[j]
        r[j] = v
        if abs(v) >= t:
            hits += 1
    return hits


@njit(cache=False, nogil=True, inline="always")
def _count(r: np.ndarray, t: np.float32) -> int:
    hits = 0
    for j in range(r.shape[0]):
        if abs(r[j]) >= t:
            hits += 1
    return hits


@njit(cache=False, nogil=True, inline="always")
def _sparse_block(r: np.ndarray, start: int, t: np.float32, sparse: np.ndarray, count: int) -> int:
    """Every entry of the block view ``r`` (at ``start``) into the sparse message, without a branch on the data:
    ``sparse[count]`` is written for every element and kept only for entries (``sparse`` has one spare slot)."""
    for j in range(r.shape[0]):
        v = r[j]
        hit = abs(v) >= t
        i = start + j + 1
        sparse[count] = i if v > 0 else -i
        count += 1 if hit else 0
        r[j] = (v - t if v > 0 else v + t) if hit else v  # a select and a store, no branch: v stored back as it was
    return count


@njit(cache=False, nogil=True, inline="always")
def _bitmap_block(r: np.ndarray, start: int, t: np.float32, bitmap: np.ndarray, codes: np.ndarray) -> None:
    """Every entry of the block view ``r`` (at ``start``, a multiple of 4) into the bitmap, without a branch on the
    data (a bitmap means many entries: branches would mispredict): the 2-bit codes into ``codes`` (BLOCK uint8) and
    the residual in one vector loop, then 4 codes per byte."""
    m = r.shape[0]
    for k in range(m):
        v = r[k]
        up = v >= t
        down = v <= -t
        codes[k] = np.uint8((1 if up else 0) | (2 if down else 0))
        r[k] = v - t if up else (v + t if down else v)  # v stored back as it was when neither
    for k in range(m, (m + 3) // 4 * 4):  # the last block's pad codes
        codes[k] = 0
    for q in range((m + 3) // 4):
        bitmap[(start >> 2) + q] = (
            codes[4 * q] | (codes[4 * q + 1] << 2) | (codes[4 * q + 2] << 4) | (codes[4 * q + 3] << 6)
        )


@njit(cache=False, nogil=True)
def _to_bitmap(sparse: np.ndarray, count: int, nbytes: int) -> np.ndarray:
    """The packed 2-bit bitmap of the first ``count`` signed 1-based entries (the sparse message so far)."""
    bitmap = np.zeros(nbytes, dtype=np.uint8)
    for k in range(count):
        e = sparse[k]
        i = (e if e > 0 else -e) - 1
        bitmap[i >> 2] |= np.uint8((1 if e > 0 else 2) << ((i & 3) * 2))
    return bitmap


@njit(cache=False, nogil=True)
def _careful_block(
    r: np.ndarray,
    start: int,
    end: int,
    t: np.float32,
    limit: int,
    cap: int,
    count: int,
    sparse: np.ndarray,
    bitmap: np.ndarray,
    saved_pos: np.ndarray,
    saved_val: np.ndarray,
) -> tuple[int, np.ndarray]:
    """Element by element: the block where the message switches to a bitmap, reaches the cap, or must save values."""
    n_saved = saved_pos.shape[0]
    for j in range(start, end):
        v = r[j]
        if abs(v) >= t and count < cap:
            if count < n_saved:
                saved_pos[count] = j
                saved_val[count] = v
            if count < limit:
                sparse[count] = j + 1 if v > 0 else -(j + 1)
            else:
                if count == limit:
                    bitmap = _to_bitmap(sparse, count, (r.shape[0] + 3) // 4)
                bitmap[j >> 2] |= np.uint8((1 if v > 0 else 2) << ((j & 3) * 2))
            r[j] = v - t if v > 0 else v + t
            count += 1
    return count, bitmap


@njit(cache=False, nogil=True)
def encode(
    r: np.ndarray,
    u: np.ndarray,
    has_update: bool,
    t: np.float32,
    limit: int,
    cap: int,
    sparse: np.ndarray,
    saved_pos: np.ndarray,
    saved_val: np.ndarray,
) -> tuple[int, np.ndarray]:
    """One pass: ``r += u`` (when ``has_update``), and each of the first ``cap`` entries with ``|r| >= t`` is sent
    as ``sign(r)*t`` and subtracted.

    Args (validated by the caller): ``r``/``u`` float32 (N,), ``t`` float32; ``limit``: the largest sparse count
    (``sparse`` holds ``min(limit, cap) + 1`` int32: one spare slot); ``cap``: at most this many entries (the
    boundary, or N); ``saved_pos`` / ``saved_val``: the index and value before the subtraction of the first
    ``len(saved_pos)`` entries, so the caller can undo a message that ends below ``min_entries``.

    Returns:
        ``(count, bitmap)``: the entries sent; a bitmap (``ceil(N/4)`` uint8) when ``count > limit``, else an empty
        array and the message is ``sparse[:count]``.
    """
    n = r.shape[0]
    bitmap = np.zeros(0, dtype=np.uint8)
    n_saved = saved_pos.shape[0]
    codes = np.empty(BLOCK, dtype=np.uint8)  # _bitmap_block's scratch
    count = 0
    done = 0  # elements already added (all of them unless the cap stopped the pass)
    for start in range(0, n, BLOCK):
        if count >= cap:
            break
        end = min(start + BLOCK, n)
        if has_update:
            hits = _add_count(r[start:end], u[start:end], t)
        else:
            hits = _count(r[start:end], t)
        done = end
        if hits:
            fast = count >= n_saved and count + hits <= cap
            if fast and count + hits <= limit:
                count = _sparse_block(r[start:end], start, t, sparse, count)
            elif fast and count > limit:
                _bitmap_block(r[start:end], start, t, bitmap, codes)
                count += hits
            else:
                count, bitmap = _careful_block(
                    r, start, end, t, limit, cap, count, sparse, bitmap, saved_pos, saved_val
                )
    if has_update:  # capped: the rest of the update still goes into the residual
        for j in range(done, n):
            r[j] = r[j] + u[j]
    return count, bitmap
