"""Bytes too large for one Spark Connect message, cut into parts: the rows a stage sends back to the client.

A Connect client and server exchange gRPC messages of at most ``spark.connect.grpc.maxInboundMessageSize`` (128 MiB
by default), and the server streams a query's result in Arrow batches of about
``spark.connect.grpc.arrow.maxBatchSize`` (4 MiB). A task that hands back a network's weights therefore returns them
as several rows of `PAYLOAD_SCHEMA`, one part each, and the client joins them again:

* task side: ``yield from payload_batches(rank, "result", blob)`` inside a ``mapInArrow`` function whose output
  schema is `PAYLOAD_SCHEMA`;
* client side: ``payloads = gather_payloads(frame.mapInArrow(fn, PAYLOAD_SCHEMA).toArrow())`` ->
  ``{(rank, kind): bytes}``.

Example: ``to_chunks(b"x" * 10, 4)`` -> ``[b"xxxx", b"xxxx", b"xx"]``; ``from_chunks`` of that -> the 10 bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torchspark.errors import DataError

__all__ = ["CHUNK_BYTES", "PAYLOAD_SCHEMA", "to_chunks", "from_chunks", "payload_batches", "gather_payloads"]

#: bytes per part: under the server's Arrow batch size (4 MiB), far under any message cap
CHUNK_BYTES = 1 << 20

#: the rows of a stage that returns payloads: ``(rank, kind, part, parts, payload)``; ``kind`` names what the
#: payload is (``"result"``, ``"metrics"``...), ``part`` counts from 0 to ``parts - 1``
PAYLOAD_SCHEMA = "rank long, kind string, part long, parts long, payload binary"


def to_chunks(payload: bytes, chunk_bytes: int = CHUNK_BYTES) -> list[bytes]:
    """``payload`` cut into parts of at most ``chunk_bytes`` (one empty part for an empty payload)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    view = memoryview(payload)
    return [bytes(view[i : i + chunk_bytes]) for i in range(0, len(view), chunk_bytes)] or [b""]


def from_chunks(parts: Sequence[bytes]) -> bytes:
    """The payload `to_chunks` cut, from its parts in order."""
    return b"".join(bytes(p) for p in parts)


def payload_batches(rank: int, kind: str, payload: bytes, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Any]:
    """Arrow record batches of `PAYLOAD_SCHEMA` carrying ``payload`` (one row per part, one part per batch,
    so no batch outgrows the server's Arrow batch size)."""
    import pyarrow as pa

    parts = to_chunks(payload, chunk_bytes)
    for k, part in enumerate(parts):
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([rank], pa.int64()),
                pa.array([kind], pa.string()),
                pa.array([k], pa.int64()),
                pa.array([len(parts)], pa.int64()),
                pa.array([part], pa.binary()),
            ],
            names=["rank", "kind", "part", "parts", "payload"],
        )


def gather_payloads(table: Any) -> dict[tuple[int, str], bytes]:
    """Every ``(rank, kind)`` payload of a `PAYLOAD_SCHEMA` result, joined from its parts (a ``pyarrow.Table``
    from ``DataFrame.toArrow()``, or Rows from ``collect()``).

    Raises:
        DataError: a payload with a part missing or repeated (the stage's rows were not all read).
    """
    rows = (
        zip(*(table.column(c).to_pylist() for c in ("rank", "kind", "part", "parts", "payload")))
        if hasattr(table, "column")
        else ((r[0], r[1], r[2], r[3], r[4]) for r in table)
    )
    parts: dict[tuple[int, str], dict[int, bytes]] = {}
    expected: dict[tuple[int, str], int] = {}
    for rank, kind, part, count, payload in rows:
        key = (int(rank), str(kind))
        if part in parts.setdefault(key, {}):
            raise DataError(f"part {part} of the {kind!r} payload of rank {rank} arrived twice")
        parts[key][int(part)] = bytes(payload)
        expected[key] = int(count)
    out = {}
    for key, got in parts.items():
        if sorted(got) != list(range(expected[key])):
            raise DataError(f"the {key[1]!r} payload of rank {key[0]} has parts {sorted(got)} of {expected[key]}")
        out[key] = from_chunks([got[k] for k in range(expected[key])])
    return out
