"""The progress channel through a directory: workers append their messages to files that the driver polls, so
progress, heartbeats, scores and tracebacks reach a driver that no executor can connect to (a Spark Connect client
on a laptop).

Each worker writes *chunks*: files named ``rank-<rank>-<seq>.jsonl`` (`chunk_name`), each holding the same
JSON lines the TCP channel sends (`wire`), written atomically (a temporary name,
then a rename, `torchspark._io.atomic_write_bytes`), so the driver never reads half a chunk. The driver reads
every chunk it has not read yet, in ``seq`` order per rank (`poller`).

1. progress updates and score reports are buffered and written as one chunk every ``flush_s`` seconds (at most one
   file per rank per ``flush_s``; only the newest ``queue_size`` progress updates of a chunk are kept, scores all);
2. a heartbeat (``{"kind": "alive"}``) goes into the next chunk every `HEARTBEAT_S` seconds, so the driver's
   watchdog sees a wedged worker as on the TCP channel;
3. a traceback is written at once, as its own chunk (the stage is about to fail; the driver reads it before it
   reads Spark's error);
4. `DirectoryProgressWriter.close` writes what is left and a last ``{"kind": "closed"}`` line: the rank
   ended (the TCP channel's closed connection).

Like the TCP channel this is best effort: a write that fails logs one warning and turns the writer off; training
never waits on the directory for longer than one write.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from torchspark._io import atomic_write_bytes, join, make_dirs
from torchspark.errors import ConfigError
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.progress.wire import ChannelLimits, encode, progress_line, score_line

__all__ = ["ProgressDirectory", "DirectoryProgressWriter", "chunk_name", "parse_chunk_name", "HEARTBEAT_S"]

logger = logging.getLogger(__name__)

#: how often a worker writes a heartbeat into its chunks (the driver's watchdog allows rendezvous_timeout_s)
HEARTBEAT_S = 2.0
_MAX_TRACEBACK_CHARS = ChannelLimits.max_error_chars - 64
_CHUNK = re.compile(r"^rank-(\d+)-(\d+)\.jsonl$")


class ProgressDirectory(NamedTuple):
    """Where a fit's workers write their progress chunks (shipped inside the task, like
    `ProgressEndpoint` is for the TCP channel).

    Attributes:
        url: the attempt's directory, any fsspec URL every executor can write and the driver can list
            (``"s3://bucket/runs/progress/<id>"``, a shared mount, ``memory://`` in one process).
        flush_s: how often a worker writes its buffered messages (one file per rank per flush at most).
    """

    url: str
    flush_s: float = 1.0


def chunk_name(rank: int, seq: int) -> str:
    """The file name of chunk ``seq`` of ``rank``; zero-padded, so names sort in write order."""
    return f"rank-{rank:05d}-{seq:09d}.jsonl"


def parse_chunk_name(name: str) -> tuple[int, int] | None:
    """``(rank, seq)`` of a chunk's file name (its last path component), None for any other file (temporary
    names of writes in flight included)."""
    m = _CHUNK.match(name.rsplit("/", 1)[-1])
    return (int(m.group(1)), int(m.group(2))) if m else None


class DirectoryProgressWriter:
    """Worker-side writer of the directory channel; use it as ``WorkerHooks(progress=writer)`` (the same calls
    as `ProgressClient`).

    Args:
        target: the fit's `ProgressDirectory`.
        rank: this worker's rank.
        queue_size: progress updates kept per chunk (the oldest are dropped first: only the newest matter).
        clock: the worker's monotonic clock (injectable for tests).

    Example::

        with DirectoryProgressWriter(ProgressDirectory("s3://bucket/run/progress/ab12"), rank=0) as writer:
            run_worker(..., hooks=WorkerHooks(progress=writer, report_error=writer.send_error))
    """

    def __init__(
        self, target: ProgressDirectory, rank: int, queue_size: int = 256, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not target.flush_s > 0:
            raise ConfigError(f"ProgressDirectory flush_s must be > 0 seconds, got {target.flush_s!r}")
        if queue_size < 1:
            raise ConfigError(f"DirectoryProgressWriter queue_size must be >= 1, got {queue_size}")
        self.target, self.rank = target, rank
        self._clock = clock
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._progress: collections.deque[bytes] = collections.deque(maxlen=queue_size)
        self._scores: list[bytes] = []
        self._seq = 0
        self._write_lock = threading.Lock()
        self._last_alive = float("-inf")
        self._closing = False
        self._broken = False
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """True while writing works; False means every call is a no-op."""
        return not self._broken and not self._closing

    def connect(self) -> DirectoryProgressWriter:
        """Write the first heartbeat and start the flushing thread. Returns self."""
        if self._thread is None and self.active:
            try:  # the driver made it; a worker whose filesystem has real directories makes sure
                make_dirs(self.target.url, OSError, "progress directory")
            except Exception as e:  # noqa: BLE001 - best effort, as every write
                logger.warning(
                    "worker %d cannot create the progress directory %s (%s); training continues without live progress",
                    self.rank,
                    self.target.url,
                    e,
                )
                self._broken = True
                return self
            self._write_chunk([self._alive_line()])
            self._thread = threading.Thread(
                target=self._flush_loop, daemon=True, name=f"torchspark-progress-files-{self.rank}"
            )
            self._thread.start()
        return self

    def send(self, update: ProgressUpdate) -> None:
        """Buffer ``update`` for the next chunk; never blocks on the directory."""
        if not self.active:
            return
        line = progress_line(update, self._pid)
        with self._cond:
            self._progress.append(line)

    __call__ = send

    def send_score(self, report: ScoreReport) -> None:
        """Buffer ``report`` for the next chunk (never dropped)."""
        if not self.active:
            return
        with self._cond:
            self._scores.append(score_line(report))

    def send_error(self, traceback_text: str) -> None:
        """Write the buffered messages and ``traceback_text`` now, as chunks of their own (never raises)."""
        if not self.active:
            return
        if len(traceback_text) > _MAX_TRACEBACK_CHARS:
            traceback_text = "...[truncated]\n" + traceback_text[-_MAX_TRACEBACK_CHARS:]
        self._flush()
        self._write_chunk([encode({"kind": "error", "rank": self.rank, "traceback": traceback_text})])

    def measure_clock_offset(self, samples: int = 5) -> float:
        """0.0: files carry no round trip to measure, so the worker's stats stay on its own clock."""
        return 0.0

    def close(self) -> None:
        """Write what is buffered and the ``closed`` line, stop the thread. Idempotent."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60.0)
        if not self._broken:
            lines = self._take()
            self._write_chunk([*lines, encode({"kind": "closed", "rank": self.rank, "pid": self._pid})])

    def __enter__(self) -> DirectoryProgressWriter:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # internals
    def _alive_line(self) -> bytes:
        self._last_alive = self._clock()
        return encode({"kind": "alive", "rank": self.rank, "pid": self._pid})

    def _take(self) -> list[bytes]:
        with self._cond:
            lines = [*self._progress, *self._scores]
            self._progress.clear()
            self._scores.clear()
        if self._clock() - self._last_alive >= HEARTBEAT_S:
            lines.append(self._alive_line())
        return lines

    def _flush(self) -> None:
        lines = self._take()
        if lines:
            self._write_chunk(lines)

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._closing, timeout=self.target.flush_s):
                    return
            self._flush()
            if self._broken:
                return

    def _write_chunk(self, lines: list[bytes]) -> None:
        with self._write_lock:
            if self._broken:
                return
            url = join(self.target.url, chunk_name(self.rank, self._seq))
            try:
                atomic_write_bytes(url, b"".join(lines), OSError)
            except Exception as e:  # noqa: BLE001 - progress is best effort: never fail training over it
                logger.warning(
                    "worker %d cannot write progress to %s (%s); training continues without live progress",
                    self.rank,
                    self.target.url,
                    e,
                )
                self._broken = True
                return
            self._seq += 1
