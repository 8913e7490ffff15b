"""The driver's side of the progress channel: one thread serving every worker connection through a selector.

Who may talk: the server sends every connection a fresh nonce, and the connection must answer with the fit's hello
for that nonce (`torchspark.training.rendezvous.auth.hello`); the server
reads exactly that many bytes, with a deadline, and drops the connection unless it proves the token, so a
stranger's bytes never reach a listener and never take more memory than one hello. How much: no thread per
connection (one selector thread serves them all), at most ``max_pending`` connections owing their hello (over it,
one that sent part of a hello is dropped before a silent one, the oldest first) and ``max_connections``
authenticated ones, lines and kept tracebacks bounded by `ChannelLimits`. A stranger costs the end of a
fit nothing either: a draining `ProgressServer.close` waits for authenticated connections only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from torchspark.errors import ConfigError, SetupError
from torchspark.training.progress.client import ProgressEndpoint
from torchspark.training.progress.dispatch import CallQueue
from torchspark.training.progress.inbox import MessageHandler, ProgressInbox
from torchspark.training.progress.listeners import ErrorListener, ProgressListener, ScoreListener, call_listeners
from torchspark.training.progress.wire import ChannelLimits, LineSplitter, encode
from torchspark.training.rendezvous import auth

__all__ = ["ProgressServer"]

logger = logging.getLogger(__name__)

# How often the selector wakes up to expire hellos and re-check for shutdown.
_POLL_S = 0.1
# A clock reply is one short line; a peer that does not read it within this is cut off.
_REPLY_TIMEOUT_S = 1.0


class _Conn:
    """One accepted connection: authenticated or still owing its hello."""

    def __init__(self, sock: socket.socket, peer: Any, deadline: float, max_line_bytes: int) -> None:
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.hello = bytearray()
        self.nonce = auth.new_nonce()  # this connection's challenge: a hello seen elsewhere does not replay here
        self.authed = False
        self.lines = LineSplitter(max_line_bytes)
        self.rank: int | None = None  # from its first ``alive`` or progress message
        self.handlers: dict[str, MessageHandler] = {}  # the server's own kinds (``clock``), bound to this connection


class ProgressServer(ProgressInbox):
    """Driver-side receiver of worker progress, clock probes, scores and tracebacks.

    What it keeps and offers (`latest`, `errors`, `liveness`, the listeners) is the
    `ProgressInbox` both channels share. Listeners run on a thread of
    their own (`CallQueue`), never on the thread that reads the
    workers, so a slow listener cannot hold up heartbeats; a listener that raises is logged and skipped. Updates of
    one rank arrive in the order the worker sent them.

    Args:
        host: the address to listen on: the one workers use to reach the driver (``spark.driver.host``), and
            ``"127.0.0.1"`` (the default) when the workers run on this machine. Avoid ``"0.0.0.0"``: it also
            listens where no worker is.
        port: TCP port; 0 picks a free ephemeral port (recommended: no clashes between concurrent jobs).
        listeners: progress listeners, called with each [`ProgressUpdate`][torchspark.training.ProgressUpdate].
        error_listeners: called with ``(rank, traceback_text)`` for each worker error kept.
        clock: the driver's time function used to answer clock probes (injectable for tests).
        advertise_host: the host name workers should dial; default ``host``.
        score_listeners: called with each [`ScoreReport`][torchspark.training.ScoreReport].
        token: the fit's secret (`torchspark.training.rendezvous.auth.new_token`); default: a fresh one. Workers need
            it: ship `endpoint` to them inside the task.
        limits: bounds on connections, lines and kept error text (`ChannelLimits`).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        listeners: Iterable[ProgressListener] = (),
        error_listeners: Iterable[ErrorListener] = (),
        clock: Callable[[], float] = time.time,
        advertise_host: str | None = None,
        score_listeners: Iterable[ScoreListener] = (),
        token: bytes | None = None,
        limits: ChannelLimits = ChannelLimits(),
    ) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"ProgressServer port must be in 0..65535 (0 = any free port), got {port}")
        super().__init__(listeners, score_listeners, error_listeners, limits)
        self._token = auth.new_token() if token is None else token
        auth.hello(self._token)  # validates it
        self._host, self._port, self._advertise_host = host, port, advertise_host
        self._clock = clock
        self._idle = threading.Condition(self._lock)  # notified whenever a connection closes
        self._rejected = 0
        self._conns: dict[socket.socket, _Conn] = {}  # touched only by the serving thread (count read under lock)
        self._open = 0
        self._authed = 0  # of them authenticated: the connections a draining close waits for
        self._listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._calls: CallQueue | None = None  # the listeners' thread, from start() to close()

    # lifecycle
    def start(self) -> ProgressServer:
        """Bind and start serving on a background thread; returns ``self``.

        Raises:
            SetupError: the address cannot be bound, or the server was already started or closed.
        """
        if self._listener is not None or self._closed:
            raise SetupError("ProgressServer.start() called twice or after close(); create a new server")
        try:
            infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
            family, _, _, _, addr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(addr)
                sock.listen(128)
            except OSError:
                sock.close()
                raise
        except OSError as e:
            raise SetupError(
                f"ProgressServer cannot bind {self._host}:{self._port}: {e}; "
                "pass port=0 for a free port or the address workers reach this machine on"
            ) from e
        sock.setblocking(False)
        self._listener = sock
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ, None)
        self._calls = CallQueue("torchspark-progress-listeners")
        self._thread = threading.Thread(target=self._serve, name="torchspark-progress-server", daemon=True)
        self._thread.start()
        logger.debug("progress server listening on %s:%d", *sock.getsockname()[:2])
        return self

    @property
    def token(self) -> bytes:
        """The fit's secret; a connection that does not prove it is dropped unread."""
        return self._token

    @property
    def bound_address(self) -> tuple[str, int]:
        """``(address, port)`` the listening socket is bound to."""
        if self._listener is None:
            raise SetupError("ProgressServer.bound_address is known only after start(); call start() first")
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` workers should connect to.

        Raises:
            SetupError: the server is not started.
        """
        if self._listener is None:
            raise SetupError("ProgressServer.address is known only after start(); call start() first")
        return self._advertise_host or self._host, self.bound_address[1]

    @property
    def endpoint(self) -> ProgressEndpoint:
        """What a worker needs to connect: `address` and `token` (ship it inside the task)."""
        host, port = self.address
        return ProgressEndpoint(host, port, self._token)

    def close(self, timeout_s: float = 5.0, drain_s: float = 0.0) -> None:
        """Stop accepting, disconnect every worker and join the server's thread. Idempotent.

        Args:
            timeout_s: how long to wait for the thread, and then for the listeners to finish the calls queued;
                still busy after it is logged (both are daemons).
            drain_s: first wait up to this long for the workers to disconnect on their own, so everything they
                sent before exiting is read (0 = cut them off at once). Use it once the workers have ended: it
                returns as soon as their connections close. It waits for authenticated connections only: a
                stranger's connection (still owing its hello) has nothing of the workers' to read, so one held
                open on the port costs the end of a fit nothing.
        """
        if drain_s > 0 and self._thread is not None:
            with self._idle:
                if not self._idle.wait_for(lambda: self._authed == 0 or self._closed, timeout=drain_s):
                    logger.warning(
                        "progress server: %d worker connection(s) still open after %.1f s; closing them",
                        self._authed,
                        drain_s,
                    )
                elif self._open > self._authed:
                    logger.debug(
                        "progress server: drained; %d connection(s) owing their hello closed without waiting",
                        self._open - self._authed,
                    )
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        try:
            if self._thread is not None:
                self._thread.join(timeout_s)
                if self._thread.is_alive():
                    logger.warning("progress server thread did not stop within %.1f s", timeout_s)
                    return  # it closes its sockets itself when it stops
            self._close_all()
        finally:
            if self._calls is not None:
                self._calls.close(timeout_s)

    def __enter__(self) -> ProgressServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # state only the server has
    def rejected_count(self) -> int:
        """Connections dropped without a valid hello (wrong token, too slow, or over ``max_pending``)."""
        with self._lock:
            return self._rejected

    def open_connections(self) -> int:
        """Connections currently open (authenticated or owing their hello)."""
        with self._lock:
            return self._open

    def authenticated_connections(self) -> int:
        """Connections currently open that proved the fit's token (the ones a draining `close` waits for)."""
        with self._lock:
            return self._authed

    # the serving thread
    def _serve(self) -> None:
        assert self._selector is not None
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=_POLL_S):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                self._expire_hellos()
        except Exception:  # noqa: BLE001 - progress is best effort; never take the driver down
            logger.exception("progress server stopped on an unexpected error; live progress is off")
        finally:
            if self._stop.is_set():
                self._close_all()

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        limits = self._limits
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: leave the rest in the backlog for now
                logger.warning("progress server: accept failed (%s)", e)
                return
            self._make_room()
            sock.setblocking(False)
            conn = _Conn(sock, peer, time.monotonic() + limits.hello_timeout_s, limits.max_line_bytes)
            try:
                sock.send(conn.nonce)  # 16 bytes into an empty socket buffer: never blocks
            except OSError:
                sock.close()
                continue
            conn.handlers["clock"] = functools.partial(self._answer_clock, conn)
            self._conns[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            with self._lock:
                self._open = len(self._conns)

    def _make_room(self) -> None:
        """At most ``max_pending`` connections owing their hello (`auth.eviction_victim`: strangers go first)."""
        assert self._selector is not None
        victim = auth.eviction_victim(self._conns.values(), self._selector, self._limits.max_pending, self._read)
        if victim is not None:
            self._drop(victim, rejected=True)

    def _expire_hellos(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if not c.authed and c.deadline <= now]:
            self._drop(conn, rejected=True)

    def _drop(self, conn: _Conn, rejected: bool = False) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        if conn.rank is not None:
            self.liveness.ended(conn.rank)
        with contextlib.suppress(KeyError, ValueError, OSError):
            assert self._selector is not None
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        with self._idle:
            self._rejected += rejected
            self._open = len(self._conns)
            self._authed -= conn.authed
            self._idle.notify_all()

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        if self._selector is not None:
            with contextlib.suppress(OSError):
                self._selector.close()

    def _read(self, conn: _Conn) -> None:
        # a connection owing its hello is read only up to the hello's size: nothing more reaches memory
        want = auth.HELLO_BYTES - len(conn.hello) if not conn.authed else 65536
        try:
            chunk = conn.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            logger.debug("progress connection from %s ended: %s", conn.peer, e)
            self._drop(conn)
            return
        if not chunk:
            self._drop(conn, rejected=not conn.authed)
            return
        if not conn.authed:
            conn.hello += chunk
            if len(conn.hello) < auth.HELLO_BYTES:
                return
            if not auth.check_hello(self._token, bytes(conn.hello), conn.nonce):
                logger.debug("progress server: dropped a connection from %s without the fit's token", conn.peer)
                self._drop(conn, rejected=True)
                return
            if sum(c.authed for c in self._conns.values()) >= self._limits.max_connections:
                logger.warning(
                    "progress server: over max_connections=%d; dropped %s", self._limits.max_connections, conn.peer
                )
                self._drop(conn, rejected=True)
                return
            conn.authed = True
            with self._lock:
                self._authed += 1
            return
        for line in conn.lines.feed(chunk):
            if line.strip():
                self._handle_line(line, conn)

    def _handle_line(self, line: bytes, conn: _Conn) -> None:
        rank = self.receive(line, f"progress connection {conn.peer}", conn.handlers)
        if rank is not None:
            conn.rank = rank

    def _answer_clock(self, conn: _Conn, msg: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"t_driver": self._clock()}
        if "id" in msg:
            reply["id"] = msg["id"]
        self._reply(conn, encode(reply))

    def _reply(self, conn: _Conn, data: bytes) -> None:
        try:
            conn.sock.settimeout(_REPLY_TIMEOUT_S)
            conn.sock.sendall(data)
            conn.sock.setblocking(False)
        except OSError as e:
            logger.debug("progress server: cannot answer %s (%s); dropped", conn.peer, e)
            self._drop(conn)

    def notify(self, listeners: list[Any], *args: Any) -> None:
        """Queue the listeners' call on their own thread: the serving thread never waits for a listener."""
        if listeners and self._calls is not None:
            self._calls.submit(call_listeners, listeners, *args)
