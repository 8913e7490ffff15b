"""The driver's rendezvous relay: only the fit's workers may use it, what it holds is capped, and no client can
stall it or the workers. Real sockets; the stranger speaks torch TCPStore's own wire format (the store the relay
replaced, whose serving thread blocked for good on a half-sent command)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from torchspark.errors import ConfigError, SetupError, WaitTimeout
from torchspark.spark.barrier import open_relay, relay_key
from torchspark.training.rendezvous import auth
from torchspark.training.rendezvous.relay import RelayLimits, RelayServer
from torchspark.training.rendezvous.relay_client import relay_get, relay_set

WAIT_S = 10.0
# torch TCPStore's client hello (query VALIDATE, then its magic number), then the first byte of a SET: the classic
# TCPStore server then waited for the rest of that command on its only thread, with no time limit
HALF_A_COMMAND = b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x01"


def _eventually(what: str, pred: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _in_thread(fn: Callable[[], object]) -> object:
    """``fn()`` on a thread that must finish within WAIT_S (a hang fails the test instead of the suite)."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(_catch(fn)), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "blocked past its deadline"
    return out[0]


def _catch(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - returned for the test to check
        return e


@pytest.fixture
def token() -> bytes:
    return auth.new_token()


@pytest.fixture
def relay(token: bytes) -> Iterator[RelayServer]:
    with RelayServer("127.0.0.1", token=token, limits=RelayLimits(hello_timeout_s=0.5)) as server:
        yield server


def test_one_byte_held_open_on_the_relay_stalls_neither_the_workers_nor_its_close(token: bytes) -> None:
    server, address = open_relay("127.0.0.1", 30.0, token=token)
    key = relay_key(1, 7)  # the relay of a recovery attempt
    with socket.create_connection(address) as stranger:
        stranger.sendall(HALF_A_COMMAND)  # and holds the connection open
        got: list[str] = []
        peer = threading.Thread(target=lambda: got.append(relay_get(address, token, key, WAIT_S)), daemon=True)
        peer.start()
        assert _in_thread(lambda: relay_set(address, token, key, "10.0.0.7:40017", WAIT_S)) is None
        peer.join(WAIT_S)
        assert got == ["10.0.0.7:40017"]
        assert _in_thread(lambda: server.close(timeout_s=WAIT_S)) is None
        assert not any(t.name == "torchspark-relay" for t in threading.enumerate())


def test_a_get_nobody_answers_ends_at_its_deadline_naming_the_relay(relay: RelayServer, token: bytes) -> None:
    error = _in_thread(lambda: relay_get(relay.address, token, "never-set", 0.3))
    assert isinstance(error, WaitTimeout) and "rendezvous relay" in str(error)
    assert "rendezvous_timeout_s" in str(error)


def test_a_stranger_cannot_store_anything(relay: RelayServer, token: bytes) -> None:
    big = "x" * (100 << 20)
    for hello in (b"", auth.hello(auth.new_token()), HALF_A_COMMAND):  # nothing, another fit's token, TCPStore's
        with socket.create_connection(relay.address, timeout=WAIT_S) as sock:
            sock.settimeout(WAIT_S)
            nonce = sock.recv(auth.NONCE_BYTES)
            assert len(nonce) == auth.NONCE_BYTES
            try:
                sock.sendall(hello + b'{"op": "set", "key": "k", "value": "' + big.encode() + b'"}\n')
            except OSError:  # dropped while we were still sending: as intended
                pass
    _eventually("the three strangers are dropped", lambda: relay.rejected_count() == 3)
    assert relay.held_bytes() == 0
    # a client that proves another fit's token is told so, at once (not a hang, not a timeout)
    refused = _in_thread(lambda: relay_get(relay.address, auth.new_token(), "k", WAIT_S))
    assert isinstance(refused, SetupError) and "does not prove this fit's token" in str(refused)
    relay_set(relay.address, token, "k", "v", WAIT_S)
    assert relay_get(relay.address, token, "k", WAIT_S) == "v"


def test_values_and_the_total_are_capped(token: bytes) -> None:
    limits = RelayLimits(max_value_bytes=64, max_total_bytes=200, max_key_bytes=16)
    with RelayServer("127.0.0.1", token=token, limits=limits) as relay:
        with pytest.raises(SetupError, match="max_value_bytes=64"):
            relay_set(relay.address, token, "k", "v" * 65, WAIT_S)
        with pytest.raises(SetupError, match="max_key_bytes=16"):
            relay_set(relay.address, token, "k" * 17, "v", WAIT_S)
        stored = 0
        with pytest.raises(SetupError, match="max_total_bytes=200"):
            for i in range(100):
                relay_set(relay.address, token, f"key-{i:03d}", "v" * 60, WAIT_S)
                stored += 1
        assert stored == 2 and relay.held_bytes() == 2 * 67  # a third key and value (67 bytes) would pass 200
        relay_set(relay.address, token, "key-000", "w", WAIT_S)  # replacing a value frees its bytes
        assert relay_get(relay.address, token, "key-000", WAIT_S) == "w"


def test_a_silent_connection_is_dropped_after_the_hello_timeout(relay: RelayServer) -> None:
    with socket.create_connection(relay.address, timeout=WAIT_S):
        _eventually("the silent stranger is dropped", lambda: relay.rejected_count() == 1)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("max_value_bytes", 0, "max_value_bytes must be an integer >= 1"), ("hello_timeout_s", 0, "hello_timeout_s")],
)
def test_relay_limits_are_validated(field: str, value: float, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RelayLimits(**{field: value})


def test_a_token_holders_100_mb_set_is_refused_naming_max_value_bytes(token: bytes) -> None:
    """The relay stops reading past its request cap and answers; the client, still sending, reads that answer (its
    send fails on the closed connection) instead of reporting a relay that gave no answer."""
    with RelayServer("127.0.0.1", token=token) as relay:
        _refuses_100_mb(relay, token)


def _refuses_100_mb(relay: RelayServer, token: bytes) -> None:
    for _ in range(3):
        error = _in_thread(lambda: relay_set(relay.address, token, "k", "x" * (100 << 20), WAIT_S))
        assert isinstance(error, SetupError), error
        assert "max_value_bytes=4096" in str(error) and "raise RelayLimits.max_value_bytes" in str(error)
    assert relay.held_bytes() == 0


def test_a_flood_of_strangers_evicts_strangers_not_a_workers_pending_connection(token: bytes) -> None:
    """A worker's connection still owing its hello (its round trip) survives ``max_pending`` times more strangers
    holding part of a hello: they are evicted first, and the worker's get is answered."""
    pending = 4
    limits = RelayLimits(max_pending=pending, hello_timeout_s=60.0)
    with RelayServer("127.0.0.1", token=token, limits=limits) as relay:
        worker = socket.create_connection(relay.address, timeout=WAIT_S)
        nonce = worker.recv(auth.NONCE_BYTES)  # accepted: pending until its hello
        assert len(nonce) == auth.NONCE_BYTES
        strangers = []
        for _ in range(3 * pending):
            stranger = socket.create_connection(relay.address, timeout=WAIT_S)
            stranger.sendall(b"T")  # one byte of a hello, held
            strangers.append(stranger)
        _eventually(
            "the relay dropped the strangers over max_pending", lambda: relay.rejected_count() == 2 * pending + 1
        )
        worker.sendall(auth.hello(token, nonce) + b'{"op": "get", "key": "k"}\n')
        relay_set(relay.address, token, "k", "10.0.0.7:40017", WAIT_S)
        assert worker.makefile("rb").readline() == b'{"value": "10.0.0.7:40017"}\n'
        assert relay.evicted_count() == 2 * pending + 1  # strangers only: the worker's was never evicted
        for sock in (worker, *strangers):
            sock.close()


def _cutting_relay(before_nonce: bool) -> tuple[socket.socket, list[int], threading.Thread]:
    """A listener that cuts off every connection (after sending a nonce, unless ``before_nonce``), as the relay
    does to the connections it evicts; it counts them."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            seen.append(1)
            if not before_nonce:
                conn.sendall(auth.new_nonce())
                conn.recv(auth.HELLO_BYTES)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, seen, thread


@pytest.mark.parametrize(("before_nonce", "cause"), [(False, "max_pending"), (True, "max_connections")])
def test_a_worker_cut_off_retries_once_then_names_the_flood_not_the_token(
    token: bytes, before_nonce: bool, cause: str
) -> None:
    listener, seen, thread = _cutting_relay(before_nonce)
    try:
        error = _in_thread(lambda: relay_get(listener.getsockname()[:2], token, "k", WAIT_S))
    finally:
        listener.close()
    assert isinstance(error, WaitTimeout), error
    assert len(seen) == 2  # the first cut is retried once
    assert "twice" in str(error) and cause in str(error) and "flooding" in str(error)
    assert "token" not in str(error)


def test_a_token_holder_that_never_sends_its_request_is_told_the_hello_timeout(
    relay: RelayServer, token: bytes
) -> None:
    with socket.create_connection(relay.address, timeout=WAIT_S) as sock:
        sock.sendall(auth.hello(token, sock.recv(auth.NONCE_BYTES)))  # and no request line
        assert b"hello_timeout_s=0.5" in sock.makefile("rb").readline()
