"""The worker's side of the progress channel: a non-blocking sender of progress, scores, errors and clock probes."""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from torchspark.errors import ConfigError
from torchspark.stats.clock import best_clock_sample
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.progress.wire import ChannelLimits, LineReader, encode, progress_line, score_line
from torchspark.training.rendezvous import auth

__all__ = ["ProgressClient", "ProgressEndpoint", "estimate_clock_offset"]

logger = logging.getLogger(__name__)

# Tracebacks are cut to their last characters (the end names the error); the server keeps at most this much too.
_MAX_TRACEBACK_CHARS = ChannelLimits.max_error_chars - 64
# How often the idle sender wakes up to re-check for shutdown.
_POLL_S = 0.1
#: how often a connected worker tells the driver it is alive (the driver's watchdog allows rendezvous_timeout_s)
HEARTBEAT_S = 2.0


class ProgressEndpoint(NamedTuple):
    """Where a worker sends progress and the fit's token that lets it in (`ProgressServer.endpoint`)."""

    host: str
    port: int
    token: bytes


def estimate_clock_offset(probes: Sequence[tuple[float, float, float]]) -> float:
    """``driver_time - worker_time`` from ``(t_send, t_driver, t_recv)`` probes sent by the worker (Cristian's
    algorithm: the probe with the smallest round trip wins; its error is at most half that round trip).

    This is [`torchspark.stats.best_clock_sample`][torchspark.stats.best_clock_sample] seen from the worker's side: the worker is the pinging end.

    Raises:
        ConfigError: ``probes`` is empty.
    """
    if not probes:
        raise ConfigError("estimate_clock_offset needs at least one (t_send, t_driver, t_recv) probe, got none")
    return best_clock_sample(probes).offset


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock`` (its timeout bounds each read); OSError when it closes first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of the {n} bytes of the server's challenge")
        data += chunk
    return data


class ProgressClient:
    """Worker-side sender; use it directly as ``WorkerHooks(progress=client)``.

    Progress goes through a bounded queue drained by one background thread, so `send` never blocks
    training; when the queue is full the oldest update is dropped (only the newest matter for a display).
    Score reports (`send_score`) go through the same thread but are never dropped.
    If the driver cannot be reached the client logs one warning and does nothing from then on.

    Args:
        host, port: the driver's `ProgressServer.address`.
        rank: this worker's rank (put on error messages).
        token: the fit's token (`ProgressServer.token`); the server drops a connection without it.
        timeout_s: bound on every blocking step (connect, each send, each clock probe, the flush at close).
            Short keeps a dead driver from delaying a worker; 10 s is ample on a cluster network.
        queue_size: progress updates buffered while the sender is busy; 256 is plenty at one report per
            ``progress_every`` minibatches.
        clock: the worker's time function (injectable for tests).
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        timeout_s: float = 10.0,
        queue_size: int = 256,
        clock: Callable[[], float] = time.time,
        *,
        token: bytes,
    ) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"ProgressClient timeout_s must be > 0 seconds, got {timeout_s}")
        if queue_size < 1:
            raise ConfigError(f"ProgressClient queue_size must be >= 1, got {queue_size}")
        self.host, self.port, self.rank = host, port, rank
        self._token = token
        auth.hello(token)  # validates the token
        self.timeout_s = timeout_s
        self._clock = clock
        self._sock: socket.socket | None = None
        self._reader: LineReader | None = None
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: collections.deque[bytes] = collections.deque(maxlen=queue_size)
        self._scores: list[bytes] = []  # unbounded: a few per epoch, each one a log line the user asked for
        self._dropped = 0
        self._closing = False
        self._broken = False
        self._probe_id = 0
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """True while connected and healthy; False means every call is a no-op."""
        return self._sock is not None and not self._broken and not self._closing

    @property
    def dropped(self) -> int:
        """Progress updates dropped because the queue was full."""
        with self._cond:
            return self._dropped

    def connect(self) -> ProgressClient:
        """Connect to the driver and start the sender thread; on failure warn and become a no-op. Returns self."""
        if self._sock is not None or self._closing:
            return self
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as e:
            logger.warning(
                "worker %d cannot reach the driver's progress server at %s:%s (%s); "
                "training continues without live progress",
                self.rank,
                self.host,
                self.port,
                e,
            )
            self._broken = True
            return self
        sock.settimeout(self.timeout_s)  # every send and recv is bounded
        try:
            sock.sendall(auth.hello(self._token, _recv_exactly(sock, auth.NONCE_BYTES)))
        except OSError as e:
            logger.warning(
                "worker %d: the driver's progress server at %s:%s closed the connection (%s); "
                "training continues without live progress",
                self.rank,
                self.host,
                self.port,
                e,
            )
            sock.close()
            self._broken = True
            return self
        self._sock, self._reader = sock, LineReader(sock)
        self._pid = os.getpid()
        self._alive_line = encode({"kind": "alive", "rank": self.rank, "pid": self._pid})
        self._thread = threading.Thread(
            target=self._sender_loop, daemon=True, name=f"torchspark-progress-sender-{self.rank}"
        )
        self._thread.start()
        return self

    def send(self, update: ProgressUpdate) -> None:
        """Queue ``update`` for the driver; never blocks (drops the oldest queued update when full)."""
        if not self.active:
            return
        line = progress_line(update, self._pid)
        with self._cond:
            if len(self._pending) == self._pending.maxlen:
                self._dropped += 1
            self._pending.append(line)
            self._cond.notify()

    __call__ = send

    def send_score(self, report: ScoreReport) -> None:
        """Queue ``report`` for the driver; never blocks and, unlike progress, never drops it."""
        if not self.active:
            return
        line = score_line(report)
        with self._cond:
            self._scores.append(line)
            self._cond.notify()

    def send_error(self, traceback_text: str) -> None:
        """Send a traceback to the driver now (best effort, bounded by ``timeout_s``; never raises)."""
        if not self.active:
            return
        if len(traceback_text) > _MAX_TRACEBACK_CHARS:
            traceback_text = "...[truncated]\n" + traceback_text[-_MAX_TRACEBACK_CHARS:]
        self._write(encode({"kind": "error", "rank": self.rank, "traceback": traceback_text}))

    @contextlib.contextmanager
    def reporting_errors(self) -> Iterator[None]:
        """Send the traceback of any exception raised inside the block, then re-raise it."""
        import traceback  # only needed on failure

        try:
            yield
        except BaseException:
            self.send_error(traceback.format_exc())
            raise

    def measure_clock_offset(self, samples: int = 5) -> float:
        """Estimate ``driver_time - worker_time`` in seconds (see `estimate_clock_offset`).

        Args:
            samples: probes to send; more probes make a low-latency one likelier. 5 suits a quiet network.

        Returns:
            The offset, or 0.0 when the driver is unreachable or every probe failed.
        """
        if samples < 1:
            raise ConfigError(f"measure_clock_offset samples must be >= 1, got {samples}")
        got: list[tuple[float, float, float]] = []
        if not self.active:
            return 0.0
        if not self._read_lock.acquire(timeout=self.timeout_s):
            logger.warning("worker %d: another clock measurement is running; offset 0.0", self.rank)
            return 0.0
        try:
            for _ in range(samples):
                sample = self._probe()
                if sample is None:
                    break
                got.append(sample)
        finally:
            self._read_lock.release()
        return estimate_clock_offset(got) if got else 0.0

    def _probe(self) -> tuple[float, float, float] | None:
        assert self._reader is not None
        self._probe_id += 1
        t_send = self._clock()
        if not self._write(encode({"kind": "clock", "t_worker": t_send, "id": self._probe_id})):
            return None
        try:
            while True:  # skip replies to earlier probes that timed out
                line = self._reader.readline()
                t_recv = self._clock()
                if line is None:
                    raise OSError("driver closed the connection")
                reply = json.loads(line.decode("utf-8"))
                if isinstance(reply, dict) and reply.get("id", self._probe_id) == self._probe_id:
                    return t_send, float(reply["t_driver"]), t_recv
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("worker %d: clock probe failed (%s); using the probes so far", self.rank, e)
            return None

    def _write(self, data: bytes) -> bool:
        """Send ``data``; on failure warn once and turn the client into a no-op. False if not sent."""
        sock = self._sock
        if sock is None or self._broken:
            return False
        if not self._write_lock.acquire(timeout=self.timeout_s):
            logger.debug("worker %d: progress socket busy for %.1f s; message dropped", self.rank, self.timeout_s)
            return False
        try:
            sock.sendall(data)
            return True
        except OSError as e:
            if not self._broken:
                logger.warning("worker %d: lost the driver's progress server (%s); live progress off", self.rank, e)
            self._broken = True
            return False
        finally:
            self._write_lock.release()

    def _sender_loop(self) -> None:
        next_beat = 0.0  # the first heartbeat goes out at once: it tells the driver this rank's process id
        while True:
            with self._cond:
                while not self._pending and not self._scores and not self._closing and time.monotonic() < next_beat:
                    self._cond.wait(_POLL_S)
                batch = [*self._scores, *self._pending]
                if time.monotonic() >= next_beat:
                    batch.append(self._alive_line)
                    next_beat = time.monotonic() + HEARTBEAT_S
                self._pending.clear()
                self._scores.clear()
                closing = self._closing
            if batch and not self._write(b"".join(batch)):
                return
            if closing:  # send() refuses new updates once closing, so this batch was the last
                return

    def close(self) -> None:
        """Flush queued updates (bounded by ``timeout_s``), stop the sender thread and disconnect. Idempotent."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(self.timeout_s)
            if self._thread.is_alive():
                logger.warning(
                    "worker %d: progress flush took over %.1f s; dropping the rest", self.rank, self.timeout_s
                )
        if self._sock is not None:
            stuck = self._thread is not None and self._thread.is_alive()
            with contextlib.suppress(OSError):
                # SHUT_WR: a clean end of stream after the queued bytes; SHUT_RDWR also wakes a stuck sendall
                self._sock.shutdown(socket.SHUT_RDWR if stuck else socket.SHUT_WR)
            if stuck and self._thread is not None:
                self._thread.join(self.timeout_s)
            self._sock.close()

    @classmethod
    def to(cls, endpoint: ProgressEndpoint, rank: int, **kwargs: object) -> ProgressClient:
        """A client for ``endpoint`` (host, port and token); ``kwargs`` as for the constructor."""
        return cls(endpoint.host, int(endpoint.port), rank, token=endpoint.token, **kwargs)  # type: ignore[arg-type]

    def __enter__(self) -> ProgressClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()
