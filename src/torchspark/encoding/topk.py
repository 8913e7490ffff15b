"""Top-k sparsification with error feedback, the second [`Compressor`][torchspark.encoding.Compressor].

Each step adds the update to the residual, sends the ``k`` residual entries of largest magnitude at full float32
precision (their index and value) and zeroes them in the residual; what is not sent stays in the residual for later
steps (error feedback, as in threshold encoding). ``k`` is either fixed (``k=``) or a fraction of the parameters
(``ratio=``, default 1%). Unlike threshold encoding the message size is known in advance (``8 * k`` bytes of
payload) and no threshold has to adapt; each message carries the exact values instead of ``±t`` steps.

Wire format, little-endian, 24-byte header then payload::

    offset  size  field
    0       4     magic b"TSTK" (TorchSpark Top-K)
    4       1     version (currently 1)
    5       3     reserved, 0
    8       8     length N (u64)
    16      8     entry count k (u64)
    24      4k    indices, int32, 0-based, strictly ascending
    24+4k   4k    values, float32

Example::

    codec = TopKCompressor(ratio=0.01)
    state = codec.start(torch.zeros(n), None)
    message, state = codec.encode(update, state, step)
    codec.decode(codec.to_bytes(message), total)       # total += the sent values
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

from torchspark.encoding.codec import MAX_LENGTH, float32_update
from torchspark.encoding.encoder import EncoderConfig, EncoderState
from torchspark.encoding.threshold import ThresholdState
from torchspark.errors import ConfigError, EncodingError
from torchspark.validation import check_float, check_int

__all__ = ["TopKCompressor", "TopKMessage"]

_MAGIC = b"TSTK"
_VERSION = 1
_HEADER = struct.Struct("<4sB3xQQ")


@dataclass(frozen=True, eq=False)
class TopKMessage:
    """One top-k message: ``values[j]`` belongs at ``indices[j]`` (int32, 0-based, ascending) of ``length``.

    ``threshold`` is the smallest magnitude sent (the k-th largest of the residual), ``format`` is ``"topk"`` or
    ``"empty"``; both as the training statistics record them for every codec."""

    length: int
    indices: torch.Tensor
    values: torch.Tensor

    @property
    def num_entries(self) -> int:
        return int(self.indices.numel())

    @property
    def format(self) -> str:
        return "topk" if self.num_entries else "empty"

    @property
    def threshold(self) -> float:
        return float(self.values.abs().min()) if self.num_entries else 0.0

    @property
    def nbytes(self) -> int:
        """Size on the wire, header included: ``len(TopKCompressor.to_bytes(message))``."""
        return _HEADER.size + 8 * self.num_entries

    @property
    def density(self) -> float:
        return self.num_entries / self.length if self.length else 0.0


@dataclass(frozen=True)
class TopKCompressor:
    """Send the ``k`` largest residual entries per step at full precision; the rest stays in the residual.

    Args:
        ratio: ``k = ceil(ratio * N)`` of the ``N`` parameters, in (0, 1]; default 0.01. Ignored when ``k`` is set.
        k: a fixed number of entries per message (>= 1; capped at ``N``), or None (default: use ``ratio``).

    Raises:
        ConfigError: ``ratio`` outside (0, 1] or ``k`` not an integer >= 1.
    """

    name: ClassVar[str] = "topk"
    ratio: float = 0.01
    k: int | None = None

    def __post_init__(self) -> None:
        check_float("ratio", self.ratio, above=0, maximum=1, owner="TopKCompressor", fix="1% is ratio=0.01")
        check_int("k", self.k, 1, allow_none=True, owner="TopKCompressor", none_means="use ratio")

    def entries(self, length: int) -> int:
        """How many entries a message of ``length`` elements carries."""
        k = self.k if self.k is not None else math.ceil(self.ratio * length)
        return min(k, length)

    def start(self, residual: torch.Tensor, saved: ThresholdState | None) -> EncoderState:
        """The state of a fit: ``residual`` (zeros, or a previous fit's) and no threshold to adapt (its
        ``threshold_state`` records the last message's smallest sent magnitude and density)."""
        return EncoderState(EncoderConfig(), residual, ThresholdState(0.0))

    def encode(self, update: torch.Tensor | None, state: EncoderState, step: int) -> tuple[TopKMessage, EncoderState]:
        """``residual += update`` (skipped for None), send the ``k`` largest ``|residual|`` entries and zero them."""
        residual = state.residual
        update = float32_update(update)
        n = residual.numel()
        if n > MAX_LENGTH:
            raise EncodingError(f"cannot encode {n} elements, the limit is {MAX_LENGTH}; split the update")
        with torch.no_grad():
            if update is not None:
                residual.add_(update.detach().reshape(-1))
            k = self.entries(n)
            if k == 0:
                message = TopKMessage(n, torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.float32))
            else:
                picked = torch.topk(residual.abs(), k, sorted=False).indices
                indices = torch.sort(picked).values
                values = residual[indices].clone()
                residual[indices] = 0.0
                message = TopKMessage(n, indices.to(torch.int32), values)
        return message, replace(state, threshold_state=ThresholdState(message.threshold, message.density))

    def to_bytes(self, message: TopKMessage) -> bytes:
        """The message's wire bytes (see the module docstring)."""
        header = _HEADER.pack(_MAGIC, _VERSION, message.length, message.num_entries)
        indices = message.indices.detach().cpu().numpy().astype("<i4", copy=False).tobytes()
        values = message.values.detach().cpu().numpy().astype("<f4", copy=False).tobytes()
        return header + indices + values

    def decode(self, data: bytes | memoryview, out: torch.Tensor) -> torch.Tensor:
        """Add the message in ``data`` into ``out`` (flat float32) in place and return ``out``.

        Raises:
            EncodingError: not a top-k message, a truncated or over-long one, indices out of range or not
                ascending, or a length other than ``out``'s.
        """
        buf = memoryview(data).cast("B")
        if len(buf) < _HEADER.size:
            raise EncodingError(f"truncated top-k message: expected at least {_HEADER.size} bytes, got {len(buf)}")
        magic, version, length, count = _HEADER.unpack_from(buf, 0)
        if magic != _MAGIC or version != _VERSION:
            raise EncodingError(
                f"not a version-{_VERSION} top-k message (magic {bytes(magic)!r}, version {version}); every "
                "worker must use the same codec and torchspark version"
            )
        if len(buf) != _HEADER.size + 8 * count:
            raise EncodingError(
                f"top-k message of {count} entries must be {_HEADER.size + 8 * count} bytes, got {len(buf)}"
            )
        if length != out.numel():
            raise EncodingError(
                f"a worker sent an update of {length} elements but this network has {out.numel()} parameters; "
                "all workers must train the same network"
            )
        indices = np.frombuffer(buf, dtype="<i4", offset=_HEADER.size, count=count).astype(np.int64)
        values = np.frombuffer(buf, dtype="<f4", offset=_HEADER.size + 4 * count, count=count).astype(np.float32)
        if count and (indices[0] < 0 or indices[-1] >= length or np.any(indices[1:] <= indices[:-1])):
            raise EncodingError(f"corrupt top-k message: indices must be ascending in [0, {length})")
        with torch.no_grad():
            if count:
                idx = torch.from_numpy(indices).to(out.device)
                out[idx] += torch.from_numpy(values).to(out.device)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.name, "ratio": self.ratio, "k": self.k}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopKCompressor:
        try:
            return cls(**{key: value for key, value in data.items() if key != "type"})
        except TypeError as e:
            raise ConfigError(f"bad fields for compressor 'topk': {sorted(data)} ({e}); it takes ratio and k") from e
