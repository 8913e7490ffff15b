"""The progress channel's wire format: a fixed-size hello, then newline-delimited JSON messages, and its limits.

A connection starts with `torchspark.training.rendezvous.auth.hello` (``HELLO_BYTES`` bytes); the server reads exactly
that much and drops the connection unless it proves the fit's token. Then one JSON object per line (UTF-8),
worker -> driver:

1. ``{"kind": "progress", "rank", "epoch", "iteration", "examples", "score"}`` (optionally ``"bytes_sent"`` and
   ``"dense_bytes"``, gradient sharing's traffic so far; 0 when absent) -> a [`ProgressUpdate`][torchspark.training.ProgressUpdate];
2. ``{"kind": "clock", "t_worker": float, "id": int}`` -> the driver replies at once with one line
   ``{"t_driver": float, "id": int}`` (``id`` echoed so a late reply is never mistaken for the next one);
3. ``{"kind": "error", "rank", "traceback": str}`` -> a worker's traceback;
4. ``{"kind": "score", "epoch", "round", "examples", "score"}`` -> a [`ScoreReport`][torchspark.training.ScoreReport];
5. ``{"kind": "alive", "rank", "pid"}`` -> a heartbeat, sent on connect and every few seconds while the worker
   lives (the driver's watchdog names a rank that stops sending them, `liveness`). Progress messages carry ``"pid"`` too.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from typing import Any

from torchspark.errors import ConfigError
from torchspark.training.hooks import ProgressUpdate, ScoreReport

__all__ = [
    "ChannelLimits",
    "Malformed",
    "encode",
    "progress_line",
    "score_line",
    "parse_line",
    "progress_from_msg",
    "score_from_msg",
    "int_field",
    "LineReader",
    "LineSplitter",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChannelLimits:
    """Bounds on what one fit's progress server holds, whoever connects.

    Args:
        max_line_bytes: a longer line is dropped as malformed (bounds one connection's buffer). 1 MiB fits any
            traceback the client sends.
        max_error_chars: a worker traceback is cut to its last characters (the end names the error).
        max_error_bytes: total traceback text the server keeps over the fit; later errors are counted, their text
            dropped (the first errors hold the root cause). 1 MiB keeps at least 16 full tracebacks.
        max_errors: error entries kept at most.
        max_connections: open authenticated connections at most (one per worker; a new one over it is closed).
        max_pending: connections still owing their hello at most; over it one is dropped (one that sent part of
            a hello before a silent one, the oldest first), so a flood of strangers cannot lock a worker out for
            longer than its hello takes.
        hello_timeout_s: a connection that has not sent a valid hello within this is dropped.
    """

    max_line_bytes: int = 1 << 20
    max_error_chars: int = 64_000
    max_error_bytes: int = 1 << 20
    max_errors: int = 256
    max_connections: int = 4096
    max_pending: int = 128
    hello_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "max_line_bytes",
            "max_error_chars",
            "max_error_bytes",
            "max_errors",
            "max_connections",
            "max_pending",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ChannelLimits.{name} must be an integer >= 1, got {value!r}")
        if not self.hello_timeout_s > 0:
            raise ConfigError(f"ChannelLimits.hello_timeout_s must be > 0 seconds, got {self.hello_timeout_s!r}")


class Malformed(Exception):
    """A line that is not a valid message (logged and skipped, never raised to callers)."""


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode("utf-8") + b"\n"


def progress_line(update: ProgressUpdate, pid: int) -> bytes:
    """The wire line of ``update`` from worker process ``pid`` (read back by `progress_from_msg`): the same
    on the TCP channel and in a progress directory's chunks."""
    return encode(
        {
            "kind": "progress",
            "rank": update.rank,
            "epoch": update.epoch,
            "iteration": update.iteration,
            "examples": update.examples,
            "score": update.score,
            "bytes_sent": update.bytes_sent,
            "dense_bytes": update.dense_bytes,
            "pid": pid,
        }
    )


def score_line(report: ScoreReport) -> bytes:
    """The wire line of ``report`` (read back by `score_from_msg`)."""
    return encode(
        {
            "kind": "score",
            "epoch": report.epoch,
            "round": report.round,
            "examples": report.examples,
            "score": report.score,
        }
    )


def int_field(msg: dict[str, Any], key: str) -> int:
    v = msg.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise Malformed(f"field {key!r} must be an integer, got {v!r}")
    return v


def _float_field(msg: dict[str, Any], key: str) -> float:
    v = msg.get(key)
    if v is None:  # a worker without a score yet
        return float("nan")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise Malformed(f"field {key!r} must be a number, got {v!r}")
    return float(v)


def progress_from_msg(msg: dict[str, Any]) -> ProgressUpdate:
    return ProgressUpdate(
        rank=int_field(msg, "rank"),
        epoch=int_field(msg, "epoch"),
        iteration=int_field(msg, "iteration"),
        examples=int_field(msg, "examples"),
        score=_float_field(msg, "score"),
        bytes_sent=_count_field(msg, "bytes_sent"),
        dense_bytes=_count_field(msg, "dense_bytes"),
        pid=int_field(msg, "pid") if "pid" in msg else None,
    )


def _count_field(msg: dict[str, Any], key: str) -> int:
    """An optional non-negative integer (0 when absent: older workers and averaging send none)."""
    if key not in msg:
        return 0
    v = int_field(msg, key)
    if v < 0:
        raise Malformed(f"field {key!r} must be >= 0, got {v}")
    return v


def score_from_msg(msg: dict[str, Any]) -> ScoreReport:
    round_ = msg.get("round")
    return ScoreReport(
        epoch=int_field(msg, "epoch"),
        round=None if round_ is None else int_field(msg, "round"),
        examples=int_field(msg, "examples"),
        score=_float_field(msg, "score"),
    )


def parse_line(line: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Malformed(f"not a JSON line: {e}") from e
    if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
        raise Malformed("a message must be a JSON object with a string 'kind'")
    return msg


class LineSplitter:
    """Cuts a byte stream fed in chunks into lines of at most ``max_line_bytes`` (longer ones are skipped), so
    one connection never buffers more than that."""

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line: drop bytes until its newline

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add ``chunk``; return the complete lines it finished, without their newlines."""
        self._buf += chunk
        lines: list[bytes] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if self._skipping:
                self._skipping = False
            else:
                lines.append(line)
        if len(self._buf) > self._max:
            if not self._skipping:
                logger.warning("progress channel: dropping a line longer than %d bytes", self._max)
            self._skipping = True
            self._buf.clear()
        return lines


class LineReader:
    """Blocking line reader over a socket (the client's side of clock probes)."""

    def __init__(self, sock: socket.socket, max_line_bytes: int = ChannelLimits.max_line_bytes) -> None:
        self._sock = sock
        self._splitter = LineSplitter(max_line_bytes)
        self._ready: list[bytes] = []

    def readline(self) -> bytes | None:
        """The next line without its newline, or None at end of stream.

        Raises:
            OSError: the socket failed or timed out (``socket.timeout`` is an ``OSError``).
        """
        while not self._ready:
            chunk = self._sock.recv(65536)
            if not chunk:
                return None
            self._ready.extend(self._splitter.feed(chunk))
        return self._ready.pop(0)
