"""The progress hello answers a per-connection challenge (no replay) and error text is logged escaped (issue 31)."""

from __future__ import annotations

import json
import socket
import time

from torchspark.training.progress import ProgressServer
from torchspark.training.rendezvous import auth

WAIT_S = 30.0


def _challenge(sock: socket.socket) -> bytes:
    nonce = b""
    while len(nonce) < auth.NONCE_BYTES:
        chunk = sock.recv(auth.NONCE_BYTES - len(nonce))
        assert chunk, "the server closed before its challenge"
        nonce += chunk
    return nonce


def _until(predicate) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _error_line(text: str) -> bytes:
    return json.dumps({"kind": "error", "rank": 0, "traceback": text}).encode() + b"\n"


def test_a_captured_hello_does_not_replay_on_another_connection() -> None:
    with ProgressServer() as server:
        with socket.create_connection(server.address, timeout=WAIT_S) as first:
            captured = auth.hello(server.token, _challenge(first))  # what a sniffer on loopback would see
            first.sendall(captured + _error_line("ValueError: the worker's own"))
            assert _until(lambda: len(server.errors()) == 1)
        with socket.create_connection(server.address, timeout=WAIT_S) as replay:
            replay.settimeout(WAIT_S)
            _challenge(replay)
            replay.sendall(captured + _error_line("RuntimeError: planted by a stranger"))
            assert _until(lambda: server.rejected_count() == 1)
        assert [tb for _, tb in server.errors()] == ["ValueError: the worker's own"]


def test_control_characters_of_a_workers_error_are_escaped() -> None:
    with ProgressServer() as server:
        with socket.create_connection(server.address, timeout=WAIT_S) as sock:
            sock.settimeout(WAIT_S)
            sock.sendall(
                auth.hello(server.token, _challenge(sock))
                + _error_line("Traceback\n\x1b[2J\x1b[31mfake\rValueError: x\x07\ttab\n")
            )
            assert _until(lambda: len(server.errors()) == 1)
        ((_, kept),) = server.errors()
        assert kept == "Traceback\n\\x1b[2J\\x1b[31mfake\\x0dValueError: x\\x07\ttab\n"
