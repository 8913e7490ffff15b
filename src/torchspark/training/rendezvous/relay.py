"""The driver's rendezvous relay: a small key-value store that only the fit's workers can use.

Task 0 of a barrier stage publishes where its own store listens, and its peers read it here
(`torchspark.spark.barrier`). It replaces torch's ``TCPStore`` on the driver, which authenticates nobody:
any local process could store hundreds of megabytes in it, and one byte held open on it stalled its serving
thread, and with it the driver's shutdown of the relay, with no time limit. Here:

1. **who may talk**: every connection gets a fresh nonce and must answer with the fit's hello for it
   (`torchspark.training.rendezvous.auth.hello`, the progress channel's HMAC challenge-response) within
   ``hello_timeout_s``, else it is dropped; exactly that many bytes are read before, so a stranger's bytes never
   reach the store;
2. **never stuck**: one selector thread serves every connection without blocking on any of them, connections
   owing their hello are capped and expire, and `RelayServer.close` returns within its timeout whatever
   clients do;
3. **strangers cost the workers nothing**: over ``max_pending`` connections owing their hello, the relay first
   reads every one that sent something (a worker's whole hello arrives in one segment, so it authenticates then
   and is no longer pending), then evicts a connection that sent part of a hello (only a stranger does that)
   before one that sent nothing yet, the oldest first. A worker's connection is evicted only when
   ``max_pending`` silent connections arrived within its round trip; it then retries once
   (`relay_client`), and a second eviction fails with a message naming the
   flood. A hello that does not prove the fit's token is answered with an error line saying so;
4. **bounded**: a request line, a key, a value and the store's total size are capped (`RelayLimits`); a
   request over a cap gets an error reply naming it.

One request per connection, one JSON line each way (`torchspark.training.rendezvous.relay_client` is the
client): ``{"op": "set", "key": k, "value": v}`` -> ``{"ok": true}``; ``{"op": "get", "key": k}`` ->
``{"value": v}`` once ``k`` is set (the client's deadline bounds the wait); ``{"error": why}`` otherwise.

Example::

    with RelayServer("127.0.0.1", token=token).start() as relay:
        relay_set(relay.address, token, "k", "v", timeout_s=10)
        relay_get(relay.address, token, "k", timeout_s=10)  # "v"
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from torchspark.errors import SetupError
from torchspark.training.rendezvous import auth
from torchspark.validation import check_float, check_int

__all__ = ["RelayLimits", "RelayServer"]

log = logging.getLogger(__name__)

_POLL_S = 0.1  # how often the selector thread expires hellos and checks for shutdown
_REPLY_TIMEOUT_S = 1.0  # a reply is one short line; a client that does not take it within this is cut off
_DRAIN_READS = 4  # reads of 64 KiB at most of what a client sent past its request, before its connection closes
#: the relay's answer to a hello that does not prove the fit's token (the client names it)
BAD_HELLO = "the hello does not prove this fit's token"


@dataclass(frozen=True)
class RelayLimits:
    """Bounds on what the relay holds and whom it waits for, whoever connects.

    The relay holds a few dozen bytes per recovery attempt (worker 0's ``host:port``), so the defaults are far
    above need and far below harm; raise them only for a store you use for more than a rendezvous.

    Args:
        max_key_bytes: a longer key is refused.
        max_value_bytes: a longer value is refused (bounds one request line too).
        max_total_bytes: keys and values held at most, over the fit; a ``set`` past it is refused.
        max_pending: connections owing their hello at most; over it one is evicted (a connection that sent part
            of a hello first, then the oldest silent one; see the module docstring, step 3), so a flood of
            strangers cannot lock a worker out for longer than its hello takes.
        max_connections: open connections at most (a worker holds one while it waits for worker 0's address).
        hello_timeout_s: a connection without a valid hello and request line within this is dropped.
    """

    max_key_bytes: int = 256
    max_value_bytes: int = 4096
    max_total_bytes: int = 1 << 20
    max_pending: int = 128
    max_connections: int = 8192
    hello_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_key_bytes", "max_value_bytes", "max_total_bytes", "max_pending", "max_connections"):
            check_int(name, getattr(self, name), 1, owner="RelayLimits")
        check_float("hello_timeout_s", self.hello_timeout_s, above=0, finite=True, owner="RelayLimits", unit="seconds")

    @property
    def max_request_bytes(self) -> int:
        """The longest request line accepted (a JSON-escaped key and value plus the envelope)."""
        return 6 * (self.max_key_bytes + self.max_value_bytes) + 64


class _Conn:
    """One accepted connection: owing its hello, owing its request, or waiting for a key."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.nonce = auth.new_nonce()
        self.hello = bytearray()
        self.authed = False
        self.request = bytearray()
        self.waiting_for: str | None = None  # the key of a ``get`` not set yet


class RelayServer:
    """The relay store (see the module docstring). Use as a context manager, or `start` then `close`.

    Args:
        host: the address to listen on (the one executors reach the driver at, ``spark.driver.host``).
        port: TCP port; 0 picks a free one.
        token: the fit's secret (`new_token`); clients must hold it.
        limits: the caps (`RelayLimits`).
    """

    def __init__(self, host: str, port: int = 0, *, token: bytes, limits: RelayLimits = RelayLimits()) -> None:
        check_int("port", port, 0, 65535, owner="RelayServer", meaning="(0 = any free port)")
        auth.hello(token)  # validates it
        self._host, self._port, self._token, self._limits = host, port, token, limits
        self._values: dict[str, str] = {}
        self._held = 0  # bytes of keys and values in _values
        self._conns: dict[socket.socket, _Conn] = {}
        self._rejected = 0
        self._evicted = 0
        self._lock = threading.Lock()  # guards the counters read from other threads
        self._listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> RelayServer:
        """Bind and serve on a background thread; returns ``self``.

        Raises:
            OSError: the address cannot be bound (``listen_in_range`` then tries the next port).
        """
        if self._listener is not None:
            raise SetupError("this RelayServer was started already; build a new one")
        listener = socket.create_server((self._host, self._port), backlog=512)
        listener.setblocking(False)
        self._listener, self._selector = listener, selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="torchspark-relay", daemon=True)
        self._thread.start()
        return self

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` it listens on."""
        assert self._listener is not None, "start() the relay first"
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self.address[1]

    def held_bytes(self) -> int:
        """Bytes of keys and values it holds now (never above ``limits.max_total_bytes``)."""
        with self._lock:
            return self._held

    def rejected_count(self) -> int:
        """Connections dropped without a valid hello (wrong token, too slow, or over ``max_pending``)."""
        with self._lock:
            return self._rejected

    def evicted_count(self) -> int:
        """Connections owing their hello that were evicted to make room (over ``max_pending``; also counted in
        `rejected_count`)."""
        with self._lock:
            return self._evicted

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close every connection; returns within about ``timeout_s`` whatever clients do."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("the rendezvous relay thread did not stop within %.0f s; left as a daemon", timeout_s)

    def __enter__(self) -> RelayServer:
        return self if self._listener is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                self._expire()
        except Exception:  # noqa: BLE001 - logged; the workers' deadlines then name the relay
            log.exception("the rendezvous relay stopped on an unexpected error")
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            with contextlib.suppress(OSError):
                assert self._listener is not None
                self._listener.close()
            self._selector.close()

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of descriptors: leave the rest in the backlog for now
                log.warning("rendezvous relay: accept failed (%s)", e)
                return
            self._make_room()
            if len(self._conns) >= self._limits.max_connections:
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self._limits.hello_timeout_s)
            try:
                sock.send(conn.nonce)  # 16 bytes into an empty socket buffer: never blocks
            except OSError:
                sock.close()
                continue
            self._conns[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self) -> None:
        """Step 3 of the module docstring: under ``max_pending`` connections owing their hello, evicting if need be
        (`auth.eviction_victim`: strangers go first)."""
        assert self._selector is not None
        victim = auth.eviction_victim(self._conns.values(), self._selector, self._limits.max_pending, self._read)
        if victim is not None:
            log.debug(
                "rendezvous relay: at max_pending=%d; evicted a connection owing its hello", self._limits.max_pending
            )
            with self._lock:
                self._evicted += 1
            self._drop(victim, rejected=True)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.waiting_for is None and c.deadline <= now]:
            if conn.authed:  # it proved the token: tell it why (a request line not sent whole in time)
                with self._lock:
                    self._rejected += 1
                self._reply(
                    conn,
                    {
                        "error": f"the request line did not arrive within hello_timeout_s="
                        f"{self._limits.hello_timeout_s:g} s of connecting; raise RelayLimits.hello_timeout_s"
                    },
                )
            else:
                self._drop(conn, rejected=True)

    def _drop(self, conn: _Conn, rejected: bool = False) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            assert self._selector is not None
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        if rejected:
            with self._lock:
                self._rejected += 1

    def _read(self, conn: _Conn) -> None:
        # owing the hello: read up to its size only; authed: up to the request cap (one line, one request)
        if conn.authed:
            want = max(1, self._limits.max_request_bytes + 1 - len(conn.request))
        else:
            want = auth.HELLO_BYTES - len(conn.hello)
        try:
            chunk = conn.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not chunk or conn.waiting_for is not None:  # gone, or talking while it should wait: either way, done
            self._drop(conn, rejected=not conn.authed)
            return
        if not conn.authed:
            conn.hello += chunk
            if len(conn.hello) == auth.HELLO_BYTES:
                conn.authed = auth.check_hello(self._token, bytes(conn.hello), conn.nonce)
                if not conn.authed:
                    log.debug("rendezvous relay: dropped a connection without the fit's token")
                    with self._lock:
                        self._rejected += 1
                    self._reply(conn, {"error": BAD_HELLO})
            return
        conn.request += chunk
        line, newline, _ = bytes(conn.request).partition(b"\n")
        if newline:
            self._handle(conn, line)
        elif len(conn.request) > self._limits.max_request_bytes:
            self._reply(conn, {"error": self._too_long()})

    def _too_long(self) -> str:
        limits = self._limits
        return (
            f"the request is longer than {limits.max_request_bytes} bytes: the value must be a string of at most "
            f"max_value_bytes={limits.max_value_bytes} bytes (and the key at most max_key_bytes="
            f"{limits.max_key_bytes}); store a reference (a path, a host:port) instead, or raise "
            "RelayLimits.max_value_bytes"
        )

    def _handle(self, conn: _Conn, line: bytes) -> None:
        try:
            msg = json.loads(line)
            op, key = msg["op"], msg["key"]
            if not isinstance(key, str) or op not in ("set", "get"):
                raise ValueError(f"op must be 'set' or 'get' with a string key, got {op!r}")
        except (ValueError, KeyError, TypeError) as e:
            self._reply(conn, {"error": f"malformed request ({e})"})
            return
        if len(key.encode()) > self._limits.max_key_bytes:
            self._reply(conn, {"error": f"key longer than max_key_bytes={self._limits.max_key_bytes}"})
        elif op == "set":
            self._reply(conn, self._set(key, msg.get("value")))
        elif key in self._values:
            self._reply(conn, {"value": self._values[key]})
        else:
            conn.waiting_for = key  # answered by the set of ``key``; the client's deadline bounds the wait

    def _set(self, key: str, value: Any) -> dict[str, Any]:
        limits = self._limits
        if not isinstance(value, str) or len(value.encode()) > limits.max_value_bytes:
            return {
                "error": f"the value must be a string of at most max_value_bytes={limits.max_value_bytes} bytes; "
                "store a reference (a path, a host:port) instead, or raise RelayLimits.max_value_bytes"
            }
        old = len(key.encode()) + len(self._values[key].encode()) if key in self._values else 0
        size = len(key.encode()) + len(value.encode())
        if self._held - old + size > limits.max_total_bytes:
            return {"error": f"the relay holds max_total_bytes={limits.max_total_bytes} already"}
        self._values[key] = value
        with self._lock:
            self._held += size - old
        for waiter in [c for c in self._conns.values() if c.waiting_for == key]:
            self._reply(waiter, {"value": value})
        return {"ok": True}

    def _reply(self, conn: _Conn, reply: dict[str, Any]) -> None:
        try:
            conn.sock.settimeout(_REPLY_TIMEOUT_S)
            conn.sock.sendall(json.dumps(reply).encode() + b"\n")
            # read what the client sent past its request (bounded, without waiting), so the close is a FIN that
            # lets it read the reply, not a reset (a client still sending a refused value reads it after its send
            # fails)
            conn.sock.setblocking(False)
            with contextlib.suppress(OSError):
                for _ in range(_DRAIN_READS):
                    if not conn.sock.recv(1 << 16):
                        break
        except OSError as e:
            log.debug("rendezvous relay: cannot answer a client (%s)", e)
        self._drop(conn)
