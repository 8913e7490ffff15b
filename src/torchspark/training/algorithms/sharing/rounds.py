"""The wire format of one gradient-sharing round: a worker's payload, and the decoded sum of everyone's.

A worker's payload for a round is one flag byte, then its threshold-encoded message when it has one:
``INACTIVE`` (its data ran out; nothing follows), ``ACTIVE`` alone (it stepped but sent nothing: an ``"empty"``
message), or ``ACTIVE + to_bytes(message)``. After the exchange every worker turns the gathered payloads, in rank
order, into one `Round`: how many workers were active and the sum of their messages.

Example::

    payload = pack(message)                                   # this worker's part of round t
    gathered = comm.all_gather_bytes(payload)                 # every worker's, in rank order
    result = round_from_gathered(gathered, net.num_params(), net.device)
    if result.total is not None: ...                          # params -= S_t (at result.indices when set)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torchspark.encoding import EncodedUpdate, decode, from_bytes, sparse_decode_sum, to_bytes
from torchspark.encoding.codec import sparse_sum_entries
from torchspark.encoding.compressor import Compressor
from torchspark.encoding.wire import sparse_view
from torchspark.errors import EncodingError

__all__ = [
    "ACTIVE",
    "INACTIVE",
    "Round",
    "pack",
    "codec_round",
    "parse_gathered",
    "dense_sum",
    "sparse_round",
    "round_from_gathered",
]

#: the flag byte of a worker whose data ran out (nothing follows it)
INACTIVE = b"\x00"
#: the flag byte of a worker that stepped this round (its message, if any, follows)
ACTIVE = b"\x01"


@dataclass(frozen=True)
class Round:
    """The outcome of one exchange: how many workers were active and the decoded sum (None: nothing sent).

    ``indices`` None: ``total`` is the dense sum (N,). Otherwise ``total`` holds the sum at these int64 indices only
    (ascending, unique; zero elsewhere), as `round_from_gathered` returns it for sparse rounds.
    """

    active: int
    total: torch.Tensor | None
    indices: torch.Tensor | None = None


def pack(message: Any, codec: Compressor | None = None) -> bytes:
    """An active worker's payload for ``message``: the flag alone for an empty message, else flag + its bytes
    (``codec.to_bytes``; None: threshold encoding's `to_bytes`)."""
    if message.format == "empty":
        return ACTIVE
    return ACTIVE + (to_bytes(message) if codec is None else codec.to_bytes(message))


def codec_round(gathered: list[bytes], length: int, device: torch.device | str, codec: Compressor) -> Round:
    """The round of the gathered payloads of any codec: each message decoded by ``codec`` in rank order into one
    zeroed buffer (so every rank adds the same values in the same order: bit-identical sums).

    Raises:
        EncodingError: a payload with an unknown flag, or a message ``codec`` cannot read or of another length.
    """
    active, total = 0, None
    for rank, data in enumerate(gathered):
        flag, body = data[:1], memoryview(data)[1:]
        if flag not in (ACTIVE, INACTIVE) or (flag == INACTIVE and len(body)):
            raise EncodingError(
                f"worker {rank} sent a malformed gradient-sharing payload (flag {flag!r}, "
                f"{len(body)} body bytes); all workers must run the same torchspark version"
            )
        active += flag == ACTIVE
        if len(body):
            if total is None:
                total = torch.zeros(length, dtype=torch.float32, device=device)
            codec.decode(body, total)
    return Round(active, total)


def round_from_gathered(gathered: list[bytes], length: int, device: torch.device | str) -> Round:
    """The round of the gathered payloads (rank order). When every message is sparse (or empty) and the parameters
    live on the CPU, the sum is kept at the union of the messages' indices only (``Round.indices``), so no
    parameter-sized buffer is zeroed, decoded into and subtracted; same values, same order of additions as
    `dense_sum`."""
    if torch.device(device).type == "cpu":
        fast = sparse_round(gathered, length)
        if fast is not None:
            return fast
    active, messages = parse_gathered(gathered, length)
    if torch.device(device).type != "cpu" or any(m.format == "bitmap" for m in messages):
        return Round(active, dense_sum(messages, length, device))
    sparse = [m for m in messages if m.format == "sparse"]
    if not sparse:
        return Round(active, None)
    indices, total = sparse_decode_sum(sparse)
    return Round(active, total, indices)


def sparse_round(gathered: list[bytes], length: int) -> Round | None:
    """`round_from_gathered` for the usual round, where every message is sparse or empty: the entries are
    read in place (`sparse_view`, the same checks as ``from_bytes``) and summed
    without building message objects; the same indices and sums. None when some message is a bitmap (or a payload
    is malformed: `parse_gathered` raises the error)."""
    active = 0
    arrays: list[Any] = []
    thresholds: list[float] = []
    for rank, data in enumerate(gathered):
        flag = data[:1]
        if flag not in (ACTIVE, INACTIVE) or (flag == INACTIVE and len(data) > 1):
            return None  # parse_gathered raises the error
        active += flag == ACTIVE
        if len(data) == 1:
            continue
        view = sparse_view(memoryview(data)[1:])
        if view is None:
            return None
        if view[0] != length:
            raise EncodingError(
                f"worker {rank} sent an update of {view[0]} elements but this network has "
                f"{length} parameters; all workers must train the same network"
            )
        if view[2].shape[0]:
            arrays.append(view[2])
            thresholds.append(view[1])
    if not arrays:
        return Round(active, None)
    indices, total = sparse_sum_entries(arrays, thresholds)
    return Round(active, torch.from_numpy(total), torch.from_numpy(indices))


def parse_gathered(gathered: list[bytes], length: int) -> tuple[int, list[EncodedUpdate]]:
    """The gathered payloads as (active workers, their messages in rank order).

    Raises:
        EncodingError: a payload with an unknown flag, or a message of another length than ``length``.
    """
    active = 0
    messages = []
    for rank, data in enumerate(gathered):
        flag, body = data[:1], data[1:]
        if flag not in (ACTIVE, INACTIVE) or (flag == INACTIVE and body):
            raise EncodingError(
                f"worker {rank} sent a malformed gradient-sharing payload (flag {flag!r}, "
                f"{len(body)} body bytes); all workers must run the same torchspark version"
            )
        active += flag == ACTIVE
        if not body:
            continue
        message = from_bytes(body)
        if message.length != length:
            raise EncodingError(
                f"worker {rank} sent an update of {message.length} elements but this network has "
                f"{length} parameters; all workers must train the same network"
            )
        messages.append(message)
    return active, messages


def dense_sum(messages: list[EncodedUpdate], length: int, device: torch.device | str) -> torch.Tensor | None:
    """Decode the messages in rank order into one zeroed buffer (None when there is no message)."""
    if not messages:
        return None
    total = torch.zeros(length, dtype=torch.float32, device=device)
    for message in messages:
        decode(message, total)
    return total
