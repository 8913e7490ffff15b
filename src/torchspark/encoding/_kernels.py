"""Vectorised kernels behind the threshold codec: one numpy implementation for CPU tensors, one torch one for the rest.

Why two: on CPU, torch's comparison-to-bool and ``nonzero`` kernels are several times slower than numpy's
(BENCHMARKS.md, "Measurements behind design choices"), so the CPU path works on zero-copy numpy views of the same memory.
The torch path is what CUDA (or any other device) uses; both produce bit-identical results, which the tests check
by forcing the torch path on CPU.

Layouts shared by both paths:

* sparse payload: int32, ``+(i+1)`` for a ``+t`` step at element ``i``, ``-(i+1)`` for ``-t``; ascending by ``i``.
* bitmap payload: uint8, 4 elements per byte; element ``i`` sits in byte ``i // 4`` at bits ``2*(i % 4)`` (value)
  and ``2*(i % 4) + 1`` (negative): code 0 = nothing, 1 = ``+t``, 2 = ``-t``; code 3 never occurs. Pad bits are 0.

Every function here takes already-validated arguments; the public entry points live in `codec`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__: list[str] = []  # private module

# Elements per cache-sized chunk on the CPU path: 64 Ki float32 = 256 KiB, so the add, abs and compare passes of a
# chunk hit L2 instead of DRAM. Measured best of 16 Ki..256 Ki; must be a multiple of 4 (bitmap bytes).
_CHUNK = 1 << 16
# The search without an add (the training loop's: the updater already stepped into the residual) has two passes per
# chunk, and each chunk costs ~4 numpy calls of fixed overhead: whole chunks of 1 Mi elements measured 0.12 ms
# instead of 0.19 ms for a 0.4 M-parameter MLP, and the same time as 64 Ki chunks at 3.7 M (2-core dev box).
_FIND_CHUNK = 1 << 20

_SHIFTS_NP = np.array([0, 2, 4, 6], dtype=np.uint8)


def use_numpy(t: torch.Tensor, force_torch: bool) -> bool:
    """True when ``t`` lives in CPU memory and the numpy fast path may be used."""
    return not force_torch and t.device.type == "cpu"


def bitmap_nbytes(length: int) -> int:
    """Bytes of a bitmap payload for ``length`` elements (2 bits each, rounded up to whole bytes)."""
    return (length + 3) // 4


# --- step 0: the updater's step straight into the residual ---------------------------------------------------------


def step_into_residual(
    residual: torch.Tensor, before: torch.Tensor, after: torch.Tensor, update: torch.Tensor, force_torch: bool
) -> tuple[float, float]:
    """One pass over a stepped network's flat parameters: ``update = before - after``, ``after[:] = before`` (the
    parameters go back), ``residual += update``; returns ``(||update||, ||before||)``.

    Same float32 arithmetic, element by element, as ``update = before - after; after.copy_(before);
    residual.add_(update)``, so the residual is bit-identical to the unfused path; the norms are float32 dot products
    per chunk summed in float64 (they may differ from ``torch.norm`` in the last bits; a non-finite norm is what
    the caller re-checks).
    """
    if not use_numpy(residual, force_torch):
        torch.sub(before, after, out=update)
        after.copy_(before)
        residual.add_(update)
        return float(torch.linalg.vector_norm(update)), float(torch.linalg.vector_norm(before))
    r = residual.detach().numpy()
    b = before.detach().numpy()
    a = after.detach().numpy()
    u = update.detach().numpy()
    # whole-buffer passes: chunking to stay in L2 measured slower here (per-chunk call overhead > cache gain)
    np.subtract(b, a, out=u)
    np.copyto(a, b)
    np.add(r, u, out=r)
    # torch's float32 dot: ~2x faster than torch.norm, and runs on torch's threads (numpy's BLAS may start its own)
    return math.sqrt(float(torch.dot(update, update))), math.sqrt(float(torch.dot(before, before)))


# --- step 1 + 2: accumulate, count, and (while sparse is still possible) collect indices -------------------------


def accumulate_and_find(
    residual: torch.Tensor, update: torch.Tensor | None, threshold: float, max_sparse: int, force_torch: bool
) -> tuple[int, torch.Tensor | None]:
    """Add ``update`` into ``residual`` in place and find the entries with ``|r| >= threshold``.

    Returns:
        ``(count, indices)``: the exact number of entries at or above the threshold, and their int64 0-based
        indices in ascending order, or ``None`` when ``count > max_sparse`` (the sparse format cannot win, so the
        indices are not kept). The residual is changed only by the add.
    """
    if use_numpy(residual, force_torch):
        return _accumulate_and_find_np(residual, update, threshold, max_sparse)
    if update is not None:
        residual.add_(update)
    mask = residual.abs() >= threshold  # (N,) bool
    count = int(mask.sum())
    if count > max_sparse:
        return count, None
    return count, torch.nonzero(mask).squeeze(1)


def _accumulate_and_find_np(
    residual: torch.Tensor, update: torch.Tensor | None, threshold: float, max_sparse: int
) -> tuple[int, torch.Tensor | None]:
    r = residual.detach().numpy()
    u = None if update is None else update.detach().numpy()
    t = np.float32(threshold)
    n = r.shape[0]
    chunk = _CHUNK if u is not None else _FIND_CHUNK
    scratch = np.empty(min(chunk, n), dtype=np.float32)
    mask = np.empty(min(chunk, n), dtype=np.bool_)
    found: list[np.ndarray] = []
    count = 0
    keep = True
    for start in range(0, n, chunk):
        rc = r[start : start + chunk]
        m = rc.shape[0]
        if u is not None:
            np.add(rc, u[start : start + m], out=rc)
        np.abs(rc, out=scratch[:m])
        np.greater_equal(scratch[:m], t, out=mask[:m])
        if keep:
            # flatnonzero counts internally; a separate count_nonzero pass would cost ~10% at low density
            idx = np.flatnonzero(mask[:m])
            count += idx.shape[0]
            if count > max_sparse:
                keep = False
                found.clear()
            elif idx.shape[0]:
                found.append(idx + start if start else idx)
        else:
            count += int(np.count_nonzero(mask[:m]))
    if not keep:
        return count, None
    idx = (found[0] if len(found) == 1 else np.concatenate(found)) if found else np.empty(0, dtype=np.int64)
    return count, torch.from_numpy(idx)


def first_indices(residual: torch.Tensor, threshold: float, k: int) -> torch.Tensor:
    """int64 0-based indices of the first ``k`` entries (by index) with ``|r| >= t`` (the ``boundary`` cap).

    One extra pass over the residual, taken only when a message is capped.
    """
    mask = residual.abs() >= threshold  # float32 compare, as the counting pass
    return torch.nonzero(mask).squeeze(1)[:k]


# --- step 3, sparse: subtract one ±t per found entry and emit signed 1-based indices ------------------------------


def apply_sparse(residual: torch.Tensor, indices: torch.Tensor, threshold: float, force_torch: bool) -> torch.Tensor:
    """``r[i] -= sign(r[i]) * t`` for every index; returns the int32 signed 1-based payload (same order)."""
    if use_numpy(residual, force_torch):
        r = residual.detach().numpy()
        idx = indices.numpy()
        t = np.float32(threshold)
        vals = r[idx]
        positive = vals > 0
        r[idx] = vals - np.where(positive, t, -t)
        one_based = (idx + 1).astype(np.int32)
        return torch.from_numpy(np.where(positive, one_based, -one_based))
    picked = residual[indices]
    is_positive = picked > 0
    residual[indices] = picked - torch.where(is_positive, threshold, -threshold)
    one_based_t = (indices + 1).to(torch.int32)
    return torch.where(is_positive, one_based_t, -one_based_t)


# --- step 3, bitmap: pack 2-bit codes and subtract ------------------------------------------------------------------


def apply_bitmap(residual: torch.Tensor, threshold: float, force_torch: bool) -> torch.Tensor:
    """Encode every ``|r| >= t`` entry into a packed 2-bit bitmap and subtract its ``±t``; returns uint8 words."""
    n = residual.shape[0]
    if use_numpy(residual, force_torch):
        r = residual.detach().numpy()
        t = np.float32(threshold)
        out = np.empty(bitmap_nbytes(n), dtype=np.uint8)
        size = min(_CHUNK, n + (-n) % 4)
        pos = np.zeros(size, dtype=np.bool_)
        neg = np.zeros(size, dtype=np.bool_)
        codes = np.empty(size, dtype=np.uint8)
        diff = np.empty(size, dtype=np.int8)
        step = np.empty(size, dtype=np.float32)
        for start in range(0, n, _CHUNK):
            rc = r[start : start + _CHUNK]
            m = rc.shape[0]
            m4 = m + (-m) % 4
            pos[m:] = False
            neg[m:] = False
            np.greater_equal(rc, t, out=pos[:m])
            np.less_equal(rc, -t, out=neg[:m])
            # codes byte = pos | neg << 1, computed 4 bytes at a time on uint32 views (uint8 shifts are slow)
            words = codes[:m4].view(np.uint32)
            np.bitwise_or(pos[:m4].view(np.uint32), neg[:m4].view(np.uint32) << 1, out=words)
            # pack the 4 code bytes of each uint32 word into one byte: b0 | b1<<2 | b2<<4 | b3<<6
            packed = (words | (words >> 6) | (words >> 12) | (words >> 18)) & 0xFF
            out[start // 4 : start // 4 + packed.shape[0]] = packed
            # r -= t * (pos - neg), in float32 arithmetic (masked ufuncs are ~6x slower)
            np.subtract(pos[:m].view(np.int8), neg[:m].view(np.int8), out=diff[:m])
            np.copyto(step[:m], diff[:m])
            np.multiply(step[:m], t, out=step[:m])
            np.subtract(rc, step[:m], out=rc)
        return torch.from_numpy(out)
    above = residual >= threshold
    below = residual <= -threshold
    codes_t = above.to(torch.uint8) | (below.to(torch.uint8) << 1)
    pad = (-n) % 4
    if pad:
        codes_t = torch.cat([codes_t, codes_t.new_zeros(pad)])
    residual.sub_(torch.where(above, threshold, 0.0) - torch.where(below, threshold, 0.0))
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=residual.device)
    quads = codes_t.view(-1, 4) << shifts  # (ceil(N/4), 4), disjoint bits
    return quads[:, 0] | quads[:, 1] | quads[:, 2] | quads[:, 3]


def sparse_to_bitmap(payload: torch.Tensor, length: int) -> torch.Tensor:
    """The packed bitmap of a signed 1-based sparse payload (same entries, same ``±t``)."""
    codes = torch.zeros(length + (-length) % 4, dtype=torch.uint8, device=payload.device)
    idx = (payload.abs() - 1).long()
    codes[idx] = torch.where(payload > 0, 1, 2).to(torch.uint8)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=payload.device)
    quads = codes.view(-1, 4) << shifts  # (ceil(N/4), 4), disjoint bits
    return quads[:, 0] | quads[:, 1] | quads[:, 2] | quads[:, 3]


# --- decode ---------------------------------------------------------------------------------------------------------


def add_sparse(out: torch.Tensor, payload: torch.Tensor, threshold: float, force_torch: bool) -> None:
    """``out[|e|-1] += sign(e) * t`` for every signed index ``e`` (indices are unique, so plain indexing is safe)."""
    if use_numpy(out, force_torch):
        o = out.detach().numpy()
        p = payload.numpy()
        t = np.float32(threshold)
        idx = np.abs(p) - 1
        o[idx] += np.where(p > 0, t, -t)
        return
    payload = payload.to(out.device)
    idx = (payload.abs() - 1).long()
    out[idx] += torch.where(payload > 0, threshold, -threshold)


def add_bitmap(out: torch.Tensor, payload: torch.Tensor, threshold: float, force_torch: bool) -> None:
    """Unpack 2-bit codes and add ``{0, +t, -t}`` into ``out``."""
    n = out.shape[0]
    if use_numpy(out, force_torch):
        o = out.detach().numpy()
        p = payload.numpy()
        t = np.float32(threshold)
        lut = _byte_lut(t)
        for start in range(0, n, _CHUNK):
            oc = o[start : start + _CHUNK]
            m = oc.shape[0]
            values = np.take(lut, p[start // 4 : (start + m + 3) // 4], axis=0).reshape(-1)  # (4*ceil(m/4),)
            np.add(oc, values[:m], out=oc)
        return
    payload = payload.to(out.device)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=out.device)
    codes = ((payload.unsqueeze(1) >> shifts) & 3).reshape(-1)[:n].long()  # (N,)
    table = torch.tensor([0.0, threshold, -threshold, 0.0], dtype=out.dtype, device=out.device)
    out += table[codes]


def sparse_sum(payloads: list[torch.Tensor], thresholds: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum of sparse messages at the union of their indices: ``(indices, sums)``, int64 0-based ascending and
    float32, where ``sums[j]`` is ``0 + v_0 + v_1 + ...`` over the messages that carry ``indices[j]``, added in the
    order given (so the same float32 arithmetic as decoding each message in turn into a zeroed buffer; every other
    element of that buffer stays 0). CPU tensors.

    How: one stable sort of all entries by index (each message is already ascending, so the sort merges sorted
    runs, and entries of one index keep the messages' order), then the groups of equal indices are summed
    column by column: the first entry of every group (``0 + v == v``), then the second entry of every group that
    has one, and so on, at most one pass per message. About 2x faster than ``np.unique`` + ``np.add.at`` for
    2-8 messages (measured 0.035 ms instead of 0.065 ms for two messages of 100 entries).
    """
    idx, sums = sparse_sum_np([p.numpy() for p in payloads], thresholds)
    return torch.from_numpy(idx), torch.from_numpy(sums)


def sparse_sum_np(arrays: list[np.ndarray], thresholds: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """`sparse_sum` on int32 numpy payloads (read-only views are fine): ``(indices, sums)`` as numpy arrays."""
    if len(arrays) == 1:  # one message: its indices are already ascending and unique, and 0 + v == v
        p = arrays[0]
        return (np.abs(p).astype(np.int64) - 1, np.where(p > 0, np.float32(thresholds[0]), np.float32(-thresholds[0])))
    idx = np.abs(np.concatenate(arrays)).astype(np.int64)
    idx -= 1
    vals = np.concatenate(
        [
            np.where(a > 0, np.float32(t), np.float32(-t)).astype(np.float32, copy=False)
            for a, t in zip(arrays, thresholds)
        ]
    )
    n = idx.shape[0]
    if n == 0:
        return idx, vals
    order = np.argsort(idx, kind="stable")
    s_idx, s_val = idx[order], vals[order]
    first = np.empty(n, dtype=np.bool_)
    first[0] = True
    np.not_equal(s_idx[1:], s_idx[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    sums = s_val[starts]  # copies: 0 + v_0
    if starts.shape[0] < n:  # some index is in several messages: add its later entries in order
        sizes = np.diff(np.append(starts, n))
        for k in range(1, int(sizes.max())):
            groups = np.flatnonzero(sizes > k)
            sums[groups] += s_val[starts[groups] + k]
    return s_idx[starts], sums


def _byte_lut(t: np.float32) -> np.ndarray:
    """(256, 4) float32: the 4 values {0, +t, -t} that one bitmap byte decodes to (code 3 decodes to 0)."""
    codes = (np.arange(256, dtype=np.uint8)[:, None] >> _SHIFTS_NP) & 3  # (256, 4)
    return np.array([0.0, t, -t, 0.0], dtype=np.float32)[codes]


def bitmap_has_invalid_code(payload: torch.Tensor) -> bool:
    """True when some element carries code 3 (both value and sign bit), which no encoder produces."""
    p = payload.numpy()
    return bool(np.any(p & (p >> 1) & 0x55))
