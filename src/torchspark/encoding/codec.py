"""Threshold encoding of flat float32 updates (Strom 2015), the *compressor* of the GRACE split.

An update is never sent at full precision. It is added to a per-worker residual, and every residual entry whose
magnitude reaches the threshold ``t`` is sent as exactly one ``±t`` step and subtracted from the residual. What is
not sent stays in the residual for later steps, so nothing is lost: the sum of all decoded messages plus the final
residual equals the sum of all updates.

Two formats, chosen per message by wire size (header included, the header is the same for both):

* ``"sparse"``: int32 signed 1-based indices, ``+(i+1)`` for ``+t`` and ``-(i+1)`` for ``-t``, ascending by ``i``.
  4 bytes per entry.
* ``"bitmap"``: 2 bits per element (codes 0, ``+t``, ``-t``), i.e. ``ceil(N/4)`` bytes, 16x smaller than float32.
  Chosen exactly when it is strictly smaller than the sparse message, i.e. when more than ``ceil(N/4) // 4``
  entries (about N/16) reach the threshold.
* ``"empty"``: fewer than ``min_entries`` entries reach ``t``; nothing is sent and the residual keeps everything.

Unlike DL4J, the format is chosen after counting and before the residual is touched, so switching formats never
loses residual mass, and the bitmap has no "half threshold" state.

A bf16/fp16 update (mixed-precision training) is widened to float32 before it meets the residual, which is always
float32 ([`float32_update`][torchspark.encoding.float32_update]); decoding always yields float32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from torchspark.encoding import _kernels, fastpath
from torchspark.errors import ConfigError, EncodingError

__all__ = [
    "FORMATS",
    "HEADER_NBYTES",
    "MAX_LENGTH",
    "EncodedUpdate",
    "threshold_encode",
    "decode",
    "decode_sum",
    "sparse_decode_sum",
    "accumulate_step",
    "float32_update",
]

Format = Literal["sparse", "bitmap", "empty"]
FORMATS: tuple[str, ...] = ("empty", "sparse", "bitmap")  # position = format byte on the wire

# Wire header (see torchspark.encoding.wire): magic 4, version 1, format 1, reserved 2, length u64, entries u64,
# threshold f32. Kept here because the format choice compares whole-message sizes.
HEADER_NBYTES = 28

# Sparse indices are int32 and 1-based, so a message can address at most 2**31 - 1 elements (DL4J has the same
# limit). Split larger models into several flat buffers.
MAX_LENGTH = 2**31 - 1


@dataclass(frozen=True, eq=False)  # eq on a tensor field would be ambiguous; compare payloads explicitly
class EncodedUpdate:
    """One threshold-encoded message.

    Attributes:
        format: ``"sparse"``, ``"bitmap"`` or ``"empty"``.
        length: N, the number of elements of the update this message encodes.
        threshold: the step size ``t`` (a float32 value); every entry is ``+t`` or ``-t``.
        payload: int32 signed 1-based indices (sparse), uint8 packed 2-bit codes (bitmap, ``ceil(N/4)`` bytes) or
            an empty int32 tensor (empty). On the device of the residual it was encoded from.
        num_entries: how many elements carry a ``±t`` step.
    """

    format: Format
    length: int
    threshold: float
    payload: torch.Tensor
    num_entries: int

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise EncodingError(f"format must be one of {FORMATS}, got {self.format!r}")
        if not 0 <= self.length <= MAX_LENGTH:
            raise EncodingError(f"length must be in [0, {MAX_LENGTH}], got {self.length}")
        if not 0 <= self.num_entries <= self.length:
            raise EncodingError(f"num_entries must be in [0, length={self.length}], got {self.num_entries}")

    @property
    def nbytes(self) -> int:
        """Size in bytes of this message on the wire (header + payload), i.e. ``len(to_bytes(self))``."""
        return HEADER_NBYTES + self.payload.numel() * self.payload.element_size()

    @property
    def density(self) -> float:
        """Fraction of the N elements that carry a step (``num_entries / length``; 0 for an empty update)."""
        return self.num_entries / self.length if self.length else 0.0


def _sparse_limit(length: int) -> int:
    """Largest entry count for which the sparse message is no larger than the bitmap one (ties go to sparse)."""
    return _kernels.bitmap_nbytes(length) // 4


def _check_threshold(threshold: float) -> float:
    t32 = float(np.float32(threshold))
    if not (math.isfinite(t32) and t32 > 0):
        raise ConfigError(
            f"threshold must be a finite number > 0 (as float32), got {threshold!r}; "
            "a typical starting value is 1e-3 for SGD updates"
        )
    return t32


def float32_update(update: torch.Tensor | None) -> torch.Tensor | None:
    """``update`` as float32: a bf16/fp16 update (mixed-precision training's) widened to a float32 copy, which is
    exact (every bf16/fp16 value is a float32 value); float32 updates, other dtypes and None as they are. The
    residual it is added to stays float32, so what does not reach the threshold is kept at full precision.

    Example: ``threshold_encode(float32_update(u_bf16), residual, t)`` sends what ``u_bf16.float()`` would."""
    if update is None or update.dtype not in (torch.bfloat16, torch.float16):
        return update
    return update.detach().float()


def _check_flat(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32 or t.dim() != 1 or not t.is_contiguous():
        raise EncodingError(
            f"{name} must be a contiguous 1-D float32 tensor, got dtype={t.dtype}, "
            f"shape={tuple(t.shape)}, contiguous={t.is_contiguous()}; flatten it first "
            "(e.g. torch.nn.utils.parameters_to_vector)"
        )


def threshold_encode(
    update: torch.Tensor | None,
    residual: torch.Tensor,
    threshold: float,
    *,
    min_entries: int = 1,
    boundary: int | None = None,
    _force_torch: bool = False,
    _one_pass: bool = True,
) -> EncodedUpdate:
    """Encode ``residual + update`` with threshold ``threshold``; mutates ``residual`` in place.

    Steps:
        1. ``residual += update`` (skipped when ``update`` is None, to flush the residual alone).
        2. Count the entries with ``|r| >= t``; with ``boundary=k`` keep only the first ``k`` of them (lowest
           indices, as DL4J). Choose the format (empty / sparse / bitmap by wire size) before touching the residual
           again.
        3. Every kept entry is sent as one ``sign(r)*t`` step and ``r -= sign(r)*t`` (one step per entry per call,
           even if ``|r| >= 2t``; the rest, and every entry over the boundary, stays for later calls).

    Args:
        update: flat update (what the optimizer would subtract from the parameters), or None. float32, or
            bf16/fp16 (widened to float32 first: [`float32_update`][torchspark.encoding.float32_update]).
        residual: flat float32 residual, same length and device as ``update``; changed in place.
        threshold: step size ``t`` (> 0, rounded to float32). Larger = fewer, coarser entries per message.
        min_entries: send nothing unless at least this many entries reach ``t`` (DL4J used 2). Default 1.
        boundary: at most this many entries per message (DL4J's ``boundary``); entries beyond it stay in the
            residual untouched. ``None`` (default) = no cap. It bounds message size when the threshold is far too
            low for the update (DL4J passes N/16, where a bitmap costs the same); the cap favours low indices,
            so a small boundary delays high-index entries until the low ones fall below ``t``.

    Returns:
        The [`EncodedUpdate`][torchspark.encoding.EncodedUpdate]; its payload lives on the residual's device.

    On the CPU, with ``torchspark[fast]`` installed, steps 1-3 run in one pass of a compiled kernel (the same
    message and residual, bit for bit; see `torchspark.encoding.fastpath`).

    Raises:
        ConfigError: ``threshold`` is not a finite positive float32, ``min_entries < 1`` or ``boundary < 1``.
        EncodingError: the tensors are not contiguous 1-D float32 of equal length on one device, or longer than
            `MAX_LENGTH`.
    """
    t = _check_threshold(threshold)
    if min_entries < 1:
        raise ConfigError(f"min_entries must be >= 1, got {min_entries}")
    if boundary is not None and (isinstance(boundary, bool) or not isinstance(boundary, int) or boundary < 1):
        raise ConfigError(f"boundary must be None (no cap) or an int >= 1, got {boundary!r}; DL4J uses N/16")
    _check_flat("residual", residual)
    update = float32_update(update)
    if residual.requires_grad:
        raise EncodingError("residual must not require grad; create it with torch.zeros(n) (no requires_grad)")
    if update is not None:
        _check_flat("update", update)
        if update.shape != residual.shape or update.device != residual.device:
            raise EncodingError(
                f"update has {update.numel()} elements on {update.device} but the residual has "
                f"{residual.numel()} on {residual.device}; they must match"
            )
    n = residual.numel()
    if n > MAX_LENGTH:
        raise EncodingError(f"cannot encode {n} elements, the limit is {MAX_LENGTH}; split the update")
    with torch.no_grad():
        upd = None if update is None else update.detach()
        one_pass = fastpath.kernel() if _one_pass and _kernels.use_numpy(residual, _force_torch) else None
        if one_pass is not None:
            fmt, payload, count = one_pass.encode(residual, upd, t, min_entries, n if boundary is None else boundary)
            return EncodedUpdate(fmt, n, t, payload, count)
        limit = _sparse_limit(n)
        # 1 + 2: accumulate and count, no subtraction yet
        count, indices = _kernels.accumulate_and_find(residual, upd, t, limit, _force_torch)
        capped = boundary is not None and count > boundary
        if boundary is not None and capped:  # 2b: only the first `boundary` entries go out
            count = boundary
            indices = _kernels.first_indices(residual, t, boundary) if indices is None else indices[:boundary]
        if count < min_entries:
            return EncodedUpdate("empty", n, t, torch.empty(0, dtype=torch.int32, device=residual.device), 0)
        # 3: subtract one ±t per entry, in the chosen format
        if indices is not None and count <= limit:
            payload = _kernels.apply_sparse(residual, indices, t, _force_torch)
            return EncodedUpdate("sparse", n, t, payload.to(residual.device), count)
        if capped and indices is not None:  # a capped message still too big for sparse: the same entries as a bitmap
            signed = _kernels.apply_sparse(residual, indices, t, _force_torch)
            payload = _kernels.sparse_to_bitmap(signed.to(residual.device), n)
            return EncodedUpdate("bitmap", n, t, payload, count)
        payload = _kernels.apply_bitmap(residual, t, _force_torch)
        return EncodedUpdate("bitmap", n, t, payload.to(residual.device), count)


def decode(message: EncodedUpdate, out: torch.Tensor, *, _force_torch: bool = False) -> torch.Tensor:
    """Add the ``±t`` steps of ``message`` into ``out`` (in place) and return ``out``.

    Args:
        message: an encoded update (from [`threshold_encode`][torchspark.encoding.threshold_encode] or [`torchspark.encoding.from_bytes`][torchspark.encoding.from_bytes]).
        out: contiguous 1-D float32 tensor of length ``message.length``, on any device.

    Returns:
        ``out``, with ``+t`` / ``-t`` added at the encoded entries.

    Raises:
        EncodingError: ``out`` is not a contiguous 1-D float32 tensor or its length differs from the message's.
    """
    _check_flat("out", out)
    if out.numel() != message.length:
        raise EncodingError(
            f"message encodes {message.length} elements but out has {out.numel()}; "
            "decode into a buffer of the encoded length"
        )
    with torch.no_grad():
        if message.format == "sparse":
            _kernels.add_sparse(out, message.payload.to(out.device), message.threshold, _force_torch)
        elif message.format == "bitmap":
            _kernels.add_bitmap(out, message.payload.to(out.device), message.threshold, _force_torch)
    return out


def decode_sum(messages: Iterable[EncodedUpdate], out: torch.Tensor) -> torch.Tensor:
    """Add every message into ``out`` (in place) and return it; messages may carry different thresholds.

    Raises:
        EncodingError: as [`decode`][torchspark.encoding.decode], for the first message whose length differs from ``out``'s.
    """
    for message in messages:
        decode(message, out)
    return out


def sparse_decode_sum(messages: Iterable[EncodedUpdate]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum of sparse messages where it can be non-zero: ``(indices, sums)``.

    ``indices`` (int64, ascending, unique) is the union of the messages' entries; ``sums[j]`` is exactly what
    [`decode_sum`][torchspark.encoding.decode_sum] into a zeroed buffer leaves at ``indices[j]`` (the ``±t`` values added from 0 in message
    order), and every other element of that buffer would stay 0. So ``x[indices] -= sums`` is bit-identical to
    ``x -= decode_sum(messages, zeros)`` while touching only the sent entries. CPU payloads.

    Raises:
        EncodingError: a message is not sparse or not on the CPU, or the messages' lengths differ.
    """
    messages = list(messages)
    if not messages:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.float32)
    for m in messages:
        if m.format != "sparse" or m.payload.device.type != "cpu" or m.length != messages[0].length:
            raise EncodingError(
                f"sparse_decode_sum needs sparse CPU messages of one length, got a {m.format} message "
                f"of {m.length} elements on {m.payload.device}; use decode_sum for the others"
            )
    return _kernels.sparse_sum([m.payload for m in messages], [m.threshold for m in messages])


def sparse_sum_entries(entries: list[np.ndarray], thresholds: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """[`sparse_decode_sum`][torchspark.encoding.sparse_decode_sum] of sparse payloads given as int32 numpy arrays of signed 1-based indices (e.g. the
    read-only views of `sparse_view`) and their thresholds: ``(indices, sums)`` as
    int64 / float32 numpy arrays, the same values. Validated payloads only."""
    return _kernels.sparse_sum_np(entries, thresholds)


def accumulate_step(
    residual: torch.Tensor,
    before: torch.Tensor,
    after: torch.Tensor,
    update: torch.Tensor,
    *,
    _force_torch: bool = False,
) -> tuple[float, float]:
    """Move an optimizer step from the parameters into the residual, in one pass: ``update = before - after``,
    ``after[:] = before`` (the parameters are restored), ``residual += update``.

    Bit-identical to ``update = before - after; after.copy_(before); residual.add_(update)`` (so to encoding
    ``update`` with [`threshold_encode`][torchspark.encoding.threshold_encode], whose step 1 is that add: call it with ``update=None`` afterwards),
    without a temporary per step; on CPU each cache-sized chunk is read once.

    Args:
        residual: flat float32 residual, changed in place.
        before: the parameters before the step (unchanged).
        after: the live parameters after the step; overwritten with ``before``.
        update: a buffer for the update (overwritten), e.g. reused every step.

    Returns:
        ``(norm(update), norm(before))``, float32 partial sums added in float64; may differ from ``torch.norm`` in
        the last bits. Non-finite when the update or the parameters are.

    Raises:
        EncodingError: the four tensors are not contiguous 1-D float32 of one length on one device.
    """
    for name, t in (("residual", residual), ("before", before), ("after", after), ("update", update)):
        _check_flat(name, t)
        if t.shape != residual.shape or t.device != residual.device:
            raise EncodingError(
                f"{name} has {t.numel()} elements on {t.device} but the residual has "
                f"{residual.numel()} on {residual.device}; they must match"
            )
    with torch.no_grad():
        return _kernels.step_into_residual(residual, before, after, update, _force_torch)
