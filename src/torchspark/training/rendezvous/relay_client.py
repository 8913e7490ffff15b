"""A worker's side of the driver's rendezvous relay (`torchspark.training.rendezvous.relay`).

Every call has one deadline for all of it (connecting, the challenge, the request, the reply), so a relay that
does not answer, or answers slowly byte by byte, ends in [`WaitTimeout`][torchspark.errors.WaitTimeout] naming the relay
and the knob, never in a hang. A connection the relay cuts off before answering (evicted by a flood of
connections on its port) is retried once; a refusal (a value over ``max_value_bytes``, another fit's token) is a
[`SetupError`][torchspark.cli.SetupError] naming it, also when it arrives while the request is still being sent.

Example::

    relay_set(("10.0.0.1", 40001), token, "worker-0-store/attempt-0/stage-3", "10.0.0.7:40017", timeout_s=600)
    relay_get(("10.0.0.1", 40001), token, "worker-0-store/attempt-0/stage-3", timeout_s=600)  # "10.0.0.7:40017"
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from torchspark.errors import SetupError, WaitTimeout
from torchspark.training.rendezvous import auth
from torchspark.training.rendezvous.relay import BAD_HELLO

__all__ = ["relay_get", "relay_set"]

_MAX_REPLY_BYTES = 1 << 16  # a reply carries one value (the server caps values far below this)
_RETRY_S = 0.2  # pause between connection attempts while the relay refuses


def relay_set(address: tuple[str, int], token: bytes, key: str, value: str, timeout_s: float) -> None:
    """Store ``value`` under ``key`` on the relay at ``address``, within ``timeout_s`` seconds.

    Raises:
        WaitTimeout: the relay was not reachable, or did not answer, within ``timeout_s``.
        SetupError: the relay refused the request (a cap of `RelayLimits`,
            ``max_value_bytes`` for a value too long), or this worker's hello (another fit's token).
    """
    _request(address, token, {"op": "set", "key": key, "value": value}, timeout_s)


def relay_get(address: tuple[str, int], token: bytes, key: str, timeout_s: float) -> str:
    """The value of ``key`` on the relay at ``address``, waiting up to ``timeout_s`` seconds for it to be set.

    Raises:
        WaitTimeout: nobody set ``key`` within ``timeout_s``, or the relay was not reachable or did not answer.
        SetupError: the relay refused the request, or this worker's hello (another fit's token).
    """
    reply = _request(address, token, {"op": "get", "key": key}, timeout_s)
    value = reply.get("value")
    if not isinstance(value, str):
        raise SetupError(f"the rendezvous relay at {_where(address)} answered {reply!r:.200} to a get of {key!r}")
    return value


def _where(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def _request(address: tuple[str, int], token: bytes, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One request, retried once when the relay cuts the connection off before answering (step 3 of
    `relay`: a flood of connections on its port evicted this one)."""
    deadline = time.monotonic() + timeout_s
    request = json.dumps(msg).encode() + b"\n"  # before connecting: the relay times a request from its connection
    for attempt in range(2):
        try:
            line = _exchange(address, token, request, deadline, timeout_s)
            break
        except _CutOff as e:
            if attempt == 0 and time.monotonic() < deadline:
                continue
            why = (
                "it closes a new connection at once while RelayLimits.max_connections are open"
                if e.before_nonce
                else "it evicts connections still owing their hello when more than RelayLimits.max_pending of "
                "them arrive at once"
            )
            raise WaitTimeout(
                f"the driver's rendezvous relay at {_where(address)} cut off a {msg['op']} of {msg['key']!r} "
                f"twice before answering ({e.cause!r}): {why}, so another process is flooding that port (a port "
                "scanner, a misconfigured client). Find what connects to it, or keep the relay's port out of its "
                "reach (port_range sets it)"
            ) from e.cause
        except (TimeoutError, OSError) as e:
            what = "no value was set for it" if msg["op"] == "get" else "it did not answer"
            raise WaitTimeout(
                f"the driver's rendezvous relay at {_where(address)} gave no answer to a {msg['op']} of "
                f"{msg['key']!r} within {timeout_s:.0f} s ({what}: {e!r}). With a get, worker 0 failed or was slow "
                "to start: see its error; raise rendezvous_timeout_s if executors start slowly"
            ) from e
    try:
        reply = json.loads(line)
    except ValueError as e:
        raise SetupError(f"the rendezvous relay at {_where(address)} sent a malformed reply {line!r:.200}") from e
    if isinstance(reply, dict) and reply.get("error") == BAD_HELLO:
        raise SetupError(
            f"the rendezvous relay at {_where(address)} refused this worker's hello: {BAD_HELLO}. The worker holds "
            "another fit's token (a task of an earlier fit or attempt still running), or another fit's relay listens "
            "on this address: let that fit end, or give the fits different port_range values"
        )
    if not isinstance(reply, dict) or "error" in reply:
        raise SetupError(f"the rendezvous relay at {_where(address)} refused a {msg['op']}: {reply!r:.400}")
    return reply


class _CutOff(Exception):
    """The relay closed the connection before its answer (``cause``: what the socket said)."""

    def __init__(self, cause: BaseException, before_nonce: bool = False) -> None:
        super().__init__(repr(cause))
        self.cause, self.before_nonce = cause, before_nonce


def _exchange(address: tuple[str, int], token: bytes, request: bytes, deadline: float, timeout_s: float) -> bytes:
    """The relay's reply line to ``request`` (one JSON line). Raises `_CutOff` when the relay closed the connection without
    one, ``TimeoutError`` when ``deadline`` passed first."""
    with _connect(address, deadline, timeout_s) as sock:
        try:
            nonce = _read_exactly(sock, auth.NONCE_BYTES, deadline)
        except (EOFError, ConnectionError) as e:
            raise _CutOff(e, before_nonce=True) from e
        sent: OSError | None = None
        try:
            sock.sendall(auth.hello(token, nonce) + request)
        except (ConnectionError, BrokenPipeError) as e:  # the relay answered (a refusal) or cut us off: read on
            sent = e
        try:
            return _read_line(sock, deadline)
        except (EOFError, ConnectionError) as e:
            raise _CutOff(sent or e) from e


def _connect(address: tuple[str, int], deadline: float, timeout_s: float) -> socket.socket:
    """A connection to the relay, retried while it is refused, until ``deadline``."""
    while True:
        try:
            return socket.create_connection(address, timeout=max(0.01, deadline - time.monotonic()))
        except OSError as e:
            if time.monotonic() + _RETRY_S >= deadline:
                raise WaitTimeout(
                    f"could not reach the driver's rendezvous relay at {_where(address)} within {timeout_s:.0f} s "
                    f"({e}). Open that port from the executors to the driver (spark.driver.host; port_range sets "
                    "it), or set rendezvous_via='barrier' on the training master to rendezvous through Spark instead"
                ) from e
            time.sleep(_RETRY_S)


def _recv(sock: socket.socket, size: int, deadline: float) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    sock.settimeout(left)
    chunk = sock.recv(size)
    if not chunk:
        raise EOFError("the relay closed the connection")
    return chunk


def _read_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    data = b""
    while len(data) < size:
        data += _recv(sock, size - len(data), deadline)
    return data


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    data = b""
    while b"\n" not in data:
        if len(data) > _MAX_REPLY_BYTES:
            raise EOFError(f"a reply longer than {_MAX_REPLY_BYTES} bytes")
        data += _recv(sock, 4096, deadline)
    return data.split(b"\n", 1)[0]
