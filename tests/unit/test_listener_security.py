"""Listeners a fit opens are closed to strangers: the progress server's token, caps and bind address, signed
rendezvous values in torch's TCPStore, and task environment scopes. Real sockets, real stores."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch.distributed as dist

from torchspark.errors import ConfigError, SetupError
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.progress import ChannelLimits, ProgressClient, ProgressServer
from torchspark.training.rendezvous import auth
from torchspark.training.rendezvous.stores import fetch, listening_store, private_store, publish
from torchspark.training.worker import env as task_env

WAIT_S = 10.0

FAKE_ERROR = json.dumps(
    {"kind": "error", "rank": 0, "traceback": "Traceback (most recent call last):\nRuntimeError: planted by a stranger"}
)


def _eventually(what: str, pred: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


@pytest.fixture
def server() -> Iterator[ProgressServer]:
    with ProgressServer() as s:
        yield s


def _other_local_addresses() -> list[str]:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    return [a for a in out.split() if "." in a and not a.startswith("127.")]


# --- the token --------------------------------------------------------------------------------------------------


def test_a_connection_without_the_token_is_dropped_and_its_lines_never_read(server: ProgressServer) -> None:
    errors: list[tuple[int, str]] = []
    server.add_error_listener(lambda rank, tb: errors.append((rank, tb)))
    wrong = auth.hello(auth.new_token())
    for first in (b"", wrong):  # nothing at all, and a hello for another fit's token
        with socket.create_connection(server.address, timeout=WAIT_S) as sock:
            sock.sendall(first + (FAKE_ERROR.encode() + b"\n") * 50)
            sock.settimeout(WAIT_S)
            # the server hangs up on us after its challenge: recv ends with b"" (or the connection is reset)
            received = b""
            try:
                while chunk := sock.recv(64):
                    received += chunk
            except ConnectionResetError:
                pass
            assert len(received) <= auth.NONCE_BYTES  # nothing but the challenge
    _eventually("both strangers are rejected", lambda: server.rejected_count() == 2)
    assert server.errors() == [] and errors == []
    assert server.malformed_count() == 0  # not even parsed
    # a worker with the token still gets through
    got = threading.Event()
    server.add_error_listener(lambda rank, tb: got.set())
    with ProgressClient.to(server.endpoint, 1, timeout_s=WAIT_S) as client:
        client.send_error("Traceback (most recent call last):\nValueError: real\n")
        assert got.wait(WAIT_S)
    assert server.errors() == [(1, "Traceback (most recent call last):\nValueError: real\n")]


def test_a_silent_connection_is_dropped_after_the_hello_timeout() -> None:
    with ProgressServer(limits=ChannelLimits(hello_timeout_s=0.2)) as server:
        with socket.create_connection(server.address, timeout=WAIT_S) as sock:
            _eventually("the silent connection is dropped", lambda: server.rejected_count() == 1)
            sock.settimeout(WAIT_S)
            _challenge(sock)
            assert sock.recv(1) == b""
        assert server.open_connections() == 0


# --- bounded connections and memory -----------------------------------------------------------------------------


def test_a_thousand_connections_make_no_threads_and_workers_still_get_through() -> None:
    """Attack (c): 1,000 strangers connect and hold their connections; the server stays on one thread, holds at
    most ``max_pending`` of them, and a worker that connects during the flood reports progress, score and error."""
    updates: list[ProgressUpdate] = []
    scores: list[ScoreReport] = []
    with ProgressServer(listeners=[updates.append], score_listeners=[scores.append]) as server:
        threads_before = threading.active_count()
        strangers: list[socket.socket] = []
        peak_threads = threads_before
        try:
            for i in range(1000):
                strangers.append(socket.create_connection(server.address, timeout=WAIT_S))
                if i % 100 == 0:
                    peak_threads = max(peak_threads, threading.active_count())
            _eventually("the server has seen the flood", lambda: server.rejected_count() >= 1000 - 128)
            peak_threads = max(peak_threads, threading.active_count())
            assert server.open_connections() <= ChannelLimits().max_pending
            with ProgressClient.to(server.endpoint, 0, timeout_s=WAIT_S) as client:
                client.send(ProgressUpdate(0, 0, 1, 8, 0.5))
                client.send_score(ScoreReport(epoch=0, round=1, examples=8, score=0.5))
                client.send_error("Traceback (most recent call last):\nValueError: the worker's own\n")
                offset = client.measure_clock_offset(samples=2)
            _eventually("the worker's messages arrive", lambda: bool(updates and scores and server.errors()))
            peak_threads = max(peak_threads, threading.active_count())
        finally:
            for s in strangers:
                s.close()
    assert peak_threads <= threads_before + 1  # + the worker's sender thread; never one per connection
    assert updates == [ProgressUpdate(0, 0, 1, 8, 0.5)]
    assert scores == [ScoreReport(epoch=0, round=1, examples=8, score=0.5)]
    assert server.errors()[0][1].endswith("ValueError: the worker's own\n")
    assert abs(offset) < 5.0


def test_a_draining_close_does_not_wait_for_a_stranger_holding_one_byte(caplog: pytest.LogCaptureFixture) -> None:
    """The end of a fit drains the workers' connections; a stranger's connection (owing its hello) holds nothing of
    theirs, so the drain returns once the worker's closed, and closes the stranger's without waiting for it."""
    updates: list[ProgressUpdate] = []
    server = ProgressServer(listeners=[updates.append], limits=ChannelLimits(hello_timeout_s=60.0)).start()
    with socket.create_connection(server.address, timeout=WAIT_S) as stranger:
        stranger.settimeout(WAIT_S)
        _challenge(stranger)
        stranger.sendall(b"T")  # one byte of a hello, held
        with ProgressClient.to(server.endpoint, 0, timeout_s=WAIT_S) as client:
            client.send(ProgressUpdate(0, 0, 1, 8, 0.5))
        _eventually("the worker's update arrives", lambda: bool(updates))
        assert server.open_connections() >= 1  # the stranger (the worker's may still be closing)
        with caplog.at_level("DEBUG", logger="torchspark.training.progress.server"):
            server.close(drain_s=30.0)
        assert not [r for r in caplog.records if "still open after" in r.getMessage()]
        assert "1 connection(s) owing their hello closed without waiting" in caplog.text
        assert stranger.recv(1) == b""  # the server closed it
    assert server.open_connections() == 0 and server.authenticated_connections() == 0


def test_a_flood_of_strangers_holding_part_of_a_hello_never_evicts_a_workers_pending_connection() -> None:
    """Over ``max_pending`` connections owing their hello, the ones holding part of a hello (strangers) are
    evicted before a silent one (a worker within its round trip), which then authenticates."""
    with ProgressServer(limits=ChannelLimits(max_pending=4, hello_timeout_s=60.0)) as server:
        worker = socket.create_connection(server.address, timeout=WAIT_S)
        worker.settimeout(WAIT_S)
        nonce = _challenge(worker)
        strangers = []
        for _ in range(12):
            stranger = socket.create_connection(server.address, timeout=WAIT_S)
            stranger.sendall(b"T")
            strangers.append(stranger)
        _eventually("the strangers over max_pending are dropped", lambda: server.rejected_count() == 9)
        worker.sendall(auth.hello(server.token, nonce) + b'{"kind": "clock", "id": 1}\n')
        assert b'"id":1' in worker.makefile("rb").readline()  # authenticated: its clock probe is answered
        assert server.authenticated_connections() == 1
        for sock in (worker, *strangers):
            sock.close()


def _challenge(sock: socket.socket) -> bytes:
    nonce = b""
    while len(nonce) < auth.NONCE_BYTES:
        chunk = sock.recv(auth.NONCE_BYTES - len(nonce))
        assert chunk, "the server closed before its challenge"
        nonce += chunk
    return nonce


def test_three_hundred_long_error_lines_keep_bounded_error_text(server: ProgressServer) -> None:
    """Attack (d): 300 error lines of ~900 kB each; the server keeps at most ``max_error_bytes`` of their text,
    every kept traceback cut to ``max_error_chars``, and counts the rest."""
    limits = ChannelLimits()
    line = json.dumps({"kind": "error", "rank": 1, "traceback": "Traceback\n" + "x" * 900_000}).encode() + b"\n"
    with socket.create_connection(server.address, timeout=WAIT_S) as sock:
        sock.sendall(auth.hello(server.token, _challenge(sock)))
        for _ in range(300):
            sock.sendall(line)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(60)
        assert sock.recv(1) == b""  # the server read everything and closed its side when we closed ours
    _eventually("every line is handled", lambda: len(server.errors()) + server.dropped_error_count() == 300)
    assert 0 < server.retained_error_bytes() <= limits.max_error_bytes
    assert all(len(tb) <= limits.max_error_chars + 20 for _, tb in server.errors())
    assert server.dropped_error_count() >= 300 - limits.max_error_bytes // limits.max_error_chars


def test_channel_limits_refuse_bad_values() -> None:
    with pytest.raises(ConfigError, match="max_pending"):
        ChannelLimits(max_pending=0)
    with pytest.raises(ConfigError, match="hello_timeout_s"):
        ChannelLimits(hello_timeout_s=0)


# --- bind address -----------------------------------------------------------------------------------------------


def test_the_default_server_listens_on_loopback_only(server: ProgressServer) -> None:
    assert server.bound_address[0] == "127.0.0.1"
    for address in _other_local_addresses():
        with pytest.raises(OSError):
            socket.create_connection((address, server.address[1]), timeout=2.0).close()


def _listening_address(port: int) -> str:
    """The local address a LISTEN socket on ``port`` is bound to, from /proc/net/tcp."""
    with open("/proc/net/tcp") as f:
        for row in f.read().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                return socket.inet_ntoa(bytes.fromhex(addr)[::-1])
    raise AssertionError(f"nothing listens on port {port}")


def test_a_rendezvous_store_listens_on_the_given_address_only() -> None:
    store = listening_store("127.0.0.1", 0, None, 30.0)
    assert _listening_address(store.port) == "127.0.0.1"
    client = dist.TCPStore("127.0.0.1", store.port, None, is_master=False)
    client.set("k", "v")
    assert store.get("k") == b"v"
    for address in _other_local_addresses():
        with pytest.raises(OSError):
            socket.create_connection((address, store.port), timeout=2.0).close()


# --- signed rendezvous values -----------------------------------------------------------------------------------


def test_a_strangers_store_writes_are_ignored_or_detected() -> None:
    token = auth.new_token()
    store = listening_store("127.0.0.1", 0, None, 5.0)
    stranger = dist.TCPStore("127.0.0.1", store.port, None, is_master=False)
    stranger.set("torchspark/store", "10.9.9.9:1")  # the key the relay used before it was derived from the token
    publish(store, token, "worker-0-store", "127.0.0.1:4242")
    assert (
        fetch(dist.TCPStore("127.0.0.1", store.port, None, is_master=False), token, "worker-0-store")
        == "127.0.0.1:4242"
    )
    # a stranger who overwrites the real key (found by listing keys after it was written) is detected
    real_key = auth.derive_key(token, "worker-0-store")
    stranger.set(real_key, "10.9.9.9:1")
    with pytest.raises(SetupError, match="not signed"):
        fetch(store, token, "worker-0-store")
    # a value signed for another purpose cannot be replayed here
    stranger.set(real_key, auth.sign(token, "something-else", "10.9.9.9:1"))
    with pytest.raises(SetupError, match="not signed"):
        fetch(store, token, "worker-0-store")


def test_the_private_view_hides_torch_distributed_keys_behind_the_token() -> None:
    token = auth.new_token()
    store = listening_store("127.0.0.1", 0, None, 5.0)
    stranger = dist.TCPStore("127.0.0.1", store.port, None, is_master=False)
    stranger.set("rank_0", "planted")  # a name torch.distributed might use
    mine = private_store(store, token)
    mine.set("rank_0", "real")
    assert mine.get("rank_0") == b"real"
    assert store.get("rank_0") == b"planted"
    assert private_store(store, auth.new_token()).check(["rank_0"]) is False  # another fit sees nothing


def test_auth_primitives() -> None:
    a, b = auth.new_token(), auth.new_token()
    assert a != b and len(a) == auth.TOKEN_BYTES
    assert auth.check_hello(a, auth.hello(a)) and not auth.check_hello(a, auth.hello(b))
    assert len(auth.hello(a)) == auth.HELLO_BYTES
    assert auth.derive_key(a, "x") != auth.derive_key(b, "x") != auth.derive_key(a, "y")
    assert auth.verify(a, "p", auth.sign(a, "p", "v")) == "v"
    assert auth.verify(b, "p", auth.sign(a, "p", "v")) is None
    assert auth.verify(a, "p", "short") is None
    with pytest.raises(ConfigError, match="16 random bytes"):
        auth.hello(b"short")


# --- task environment -------------------------------------------------------------------------------------------


def test_task_environment_restores_set_unset_and_user_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TS_TEST_A", raising=False)
    monkeypatch.setenv("TS_TEST_B", "user")
    monkeypatch.setenv("TS_TEST_C", "")
    with task_env.TaskEnvironment() as env:
        env.setdefault("TS_TEST_A", "lo")
        env.setdefault("TS_TEST_B", "lo")  # the user's choice wins
        env.setdefault("TS_TEST_C", "lo")  # empty counts as unset
        env.set("TS_TEST_B", None)
        env.set("TS_TEST_B", "again")
        assert (os.environ["TS_TEST_A"], os.environ["TS_TEST_B"], os.environ["TS_TEST_C"]) == ("lo", "again", "lo")
    assert "TS_TEST_A" not in os.environ
    assert os.environ["TS_TEST_B"] == "user" and os.environ["TS_TEST_C"] == ""
    assert task_env.read("TS_TEST_C") is None and task_env.read("TS_TEST_B") == "user"


@pytest.mark.parametrize(
    ("master", "conf", "expected"),
    [
        ("local[2]", {"spark.driver.host": "10.1.2.3"}, ("127.0.0.1", "127.0.0.1")),
        ("local-cluster[2,1,1024]", {}, ("127.0.0.1", "127.0.0.1")),
        ("spark://m:7077", {"spark.driver.host": "127.0.0.1"}, ("127.0.0.1", "127.0.0.1")),
        ("yarn", {"spark.driver.host": "10.1.2.3", "spark.driver.bindAddress": "127.0.0.1"}, ("127.0.0.1", "10.1.2.3")),
    ],
)
def test_driver_listeners_bind_where_workers_reach_the_driver(
    master: str, conf: dict[str, str], expected: tuple[str, str]
) -> None:
    from torchspark.spark.driver_address import listen_address_for

    assert listen_address_for(master, conf.get) == expected
