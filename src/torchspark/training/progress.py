"""The live channel from training workers to the driver: progress, worker tracebacks and clock offsets.

Spark hides what executors do until a stage ends; this module lets workers stream to the driver while they train.

* :class:`ProgressServer` runs on the driver: a small threaded TCP server on an ephemeral port.
* :class:`ProgressClient` runs in each worker; it is a ``WorkerHooks.progress`` callable.
* :class:`ProgressBar` is a driver-side ``tqdm`` display fed by a server listener.

Wire protocol: newline-delimited JSON objects, one per line (UTF-8), worker -> driver:

1. ``{"kind": "progress", "rank", "epoch", "iteration", "examples", "score"}`` -> a :class:`ProgressUpdate`
   for every progress listener; the server keeps the latest update per rank.
2. ``{"kind": "clock", "t_worker": float, "id": int}`` -> the driver replies at once with one line
   ``{"t_driver": float, "id": int}`` (``id`` echoed so a late reply is never mistaken for the next one).
3. ``{"kind": "error", "rank", "traceback": str}`` -> kept in :meth:`ProgressServer.errors` and given to every
   error listener, so a worker's traceback reaches the driver even when Spark truncates its own error.
4. ``{"kind": "score", "epoch", "round", "examples", "score"}`` -> a :class:`ScoreReport` (the score all workers
   agree on after an averaging round or a gradient-sharing epoch) for every score listener.

Progress is best-effort by design: a worker never blocks on the driver and never fails because the driver
is unreachable. Score reports are never dropped to make room (a few per epoch); a driver that wants all of them
closes the server with ``drain_s`` after the workers exited. Typical wiring (the Spark / local-process runners do
this)::

    bar = ProgressBar(total_examples=n_examples * epochs)
    with ProgressServer(listeners=[bar.update]) as server:      # driver
        host, port = server.address                              # shipped to every task
        ...
    # in each worker task:
    with ProgressClient(host, port, rank) as client:
        offset = client.measure_clock_offset()                   # driver_time - worker_time, for the timeline
        with client.reporting_errors():
            run_worker(..., hooks=WorkerHooks(progress=client))
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import socket
import socketserver
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

from torchspark.errors import ConfigError, SetupError
from torchspark.stats.clock import best_clock_sample
from torchspark.training.hooks import ProgressUpdate, ScoreReport

__all__ = [
    "ProgressServer",
    "ProgressClient",
    "ProgressBar",
    "estimate_clock_offset",
    "ProgressListener",
    "ErrorListener",
    "ScoreListener",
]

logger = logging.getLogger(__name__)

ProgressListener = Callable[[ProgressUpdate], None]
ErrorListener = Callable[[int, str], None]
ScoreListener = Callable[[ScoreReport], None]

# A line longer than this is dropped as malformed: it bounds the memory one bad peer can take on the driver.
_MAX_LINE_BYTES = 1 << 20
# Tracebacks are cut to their last characters (the end names the error) so they always fit in one line.
_MAX_TRACEBACK_CHARS = 200_000
# How often idle background loops wake up to re-check for shutdown.
_POLL_S = 0.1


# --- wire format ------------------------------------------------------------------------------------------------

class _Malformed(Exception):
    """A line that is not a valid message (internal: logged and skipped, never raised to callers)."""


def _encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode("utf-8") + b"\n"


def _int_field(msg: dict[str, Any], key: str) -> int:
    v = msg.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise _Malformed(f"field {key!r} must be an integer, got {v!r}")
    return v


def _float_field(msg: dict[str, Any], key: str) -> float:
    v = msg.get(key)
    if v is None:  # a worker without a score yet
        return float("nan")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise _Malformed(f"field {key!r} must be a number, got {v!r}")
    return float(v)


def _progress_from_msg(msg: dict[str, Any]) -> ProgressUpdate:
    return ProgressUpdate(rank=_int_field(msg, "rank"), epoch=_int_field(msg, "epoch"),
                          iteration=_int_field(msg, "iteration"), examples=_int_field(msg, "examples"),
                          score=_float_field(msg, "score"))


def _score_from_msg(msg: dict[str, Any]) -> ScoreReport:
    round_ = msg.get("round")
    return ScoreReport(epoch=_int_field(msg, "epoch"), round=None if round_ is None else _int_field(msg, "round"),
                       examples=_int_field(msg, "examples"), score=_float_field(msg, "score"))


def _parse_line(line: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _Malformed(f"not a JSON line: {e}") from e
    if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
        raise _Malformed("a message must be a JSON object with a string 'kind'")
    return msg


class _LineReader:
    """Splits a socket's byte stream into lines of at most ``_MAX_LINE_BYTES`` (longer ones are skipped)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line: drop bytes until its newline

    def readline(self) -> bytes | None:
        """Return the next line without its newline, or None at end of stream.

        Raises:
            OSError: the socket failed or timed out (``socket.timeout`` is an ``OSError``).
        """
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                if self._skipping:
                    self._skipping = False
                    continue
                return line
            if len(self._buf) > _MAX_LINE_BYTES:
                if not self._skipping:
                    logger.warning("progress channel: dropping a line longer than %d bytes", _MAX_LINE_BYTES)
                self._skipping = True
                self._buf.clear()
            chunk = self._sock.recv(65536)
            if not chunk:
                return None
            self._buf += chunk


class _ExampleTally:
    """Counts examples from cumulative per-(rank, epoch) counts; late or repeated reports add nothing."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], int] = {}
        self.total = 0

    def add(self, update: ProgressUpdate) -> int:
        """Record ``update`` and return how many new examples it reports."""
        key = (update.rank, update.epoch)
        prev = self._seen.get(key, 0)
        if update.examples <= prev:
            return 0
        self._seen[key] = update.examples
        self.total += update.examples - prev
        return update.examples - prev


def _call_listeners(listeners: Sequence[Callable[..., None]], *args: Any) -> None:
    for fn in listeners:
        try:
            fn(*args)
        except Exception:  # a broken display must never stop the channel
            logger.exception("progress listener %r raised; ignored", fn)


# --- clock offset -----------------------------------------------------------------------------------------------

def estimate_clock_offset(probes: Sequence[tuple[float, float, float]]) -> float:
    """``driver_time - worker_time`` from ``(t_send, t_driver, t_recv)`` probes sent by the worker (Cristian's
    algorithm: the probe with the smallest round trip wins; its error is at most half that round trip).

    The same arithmetic as :func:`torchspark.stats.best_clock_sample`, seen from the worker's side.

    Raises:
        ConfigError: ``probes`` is empty.
    """
    if not probes:
        raise ConfigError("estimate_clock_offset needs at least one (t_send, t_driver, t_recv) probe, got none")
    return best_clock_sample(probes).offset


# --- driver side ------------------------------------------------------------------------------------------------

class _TCPServer(socketserver.TCPServer):
    """A TCPServer whose per-connection threads the owner tracks, so ``close()`` can wake and join them."""

    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], owner: ProgressServer) -> None:
        self.owner = owner
        super().__init__(addr, socketserver.BaseRequestHandler, bind_and_activate=True)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner._spawn_connection(request, client_address)


class ProgressServer:
    """Driver-side receiver of worker progress, clock probes and tracebacks.

    Listeners run on the server's connection threads (one per worker), so they must be thread-safe and quick;
    a listener that raises is logged and skipped. Updates of one rank arrive in the order the worker sent them.

    Args:
        host: interface to bind; ``"0.0.0.0"`` accepts workers on other machines, ``"127.0.0.1"`` local only.
        port: TCP port; 0 picks a free ephemeral port (recommended: no clashes between concurrent jobs).
        listeners: progress listeners, called with each :class:`ProgressUpdate`.
        error_listeners: called with ``(rank, traceback_text)`` for each worker error.
        score_listeners: called with each :class:`ScoreReport`.
        clock: the driver's time function used to answer clock probes (injectable for tests).
        advertise_host: the host name workers should dial; default: ``host``, or for a wildcard bind this
            machine's outbound IP address. Spark runners should pass ``spark.driver.host``.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 0, listeners: Iterable[ProgressListener] = (),
                 error_listeners: Iterable[ErrorListener] = (), clock: Callable[[], float] = time.time,
                 advertise_host: str | None = None, score_listeners: Iterable[ScoreListener] = ()) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"ProgressServer port must be in 0..65535 (0 = any free port), got {port}")
        self._host = host
        self._port = port
        self._advertise_host = advertise_host
        self._clock = clock
        self._listeners: list[ProgressListener] = list(listeners)
        self._error_listeners: list[ErrorListener] = list(error_listeners)
        self._score_listeners: list[ScoreListener] = list(score_listeners)
        self._lock = threading.Lock()
        self._latest: dict[int, ProgressUpdate] = {}
        self._tally = _ExampleTally()
        self._errors: list[tuple[int, str]] = []
        self._malformed = 0
        self._tcp: _TCPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._conns: dict[threading.Thread, socket.socket] = {}
        self._closed = False

    # lifecycle
    def start(self) -> ProgressServer:
        """Bind and start serving in background threads; returns ``self``.

        Raises:
            SetupError: the address cannot be bound, or the server was already started or closed.
        """
        if self._tcp is not None or self._closed:
            raise SetupError("ProgressServer.start() called twice or after close(); create a new server")
        try:
            self._tcp = _TCPServer((self._host, self._port), self)
        except OSError as e:
            raise SetupError(f"ProgressServer cannot bind {self._host}:{self._port}: {e}; "
                             "pass port=0 for a free port or another host") from e
        self._serve_thread = threading.Thread(target=self._tcp.serve_forever, kwargs={"poll_interval": _POLL_S},
                                              name="torchspark-progress-server", daemon=True)
        self._serve_thread.start()
        logger.debug("progress server listening on %s:%d", *self._tcp.server_address[:2])
        return self

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` workers should connect to.

        Raises:
            SetupError: the server is not started.
        """
        if self._tcp is None:
            raise SetupError("ProgressServer.address is known only after start(); call start() first")
        port = int(self._tcp.server_address[1])
        if self._advertise_host:
            return self._advertise_host, port
        if self._host in ("", "0.0.0.0", "::"):
            return _outbound_ip(), port
        return self._host, port

    def close(self, timeout_s: float = 5.0, drain_s: float = 0.0) -> None:
        """Stop accepting, disconnect every worker and join the server's threads. Idempotent.

        Args:
            timeout_s: how long to wait for each thread; a thread still alive after it is logged (all server
                threads are daemons, so one stuck thread never blocks interpreter exit).
            drain_s: first wait up to this long for the workers to disconnect on their own, so everything they
                sent before exiting is read (0 = cut them off at once). Use it once the workers have ended: it
                returns as soon as their connections close.
        """
        if drain_s > 0:
            self._drain(drain_s)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        tcp = self._tcp
        if tcp is None:
            return
        tcp.shutdown()  # serve_forever returns within one poll interval
        if self._serve_thread is not None:
            self._serve_thread.join(timeout_s)
        tcp.server_close()
        with self._lock:
            conns = dict(self._conns)
        for sock in conns.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in recv
        for t in conns:
            t.join(timeout_s)
            if t.is_alive():
                logger.warning("progress server thread %s did not stop within %.1f s", t.name, timeout_s)

    def _drain(self, drain_s: float) -> None:
        """Wait (up to ``drain_s``) until every connection thread has read its worker's stream to the end."""
        deadline = time.monotonic() + drain_s
        while True:
            with self._lock:
                live = [t for t in self._conns if t.is_alive()]
            remaining = deadline - time.monotonic()
            if not live or remaining <= 0:
                if live:
                    logger.warning("progress server: %d worker connection(s) still open after %.1f s; closing them",
                                   len(live), drain_s)
                return
            live[0].join(remaining)

    def __enter__(self) -> ProgressServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # listeners and state
    def add_listener(self, fn: ProgressListener) -> None:
        """Call ``fn(update)`` for every progress message received from now on."""
        with self._lock:
            self._listeners = [*self._listeners, fn]  # copy-on-write: readers iterate without the lock

    def add_score_listener(self, fn: ScoreListener) -> None:
        """Call ``fn(report)`` for every score report received from now on."""
        with self._lock:
            self._score_listeners = [*self._score_listeners, fn]

    def add_error_listener(self, fn: ErrorListener) -> None:
        """Call ``fn(rank, traceback_text)`` for every worker error received from now on."""
        with self._lock:
            self._error_listeners = [*self._error_listeners, fn]

    def latest(self) -> dict[int, ProgressUpdate]:
        """The latest update of each rank that reported."""
        with self._lock:
            return dict(self._latest)

    def total_examples(self) -> int:
        """Examples reported by all workers over all epochs (updates carry cumulative per-epoch counts)."""
        with self._lock:
            return self._tally.total

    def errors(self) -> list[tuple[int, str]]:
        """``(rank, traceback_text)`` of every worker error received, in arrival order."""
        with self._lock:
            return list(self._errors)

    def malformed_count(self) -> int:
        """How many received lines were malformed and ignored."""
        with self._lock:
            return self._malformed

    # connection handling (server threads)
    def _spawn_connection(self, sock: socket.socket, peer: Any) -> None:
        t = threading.Thread(target=self._serve_connection, args=(sock, peer), daemon=True,
                             name=f"torchspark-progress-conn-{peer}")
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._conns[t] = sock
        t.start()

    def _serve_connection(self, sock: socket.socket, peer: Any) -> None:
        reader = _LineReader(sock)
        try:
            while True:
                line = reader.readline()
                if line is None:
                    return
                if line.strip():
                    self._handle_line(line, sock, peer)
        except OSError as e:
            with self._lock:
                closing = self._closed
            if not closing:
                logger.debug("progress connection from %s ended: %s", peer, e)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with self._lock:
                self._conns.pop(threading.current_thread(), None)

    def _handle_line(self, line: bytes, sock: socket.socket, peer: Any) -> None:
        try:
            msg = _parse_line(line)
            kind = msg["kind"]
            if kind == "progress":
                self._on_progress(_progress_from_msg(msg))
            elif kind == "clock":
                reply: dict[str, Any] = {"t_driver": self._clock()}
                if "id" in msg:
                    reply["id"] = msg["id"]
                sock.sendall(_encode(reply))
            elif kind == "error":
                rank, tb = _int_field(msg, "rank"), msg.get("traceback")
                if not isinstance(tb, str):
                    raise _Malformed(f"field 'traceback' must be a string, got {type(tb).__name__}")
                self._on_error(rank, tb)
            elif kind == "score":
                report = _score_from_msg(msg)
                with self._lock:
                    listeners = self._score_listeners
                _call_listeners(listeners, report)
            else:
                raise _Malformed(f"unknown kind {kind!r} (expected progress, clock, error or score)")
        except _Malformed as e:
            with self._lock:
                self._malformed += 1
            logger.warning("progress server: ignoring malformed line from %s (%s): %.200r", peer, e, line)

    def _on_progress(self, update: ProgressUpdate) -> None:
        with self._lock:
            self._latest[update.rank] = update
            self._tally.add(update)
            listeners = self._listeners
        _call_listeners(listeners, update)

    def _on_error(self, rank: int, tb: str) -> None:
        logger.error("worker %d reported an error:\n%s", rank, tb)
        with self._lock:
            self._errors.append((rank, tb))
            listeners = self._error_listeners
        _call_listeners(listeners, rank, tb)


def _outbound_ip() -> str:
    """This machine's address on its default route (a UDP connect sends no packet); loopback if none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


# --- worker side ------------------------------------------------------------------------------------------------

class ProgressClient:
    """Worker-side sender; use it directly as ``WorkerHooks(progress=client)``.

    Progress goes through a bounded queue drained by one background thread, so :meth:`send` never blocks
    training; when the queue is full the oldest update is dropped (only the newest matter for a display).
    Score reports (:meth:`send_score`) go through the same thread but are never dropped.
    If the driver cannot be reached the client logs one warning and does nothing from then on.

    Args:
        host, port: the driver's :attr:`ProgressServer.address`.
        rank: this worker's rank (put on error messages).
        timeout_s: bound on every blocking step (connect, each send, each clock probe, the flush at close).
            Short keeps a dead driver from delaying a worker; 10 s is ample on a cluster network.
        queue_size: progress updates buffered while the sender is busy; 256 is plenty at one report per
            ``progress_every`` minibatches.
        clock: the worker's time function (injectable for tests).
    """

    def __init__(self, host: str, port: int, rank: int, timeout_s: float = 10.0, queue_size: int = 256,
                 clock: Callable[[], float] = time.time) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"ProgressClient timeout_s must be > 0 seconds, got {timeout_s}")
        if queue_size < 1:
            raise ConfigError(f"ProgressClient queue_size must be >= 1, got {queue_size}")
        self.host, self.port, self.rank = host, port, rank
        self.timeout_s = timeout_s
        self._clock = clock
        self._sock: socket.socket | None = None
        self._reader: _LineReader | None = None
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
            logger.warning("worker %d cannot reach the driver's progress server at %s:%s (%s); "
                           "training continues without live progress", self.rank, self.host, self.port, e)
            self._broken = True
            return self
        sock.settimeout(self.timeout_s)  # every send and recv is bounded
        self._sock, self._reader = sock, _LineReader(sock)
        self._thread = threading.Thread(target=self._sender_loop, daemon=True,
                                        name=f"torchspark-progress-sender-{self.rank}")
        self._thread.start()
        return self

    def send(self, update: ProgressUpdate) -> None:
        """Queue ``update`` for the driver; never blocks (drops the oldest queued update when full)."""
        if not self.active:
            return
        line = _encode({"kind": "progress", "rank": update.rank, "epoch": update.epoch,
                        "iteration": update.iteration, "examples": update.examples, "score": update.score})
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
        line = _encode({"kind": "score", "epoch": report.epoch, "round": report.round, "examples": report.examples,
                        "score": report.score})
        with self._cond:
            self._scores.append(line)
            self._cond.notify()

    def send_error(self, traceback_text: str) -> None:
        """Send a traceback to the driver now (best effort, bounded by ``timeout_s``; never raises)."""
        if not self.active:
            return
        if len(traceback_text) > _MAX_TRACEBACK_CHARS:
            traceback_text = "...[truncated]\n" + traceback_text[-_MAX_TRACEBACK_CHARS:]
        self._write(_encode({"kind": "error", "rank": self.rank, "traceback": traceback_text}))

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
        """Estimate ``driver_time - worker_time`` in seconds (see :func:`estimate_clock_offset`).

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
        if not self._write(_encode({"kind": "clock", "t_worker": t_send, "id": self._probe_id})):
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
        while True:
            with self._cond:
                while not self._pending and not self._scores and not self._closing:
                    self._cond.wait(_POLL_S)
                batch = [*self._scores, *self._pending]
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
                logger.warning("worker %d: progress flush took over %.1f s; dropping the rest", self.rank,
                               self.timeout_s)
        if self._sock is not None:
            stuck = self._thread is not None and self._thread.is_alive()
            with contextlib.suppress(OSError):
                # SHUT_WR: a clean end of stream after the queued bytes; SHUT_RDWR also wakes a stuck sendall
                self._sock.shutdown(socket.SHUT_RDWR if stuck else socket.SHUT_WR)
            if stuck and self._thread is not None:
                self._thread.join(self.timeout_s)
            self._sock.close()

    def __enter__(self) -> ProgressClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- driver display ---------------------------------------------------------------------------------------------

class ProgressBar:
    """A ``tqdm`` bar of examples trained, with examples/s and the mean of the workers' latest scores.

    Feed it from a server: ``ProgressServer(listeners=[bar.update])``. Thread-safe.

    Args:
        total_examples: examples expected over the whole fit (all epochs, all workers); None = no total.
        desc: label; the latest epoch number is appended.
        enabled: True/False force the display on/off; None = on only when ``file`` is a terminal. A disabled
            bar renders nothing but still counts (:attr:`examples`, :attr:`score`).
        file: where to draw; default ``sys.stderr``.
        mininterval: minimum seconds between redraws; raise it if the bar floods a slow terminal.
    """

    def __init__(self, total_examples: int | None = None, desc: str = "epoch", enabled: bool | None = None,
                 file: TextIO | None = None, mininterval: float = 0.5) -> None:
        # plain tqdm, not tqdm.auto: a notebook widget would ignore ``file`` and ``enabled``
        from tqdm import tqdm  # imported lazily: only the driver draws

        if total_examples is not None and total_examples < 0:
            raise ConfigError(f"ProgressBar total_examples must be >= 0 or None, got {total_examples}")
        out = sys.stderr if file is None else file
        if enabled is None:
            isatty = getattr(out, "isatty", None)
            enabled = bool(isatty()) if callable(isatty) else False
        self.enabled = enabled
        self._desc = desc
        self._lock = threading.Lock()
        self._tally = _ExampleTally()
        self._scores: dict[int, float] = {}
        self._epoch = -1
        self._closed = False
        self._bar = tqdm(total=total_examples, desc=desc, unit="ex", unit_scale=True, file=out,
                         disable=not enabled, mininterval=mininterval, dynamic_ncols=True)

    @property
    def examples(self) -> int:
        """Examples counted so far."""
        with self._lock:
            return self._tally.total

    @property
    def score(self) -> float:
        """Mean over workers of each worker's latest finite score (NaN before any)."""
        with self._lock:
            return self._mean_score()

    def _mean_score(self) -> float:
        finite = [s for s in self._scores.values() if math.isfinite(s)]
        return sum(finite) / len(finite) if finite else float("nan")

    def update(self, update: ProgressUpdate) -> None:
        """Count one worker update and redraw (rate-limited by ``mininterval``)."""
        with self._lock:
            if self._closed:
                return
            added = self._tally.add(update)
            self._scores[update.rank] = update.score
            if update.epoch > self._epoch:
                self._epoch = update.epoch
                self._bar.set_description_str(f"{self._desc} {update.epoch}", refresh=False)
            score = self._mean_score()
            if math.isfinite(score):
                self._bar.set_postfix_str(f"score={score:.4g}", refresh=False)
            self._bar.update(added)

    __call__ = update

    def close(self) -> None:
        """Draw the final state and release the terminal line. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
