"""Versioned byte format of an [`EncodedUpdate`][torchspark.encoding.EncodedUpdate] (no pickle).

Layout, little-endian, 28-byte header then payload::

    offset  size  field
    0       4     magic b"TSEU" (TorchSpark Encoded Update)
    4       1     version (currently 1)
    5       1     format: 0 = empty, 1 = sparse, 2 = bitmap
    6       2     reserved, 0
    8       8     length N (u64)
    16      8     entry count (u64)
    24      4     threshold (f32)
    28      ...   payload: sparse = count x int32 signed 1-based indices; bitmap = ceil(N/4) bytes; empty = nothing

Every reader check raises [`EncodingError`][torchspark.errors.EncodingError] naming what was wrong, so a corrupted or
foreign message is refused instead of being decoded into garbage updates.
"""

from __future__ import annotations

import math
import struct
from typing import cast

import numpy as np
import torch

from torchspark.encoding import _kernels
from torchspark.encoding.codec import FORMATS, HEADER_NBYTES, MAX_LENGTH, EncodedUpdate, Format
from torchspark.errors import EncodingError

__all__ = ["MAGIC", "VERSION", "to_bytes", "from_bytes", "sparse_view"]

MAGIC = b"TSEU"
VERSION = 1
_HEADER = struct.Struct("<4sBBHQQf")
assert _HEADER.size == HEADER_NBYTES


def to_bytes(message: EncodedUpdate) -> bytes:
    """Serialise ``message`` (payload copied to CPU); ``len(result) == message.nbytes``."""
    header = _HEADER.pack(
        MAGIC, VERSION, FORMATS.index(message.format), 0, message.length, message.num_entries, message.threshold
    )
    if message.format == "sparse":
        body = message.payload.detach().cpu().numpy().astype("<i4", copy=False).tobytes()
    elif message.format == "bitmap":
        body = message.payload.detach().cpu().numpy().astype(np.uint8, copy=False).tobytes()
    else:
        body = b""
    return header + body


def from_bytes(data: bytes | bytearray | memoryview) -> EncodedUpdate:
    """Parse bytes written by [`to_bytes`][torchspark.encoding.to_bytes]; the payload comes back as a CPU tensor.

    Raises:
        EncodingError: bad magic (not a torchspark message), unsupported version, unknown format byte, truncated
            or over-long data (``expected X bytes, got Y``), an invalid threshold, out-of-range indices or
            impossible bitmap codes.
    """
    buf, name, length, count, threshold, payload_nbytes = _checked_header(data)
    if name == "empty":
        return EncodedUpdate("empty", length, threshold, torch.empty(0, dtype=torch.int32), 0)
    raw = np.frombuffer(
        buf,
        dtype=np.uint8 if name == "bitmap" else "<i4",
        offset=HEADER_NBYTES,
        count=payload_nbytes if name == "bitmap" else count,
    )
    payload = torch.from_numpy(raw.astype(np.uint8 if name == "bitmap" else np.int32))  # copy: writable, owned
    if name == "sparse":
        _check_sparse(raw, length)
    elif _kernels.bitmap_has_invalid_code(payload):
        raise EncodingError("corrupt bitmap message: an element has both its value and sign bit set (code 3)")
    return EncodedUpdate(cast(Format, name), length, threshold, payload, count)


def sparse_view(data: bytes | bytearray | memoryview) -> tuple[int, float, np.ndarray] | None:
    """``(length, threshold, entries)`` of a sparse (or empty) message without building an
    [`EncodedUpdate`][torchspark.encoding.EncodedUpdate]: ``entries`` is a read-only int32 view of the signed 1-based indices inside ``data``
    (empty for an empty message). None for a bitmap message. The same checks as [`from_bytes`][torchspark.encoding.from_bytes] (and the same
    errors), for the per-step decoding of gradient sharing, where the messages are few and small and the fixed
    cost per message is what counts.
    """
    buf, name, length, count, threshold, _ = _checked_header(data)
    if name == "bitmap":
        return None
    raw = np.frombuffer(buf, dtype="<i4", offset=HEADER_NBYTES, count=count)  # the wire is little-endian
    _check_sparse(raw, length)
    return length, threshold, raw


def _check_sparse(raw: np.ndarray, length: int) -> None:
    """Indices in ``[1, length]`` by magnitude and strictly ascending (EncodingError otherwise)."""
    count = raw.shape[0]
    if not count:
        return
    magnitude = np.abs(raw)  # int32: abs(-2**31) stays negative, which the range check refuses
    ascending = count == 1 or bool(np.all(magnitude[1:] > magnitude[:-1]))
    if not ascending or magnitude[0] < 1 or magnitude[-1] > length:  # ascending: first and last are min and max
        wide = np.abs(raw.astype(np.int64))
        if wide.min() < 1 or wide.max() > length:
            raise EncodingError(
                f"corrupt sparse message: indices must be in [1, {length}] in magnitude, got "
                f"range [{wide.min()}, {wide.max()}]"
            )
        raise EncodingError("corrupt sparse message: indices must be strictly ascending by magnitude")


def _checked_header(data: bytes | bytearray | memoryview) -> tuple[memoryview, str, int, int, float, int]:
    """The header's fields after every header and size check: ``(buf, format, length, count, threshold,
    payload_nbytes)``."""
    buf = memoryview(data).cast("B")
    if len(buf) < HEADER_NBYTES:
        raise EncodingError(f"truncated encoded update: expected at least {HEADER_NBYTES} header bytes, got {len(buf)}")
    magic, version, fmt, _reserved, length, count, threshold = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise EncodingError(
            f"bad magic {bytes(magic)!r}, expected {MAGIC!r}: these bytes are not a torchspark encoded update"
        )
    if version != VERSION:
        raise EncodingError(
            f"unsupported encoded-update version {version}; this torchspark reads version "
            f"{VERSION}; use the same torchspark version on every worker"
        )
    if fmt >= len(FORMATS):
        raise EncodingError(f"unknown format byte {fmt}; expected 0 (empty), 1 (sparse) or 2 (bitmap)")
    name = FORMATS[fmt]
    if length > MAX_LENGTH or count > length:
        raise EncodingError(
            f"corrupt header: length {length} (max {MAX_LENGTH}) and entry count {count} (must be <= length)"
        )
    if not (math.isfinite(threshold) and threshold > 0):
        raise EncodingError(f"corrupt header: threshold {threshold} must be finite and > 0")
    payload_nbytes = {"empty": 0, "sparse": 4 * count, "bitmap": _kernels.bitmap_nbytes(length)}[name]
    expected = HEADER_NBYTES + payload_nbytes
    if len(buf) != expected:
        what = "truncated" if len(buf) < expected else "over-long"
        raise EncodingError(f"{what} {name} encoded update: expected {expected} bytes, got {len(buf)}")
    if name == "empty" and count:
        raise EncodingError(f"corrupt empty message: entry count {count}, expected 0")
    return buf, name, length, count, threshold, payload_nbytes
