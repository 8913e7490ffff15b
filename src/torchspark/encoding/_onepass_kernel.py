"""The one-pass threshold encode, compiled with numba (the ``torchspark[fast]`` extra).

Imported only by `torchspark.encoding.fastpath` (lazily, on the first CPU encode), never by ``import
torchspark``: importing numba and loading the compiled code costs ~0.3 s, compiling it the first time a few seconds.
``cache=True`` keeps the machine code on disk (numba's ``__pycache__`` next to this file when writable, else the
user's cache directory, or ``NUMBA_CACHE_DIR``), so only the very first process on a machine pays the compile.

Same float32 arithmetic, element by element, as the numpy path of `_kernels` (``r + u``, ``|r| >= t``,
``r - t`` / ``r + t``), so the message and the residual are bit-identical; the tests compare them. No ``fastmath``:
it lets LLVM assume there is no NaN, and ``|NaN| >= t`` must stay False.

How it avoids mispredicted branches (an entry is a random ~5% of the elements, so a branch per element on "is it an
entry?" or "is it positive?" mispredicts about once per entry, or once per two entries for the sign):

1. Each 64-element block is added and compared in one vector loop that ORs the comparisons into a 64-bit mask
   (one bit per element: no branch on the data, and no second read of the block to find its entries).
2. The block's entries are visited by clearing the mask's lowest set bit (``cttz``): the work is per entry, not per
   element, and the data-dependent branches are per block (any entry? the end of the entry loop).
3. Signs go through LLVM ``select`` (a conditional move, never a branch): ``±(i+1)`` into the message, ``r ∓ t``
   into the residual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__: list[str] = []  # private module

# Elements per block: one uint64 mask. (Two uint32 half-masks, for 8 float32 lanes per vector instead of 4, measured
# no faster, interleaved A/B on 10 M elements.)
BLOCK = 64


def _intrinsic(typer: Callable[..., Any]) -> Any:
    """numba's ``@intrinsic``, typed ``Any`` for mypy (the typer's signature has numba's ``typingctx`` first, so
    mypy would check the jitted calls against it)."""
    return intrinsic(typer)


@_intrinsic
def _select(typingctx: Any, cond: Any, a: Any, b: Any) -> Any:
    """``a if cond else b`` as one LLVM ``select`` (a conditional move): numba turns a Python conditional
    expression into a branch, which mispredicts on random data."""
    if a != b:
        return None
    sig = a(types.boolean, a, b)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.select(args[0], args[1], args[2])

    return sig, codegen


@_intrinsic
def _bit(typingctx: Any, cond: Any) -> Any:
    """The boolean as a uint64 0 / 1 (a zero-extension, no branch)."""
    sig = types.uint64(types.boolean)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.zext(args[0], context.get_value_type(types.uint64))

    return sig, codegen


@_intrinsic
def _lowest_bit(typingctx: Any, mask: Any) -> Any:
    """Index of the lowest set bit of a non-zero uint64 (``tzcnt``)."""
    sig = types.uint64(types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.cttz(args[0], context.get_constant(types.boolean, False))  # defined for 0 too

    return sig, codegen


@_intrinsic
def _popcount(typingctx: Any, mask: Any) -> Any:
    """Set bits of a uint64 (``popcnt``), as int64."""
    sig = types.int64(types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.ctpop(args[0])

    return sig, codegen


# Indices below are uint64 wherever they can be: numba adds a negative-index fix-up to every signed index, which
# keeps LLVM from vectorising the block loops. (Mixing uint64 with int64 makes float64 in numba: keep them apart.)


@njit(cache=True, nogil=True)
def _mask_tail(r: np.ndarray, u: np.ndarray, has_update: bool, start: int, end: int, t: np.float32) -> np.uint64:
    """The last, short block (``end - start < BLOCK``): the same mask, element by element."""
    m = np.uint64(0)
    for j in range(end - start):
        v = r[start + j]
        if has_update:
            v = v + u[start + j]
            r[start + j] = v
        m |= _bit(abs(v) >= t) << np.uint64(j)
    return m


@njit(cache=True, nogil=True)
def _bitmap_block(r: np.ndarray, start: int, end: int, t: np.float32, bitmap: np.ndarray, codes: np.ndarray) -> None:
    """Every entry of ``r[start:end]`` (``start`` a multiple of 4) into the bitmap, without a branch on the data (a
    bitmap means many entries): the 2-bit codes into ``codes`` (BLOCK uint8) and the residual in one vector loop,
    then 4 codes per byte."""
    m = end - start
    for k in range(m):
        v = r[start + k]
        up = v >= t
        down = v <= -t
        codes[k] = np.uint8(_bit(up) | (_bit(down) << np.uint64(1)))
        r[start + k] = _select(up, v - t, _select(down, v + t, v))  # v stored back as it was when neither
    for k in range(m, (m + 3) // 4 * 4):  # the last block's pad codes
        codes[k] = 0
    for q in range((m + 3) // 4):
        bitmap[(start >> 2) + q] = (
            codes[4 * q] | (codes[4 * q + 1] << 2) | (codes[4 * q + 2] << 4) | (codes[4 * q + 3] << 6)
        )


@njit(cache=True, nogil=True)
def _to_bitmap(sparse: np.ndarray, count: int, nbytes: int) -> np.ndarray:
    """The packed 2-bit bitmap of the first ``count`` signed 1-based entries (the sparse message so far)."""
    bitmap = np.zeros(nbytes, dtype=np.uint8)
    for k in range(count):
        e = sparse[k]
        i = (e if e > 0 else -e) - 1
        bitmap[i >> 2] |= np.uint8((1 if e > 0 else 2) << ((i & 3) * 2))
    return bitmap


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def _run(
    r: np.ndarray,
    u: np.ndarray,
    has_update: bool,
    t: np.float32,
    most: int,
    sparse: np.ndarray,
    bitmap: np.ndarray,
    codes: np.ndarray,
    start: int,
    count: int,
) -> tuple[int, int, np.uint64]:
    """Blocks from ``start`` into the message while each block's entries keep ``count <= most``: into ``sparse``
    (``bitmap`` empty) or into ``bitmap``.

    Returns ``(start, count, m)``: ``m`` non-zero = the block at ``start`` is added but not encoded (its entries
    would pass ``most``: the caller takes it element by element); else every block is done (``start >= N``).

    The steps are written out here rather than in helpers: numba's own inlining adds reference counting (atomic
    operations) to every block, and a call per block costs about as much as the block.
    """
    n = r.shape[0]
    as_bitmap = bitmap.shape[0] > 0
    while start < n:
        # step 1 + 2: add the update, and the block's entries as a 64-bit mask (vector code, no branch per element)
        m = np.uint64(0)
        at = np.uint64(start)
        if start + BLOCK > n:
            m = _mask_tail(r, u, has_update, start, n, t)
        elif has_update:
            for j in range(BLOCK):
                v = r[at + np.uint64(j)] + u[at + np.uint64(j)]
                r[at + np.uint64(j)] = v
                m |= _bit(abs(v) >= t) << np.uint64(j)
        else:
            for j in range(BLOCK):
                m |= _bit(abs(r[at + np.uint64(j)]) >= t) << np.uint64(j)
        if m:
            hits = _popcount(m)
            if count + hits > most:
                return start, count, m
            if as_bitmap:
                _bitmap_block(r, start, min(start + BLOCK, n), t, bitmap, codes)
                count += hits
                m = np.uint64(0)
            # step 3, sparse: visit the set bits (work per entry); signs by select, not by a branch
            while m:
                i = at + _lowest_bit(m)
                m &= m - np.uint64(1)  # clear the lowest set bit
                v = r[i]
                positive = v > 0
                e = np.int64(i) + 1  # the 1-based index
                sparse[np.uint64(count)] = _select(positive, e, -e)
                r[i] = _select(positive, v - t, v + t)
                count += 1
        start += BLOCK
    return start, count, np.uint64(0)


@njit(cache=True, nogil=True)
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
    (``sparse`` holds ``min(limit, cap) + 1`` int32); ``cap``: at most this many entries (the boundary, or N);
    ``saved_pos`` / ``saved_val``: the index and value before the subtraction of the first ``len(saved_pos)``
    entries, so the caller can undo a message that ends below ``min_entries``.

    Returns:
        ``(count, bitmap)``: the entries sent; a bitmap (``ceil(N/4)`` uint8) when ``count > limit``, else an empty
        array and the message is ``sparse[:count]``.
    """
    n = r.shape[0]
    bitmap = np.zeros(0, dtype=np.uint8)
    n_saved = saved_pos.shape[0]
    codes = np.empty(BLOCK, dtype=np.uint8)  # _bitmap_block's scratch
    count = 0
    start = 0  # the first block not added yet
    while start < n and count < cap:
        if count < n_saved:  # entries must be saved: the next block with an entry element by element
            start, count, m = _run(r, u, has_update, t, count, sparse, bitmap, codes, start, count)
        elif count <= limit:
            start, count, m = _run(r, u, has_update, t, min(limit, cap), sparse, bitmap, codes, start, count)
        else:
            start, count, m = _run(r, u, has_update, t, cap, sparse, bitmap, codes, start, count)
        if m:  # the block at `start` is added: it switches to the bitmap, reaches the cap, or saves values
            end = min(start + BLOCK, n)
            count, bitmap = _careful_block(r, start, end, t, limit, cap, count, sparse, bitmap, saved_pos, saved_val)
            start = end
    if has_update:  # capped: the rest of the update still goes into the residual
        for j in range(start, n):
            r[j] = r[j] + u[j]
    return count, bitmap
