"""Bytes the client sends to the executors without ``broadcast``: in the task function's closure when small, else
as files of the Connect session's artifacts.

A Connect session has no ``SparkContext.broadcast``; a ``mapInArrow`` function travels inside the query plan, one
gRPC message capped by the server's ``spark.connect.grpc.maxInboundMessageSize`` (128 MiB by default). So
`ship_bytes` keeps a payload (a network's weights, a data plan) in the closure while it is well under the cap
(`inline_limit`), and otherwise uploads it with ``spark.addArtifacts(path, file=True)`` (the client streams
artifacts in small chunks, so no message outgrows the cap), cut into files of at most `ARTIFACT_PART_BYTES`.
A task reads it back with `Shipment.read` (``SparkFiles.get`` finds a session's files on every executor) and
checks its SHA-256.

Artifacts stay in the session's artifact directory on the server until the session ends (Connect has no call to
remove one); each shipment has a fresh name.

Example::

    shipment = ship_bytes(spark, blob, "weights")   # on the client
    def fn(batches): data = shipment.read(); ...    # in the task
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

from torchspark.errors import SetupError
from torchspark.spark.connect.chunks import from_chunks, to_chunks
from torchspark.spark.session_kinds import is_connect_session

__all__ = ["Shipment", "ship_bytes", "message_cap", "inline_limit", "ARTIFACT_PART_BYTES", "DEFAULT_MESSAGE_CAP"]

#: Connect's default ``spark.connect.grpc.maxInboundMessageSize``
DEFAULT_MESSAGE_CAP = 128 * 1024 * 1024

#: the largest artifact file one shipment writes (a payload over it becomes several files)
ARTIFACT_PART_BYTES = 64 * 1024 * 1024

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.I)


def _parse_bytes(text: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise SetupError(f"cannot read spark.connect.grpc.maxInboundMessageSize={text!r} as a size in bytes")
    return int(match.group(1)) * 1024 ** " kmgt".index((match.group(2) or " ").lower())


def message_cap(spark: Any) -> int:
    """The server's cap on one message (``spark.connect.grpc.maxInboundMessageSize``; 128 MiB when unset)."""
    try:
        value = spark.conf.get("spark.connect.grpc.maxInboundMessageSize", None)
    except Exception:  # a server that does not expose it: assume Connect's default
        value = None
    return DEFAULT_MESSAGE_CAP if value in (None, "") else _parse_bytes(str(value))


def inline_limit(spark: Any) -> int:
    """The largest payload kept in a function's closure: a quarter of `message_cap`, leaving the rest of the
    message to the plan, the function's code and the other captured values. A classic session
    (``dataframe_route="barrier_arrow"``) has no cap: PySpark broadcasts a large pickled function itself."""
    if not is_connect_session(spark):
        return sys.maxsize
    return message_cap(spark) // 4


@dataclass(frozen=True)
class Shipment:
    """Bytes on their way to the executors: ``inline`` (in the closure), or the session artifacts ``names`` (in
    order) holding its parts. ``size`` and ``sha256`` describe the whole payload."""

    inline: bytes | None
    names: tuple[str, ...]
    size: int
    sha256: str

    @property
    def via_artifacts(self) -> bool:
        """Whether the payload travels as session artifacts (not in the closure)."""
        return self.inline is None

    def read(self) -> bytes:
        """The payload, in a Spark task (artifacts: read with ``SparkFiles.get``, checked against ``sha256``).

        Raises:
            SetupError: an artifact is missing on this executor, or its bytes are not the ones shipped.
        """
        if self.inline is not None:
            return self.inline
        from pyspark import SparkFiles

        parts = []
        for name in self.names:
            path = SparkFiles.get(name)
            try:
                with open(path, "rb") as f:
                    parts.append(f.read())
            except OSError as e:
                raise SetupError(
                    f"the session artifact {name!r} is not on this executor ({path}: {e}); the client "
                    "uploaded it with spark.addArtifacts(..., file=True)"
                ) from e
        data = from_chunks(parts)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise SetupError(
                f"the {len(data)} bytes read from the session artifacts {list(self.names)} are not the "
                f"{self.size} bytes the client shipped"
            )
        return data


def ship_bytes(spark: Any, payload: bytes, label: str, limit: int | None = None) -> Shipment:
    """Send ``payload`` towards the executors of a Connect session ``spark``.

    Args:
        spark: the Connect session.
        payload: the bytes.
        label: names the artifact files (``torchspark-<label>-<random>-<part>.bin``).
        limit: the largest payload kept inline (default `inline_limit`); 0 ships everything as artifacts.
    """
    digest = hashlib.sha256(payload).hexdigest()
    if len(payload) <= (inline_limit(spark) if limit is None else limit):
        return Shipment(bytes(payload), (), len(payload), digest)
    stem = f"torchspark-{label}-{uuid.uuid4().hex[:16]}"
    directory = tempfile.mkdtemp(prefix="torchspark-ship-")
    try:
        paths = []
        for k, part in enumerate(to_chunks(payload, ARTIFACT_PART_BYTES)):
            paths.append(os.path.join(directory, f"{stem}-{k}.bin"))
            with open(paths[-1], "wb") as f:
                f.write(part)
        spark.addArtifacts(*paths, file=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Shipment(None, tuple(os.path.basename(p) for p in paths), len(payload), digest)
