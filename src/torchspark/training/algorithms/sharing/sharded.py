"""The sharded exchange for many workers: sparse reduce-scatter by index shards, then all-gather of the sums.

The parameter index range is cut into N contiguous shards (`shard_bounds`) and rank ``j`` owns shard ``j``:

1. **Reduce-scatter** ([`Communicator.all_to_all_bytes`][torchspark.training.Communicator.all_to_all_bytes]): every worker cuts its encoded message into N
   pieces, one per shard, without decoding it (`split_message`: sparse indices by range, bitmap bytes by
   4-element blocks) and sends piece ``j`` to rank ``j``. Rank ``j`` decodes the N pieces it received **in rank
   order into a zeroed shard buffer**: per element exactly the additions of the all-gather exchange, so the sum is
   bit-identical.
2. **All-gather** of the summed shards: each owner sends its shard sum losslessly (`shard_sum_bytes`: the
   indices and float32 values of its non-zero elements, or the dense float32 shard, whichever is smaller) and
   every worker assembles ``S_t`` from the N shards.

`sharded_exchange` has the contract of the all-gather exchange (same flag-byte payload, same
`Round` bit for bit, same EncodingError on malformed input).
When it pays and what it costs: docs/design.md ("Topologies") and docs/scaling.md.

Protocol (all ranks take identical decisions from exchanged bytes, so nobody waits on a collective its peers skip):
a phase-1 piece is ``[flag]`` (inactive worker), ``[0xFF | reason]`` (the sender's payload was malformed: every
rank raises [`EncodingError`][torchspark.errors.EncodingError] naming it), or ``[flag | marker | length u64 | threshold f32 | body]`` with
marker 0 = the sender had no message (format ``"empty"``), 1 = nothing in this shard, 2 = sparse piece (shard-local
signed 1-based int32 indices), 3 = bitmap piece. Phase 2 runs only when some worker sent a message (so ``total`` is
None exactly when the all-gather exchange's would be); a shard is ``b"D" + float32s``, ``b"S" + int32 indices +
float32 values`` or ``b"E" + reason`` (its owner found a corrupt piece: every rank raises). A shard sum that
arrives corrupt at one rank only is handed on in the next exchange's first collective as ``[0xFE | reason]``
(`_tell_peers`), so every rank raises [`EncodingError`][torchspark.errors.EncodingError] naming that rank and the shard, none waits for
it until the timeout.

Example::

    result = sharded_exchange(comm, payload, net.num_params(), net.device)   # on every rank, in step
"""

from __future__ import annotations

import struct

import numpy as np
import torch

from torchspark.encoding import EncodedUpdate, decode, from_bytes
from torchspark.encoding.wire import MAGIC, VERSION
from torchspark.errors import EncodingError, WaitTimeout
from torchspark.training.algorithms.sharing.rounds import ACTIVE, INACTIVE, Round
from torchspark.training.comm import Communicator

__all__ = ["shard_bounds", "split_message", "shard_sum_bytes", "sharded_exchange"]

_MALFORMED = 0xFF
_REPORTED = 0xFE  # a peer's phase-2 error, handed on by `_tell_peers`
_NO_MESSAGE, _NOTHING_HERE, _SPARSE, _BITMAP = 0, 1, 2, 3
_PIECE = struct.Struct("<BBQf")  # flag, marker, message length, threshold
_WIRE = struct.Struct("<4sBBHQQf")  # the wire header of torchspark.encoding.wire (to validate pieces with from_bytes)


def shard_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[lo, hi)`` ranges covering ``range(length)``; every boundary but the end is a multiple
    of 4 or the end (bitmap pieces are whole bytes). Shards are ``4*ceil(length/(4*parts))`` long; trailing ones may be
    shorter or empty (``parts > length/4``)."""
    if parts < 1 or length < 0:
        raise ValueError(f"need parts >= 1 and length >= 0, got parts={parts}, length={length}")
    size = 4 * -(-length // (4 * parts)) if length else 0
    return [(min(j * size, length), min((j + 1) * size, length)) for j in range(parts)]


def split_message(message: EncodedUpdate, bounds: list[tuple[int, int]]) -> list[bytes]:
    """Cut ``message`` into one phase-1 piece per shard (flag byte included), without decoding it."""
    head = ACTIVE[0]
    t = message.threshold
    if message.format == "empty":
        return [_PIECE.pack(head, _NO_MESSAGE, message.length, t)] * len(bounds)
    payload = message.payload.detach().cpu().numpy()
    pieces = []
    if message.format == "sparse":
        signed = payload.astype(np.int64, copy=False)
        cuts = np.searchsorted(np.abs(signed), np.array([lo for lo, _ in bounds] + [bounds[-1][1]]) + 1)
        for (lo, _hi), a, b in zip(bounds, cuts[:-1], cuts[1:]):
            if a == b:
                pieces.append(_PIECE.pack(head, _NOTHING_HERE, message.length, t))
                continue
            part = signed[a:b]
            local = np.where(part > 0, part - lo, part + lo).astype("<i4")
            pieces.append(_PIECE.pack(head, _SPARSE, message.length, t) + local.tobytes())
        return pieces
    for lo, hi in bounds:  # bitmap: a non-empty shard starts at a multiple of 4, so it is whole bytes
        part = payload[lo // 4 : (hi + 3) // 4] if hi > lo else payload[:0]
        if not part.any():
            pieces.append(_PIECE.pack(head, _NOTHING_HERE, message.length, t))
        else:
            pieces.append(_PIECE.pack(head, _BITMAP, message.length, t) + part.tobytes())
    return pieces


def _own_pieces(payload: bytes, length: int, bounds: list[tuple[int, int]]) -> list[bytes]:
    """This worker's phase-1 pieces; a malformed payload becomes ``[0xFF | reason]`` to every rank."""
    flag, body = payload[:1], payload[1:]
    reason = None
    if flag not in (ACTIVE, INACTIVE) or (flag == INACTIVE and body):
        reason = f"flag {flag!r}, {len(body)} body bytes"
    elif flag == INACTIVE:
        return [INACTIVE] * len(bounds)
    elif not body:
        return [_PIECE.pack(ACTIVE[0], _NO_MESSAGE, length, 1.0)] * len(bounds)
    else:
        try:
            message = from_bytes(body)
        except EncodingError as e:
            reason = str(e)
        else:
            if message.length != length:
                reason = f"an update of {message.length} elements for a network of {length} parameters"
            else:
                return split_message(message, bounds)
    return [bytes([_MALFORMED]) + reason.encode()] * len(bounds)


def _sum_pieces(
    pieces: list[bytes], length: int, lo: int, hi: int, device: torch.device | str
) -> tuple[int, bool, torch.Tensor | None]:
    """Phase 1 on the owner of ``[lo, hi)``: (active workers, whether any sent a message, the shard sum or None
    when no piece touched the shard). Decodes in rank order into one zeroed buffer."""
    active = 0
    any_message = False
    shard: torch.Tensor | None = None
    for rank, piece in enumerate(pieces):
        if piece[:1] == bytes([_REPORTED]):
            raise EncodingError(f"{piece[1:].decode(errors='replace')} (reported by worker {rank})")
        if piece[:1] == bytes([_MALFORMED]):
            raise EncodingError(
                f"worker {rank} sent a malformed gradient-sharing payload "
                f"({piece[1:].decode(errors='replace')}); all workers must run the same torchspark "
                "version and train the same network"
            )
        if piece == INACTIVE:
            continue
        if len(piece) < _PIECE.size or piece[:1] != ACTIVE or piece[1] > _BITMAP:
            raise EncodingError(
                f"worker {rank} sent a malformed gradient-sharing piece ({len(piece)} bytes, "
                f"starting {piece[:2]!r}); all workers must run the same torchspark version"
            )
        _flag, marker, message_length, threshold = _PIECE.unpack_from(piece)
        active += 1
        if marker == _NO_MESSAGE:
            continue
        if message_length != length:
            raise EncodingError(
                f"worker {rank} sent an update of {message_length} elements but this network has "
                f"{length} parameters; all workers must train the same network"
            )
        any_message = True
        if marker == _NOTHING_HERE:
            continue
        body = piece[_PIECE.size :]
        fmt = 1 if marker == _SPARSE else 2
        count = len(body) // 4 if marker == _SPARSE else 0
        part = from_bytes(_WIRE.pack(MAGIC, VERSION, fmt, 0, hi - lo, count, threshold) + body)  # validates it
        if shard is None:
            shard = torch.zeros(hi - lo, dtype=torch.float32, device=device)
        decode(part, shard)
    return active, any_message, shard


def shard_sum_bytes(shard: torch.Tensor | None, size: int) -> bytes:
    """A summed shard, lossless: ``b"S"`` + int32 indices + float32 values of its non-zero elements (bit pattern
    not +0.0) when that is smaller than ``b"D"`` + the dense float32 shard."""
    if shard is None:
        return b"S"
    values = shard.detach().cpu().contiguous()
    bits = values.view(torch.int32)
    idx = torch.nonzero(bits, as_tuple=True)[0]
    if 8 * idx.numel() < 4 * size:
        return (
            b"S"
            + idx.to(torch.int32).numpy().astype("<i4", copy=False).tobytes()
            + values[idx].numpy().astype("<f4", copy=False).tobytes()
        )
    return b"D" + values.numpy().astype("<f4", copy=False).tobytes()


#: S_t goes to the parameters as values at indices while it has at most this fraction of them; beyond, a fresh dense
#: buffer and a dense subtraction are cheaper (about 10 ns per indexed entry against ~1 ns per dense element)
SPARSE_APPLY_MAX_FRACTION = 1 / 8


def _assemble(
    shards: list[bytes], bounds: list[tuple[int, int]], length: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Phase 2: S_t from every owner's `shard_sum_bytes` (or raise the error an owner reported), as
    ``(values, indices)``: when every shard sum is sparse, the parameters live on the CPU and S_t has at most
    `SPARSE_APPLY_MAX_FRACTION` of them non-zero, only those entries (ascending indices, so
    ``params[indices] -= values`` is the loop's dense subtraction restricted to where it changes anything: no
    parameter-sized buffer per step); else ``(dense S_t, None)``."""
    _check_shards(shards, bounds)
    entries = sum((len(data) - 1) // 8 for data in shards)
    if (
        torch.device(device).type == "cpu"
        and all(data[:1] == b"S" for data in shards)
        and entries <= length * SPARSE_APPLY_MAX_FRACTION
    ):
        idx_parts, value_parts = [], []
        for data, (lo, _hi) in zip(shards, bounds):
            k = (len(data) - 1) // 8
            if k:
                idx_parts.append(np.frombuffer(data, dtype="<i4", count=k, offset=1).astype(np.int64) + lo)
                value_parts.append(np.frombuffer(data, dtype="<f4", count=k, offset=1 + 4 * k))
        if not idx_parts:
            return torch.empty(0, dtype=torch.float32), torch.empty(0, dtype=torch.int64)
        return (
            torch.from_numpy(np.concatenate(value_parts).astype(np.float32, copy=True)),
            torch.from_numpy(np.concatenate(idx_parts)),
        )
    total = torch.zeros(length, dtype=torch.float32)
    flat = total.numpy()  # written in place: one copy per shard
    for data, (lo, hi) in zip(shards, bounds):
        body = data[1:]
        if data[:1] == b"D":
            flat[lo:hi] = np.frombuffer(body, dtype="<f4")
        else:
            k = len(body) // 8
            flat[np.frombuffer(body, dtype="<i4", count=k).astype(np.int64) + lo] = np.frombuffer(
                body, dtype="<f4", offset=4 * k
            )
    return total.to(device), None


def _check_shards(shards: list[bytes], bounds: list[tuple[int, int]]) -> None:
    """Raise the error an owner reported, or EncodingError for a malformed shard sum."""
    for rank, (data, (lo, hi)) in enumerate(zip(shards, bounds)):
        kind, body = data[:1], data[1:]
        if kind == b"E":
            raise EncodingError(
                f"worker {rank} received a corrupt gradient-sharing piece: {body.decode(errors='replace')}"
            )
        if kind == b"D" and len(body) == 4 * (hi - lo):
            continue
        if kind == b"S" and len(body) % 8 == 0:
            k = len(body) // 8
            idx = np.frombuffer(body, dtype="<i4", count=k)
            if k == 0 or (idx.min() >= 0 and idx.max() < hi - lo and (k == 1 or bool(np.all(idx[1:] > idx[:-1])))):
                continue
        raise EncodingError(
            f"worker {rank} sent a malformed shard sum ({len(data)} bytes, kind {kind!r}) for "
            f"elements [{lo}, {hi}); all workers must run the same torchspark version"
        )


def sharded_exchange(comm: Communicator, payload: bytes, length: int, device: torch.device | str) -> Round:
    """Every worker's ``payload`` summed into one `Round`,
    bit-identical to the all-gather exchange's (same flag-byte payload, same EncodingError on malformed input),
    over a reduce-scatter by index shards and an all-gather of the shard sums. Every wait is a collective with the
    communicator's timeout."""
    world, rank = comm.world_size, comm.rank
    bounds = shard_bounds(length, world)
    received = comm.all_to_all_bytes(_own_pieces(payload, length, bounds))
    lo, hi = bounds[rank]
    error = None
    try:
        active, any_message, shard = _sum_pieces(received, length, lo, hi, device)
    except EncodingError as e:
        if any(p[:1] in (bytes([_MALFORMED]), bytes([_REPORTED])) for p in received):
            raise  # every rank received the same reason: all raise here, before phase 2
        error = str(e)
        active, any_message, shard = 0, True, None
    if not any_message:
        return Round(active, None)
    mine = b"E" + error.encode() if error is not None else shard_sum_bytes(shard, hi - lo)
    shards = comm.all_gather_bytes(mine)
    try:
        total, indices = _assemble(shards, bounds, length, device)
    except EncodingError as e:
        if error is not None or any(data[:1] == b"E" for data in shards):
            raise  # an owner's report: every rank got the same bytes and raises here
        reason = f"worker {rank} received a corrupt shard sum ({e})"
        _tell_peers(comm, reason)  # this rank may be the only one that saw it
        raise EncodingError(reason) from e
    return Round(active, total, indices)


def _tell_peers(comm: Communicator, reason: str) -> None:
    """Hand a phase-2 error only this rank may have seen (a shard sum corrupt on its way here) to every peer.

    A peer that assembled its round joins the next exchange's reduce-scatter (an exchange that carried messages is
    always followed by another one in the epoch: it ends after a round in which every worker was inactive); this
    rank joins it with ``[0xFE | reason]`` pieces, so every peer raises the same EncodingError there instead of
    waiting for this rank until the communicator's timeout. Peers that saw the error too tell theirs in the same
    collective. A checkpoint cut between the two rounds is the one case the message cannot pass (the peers' next
    collective is the checkpoint's barrier): they end in WaitTimeout then, this rank in the EncodingError.
    """
    try:
        comm.all_to_all_bytes([bytes([_REPORTED]) + reason.encode()] * comm.world_size)
    except WaitTimeout:
        pass  # the peers went elsewhere (see above); this rank's own EncodingError is raised by the caller
