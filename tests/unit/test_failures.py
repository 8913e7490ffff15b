"""The failures module every route uses: the last line of a traceback, the "worker N failed" error, and waiting a
moment for the failing worker's own report when a peer's symptom arrived first."""

from __future__ import annotations

import threading
import time

import pytest

from torchspark.errors import DataError, WorkerError
from torchspark.training.driver.failures import last_line, wait_for_root_cause, worker_failure

PEER = "Traceback (most recent call last):\nRuntimeError: [gloo/transport/tcp/pair.cc] Connection closed by peer"
CAUSE = 'Traceback (most recent call last):\n  File "model.py", line 3\nValueError: bad input in layer 2\n\n'


def test_last_line_is_the_exception_or_the_default() -> None:
    assert last_line(CAUSE) == "ValueError: bad input in layer 2"
    assert last_line("  \n\n") == "unknown error"
    assert last_line("", "?") == "?"


def test_worker_failure_names_the_worker_and_keeps_the_traceback() -> None:
    error = worker_failure(1, CAUSE)
    assert type(error) is WorkerError
    assert str(error).startswith("worker 1 failed: ValueError: bad input in layer 2\n--- worker traceback ---\n")
    assert 'File "model.py", line 3' in str(error)
    ours = worker_failure(0, "Traceback (most recent call last):\ntorchspark.errors.DataError: label 7 out of range")
    assert isinstance(ours, DataError) and isinstance(ours, WorkerError)


def test_wait_for_root_cause_returns_as_soon_as_the_cause_is_reported() -> None:
    errors = [(0, PEER)]
    threading.Timer(0.2, lambda: errors.append((1, CAUSE))).start()
    start = time.monotonic()
    assert wait_for_root_cause(lambda: errors, wait_s=10.0) == (1, CAUSE)
    assert time.monotonic() - start < 5.0


def test_wait_for_root_cause_gives_up_after_wait_s_or_when_receive_says_so() -> None:
    start = time.monotonic()
    assert wait_for_root_cause(lambda: [(0, PEER)], wait_s=0.2) == (0, PEER)  # only the symptom is known
    assert 0.2 <= time.monotonic() - start < 5.0
    calls: list[float] = []

    def receive(timeout: float) -> bool:
        calls.append(timeout)
        return False  # nothing more can come (a worker died without a word)

    assert wait_for_root_cause(lambda: [(0, PEER)], wait_s=10.0, receive=receive, poll_s=0.5) == (0, PEER)
    assert len(calls) == 1 and 0 < calls[0] <= 0.5
    assert wait_for_root_cause(lambda: [], wait_s=0.0) is None


@pytest.mark.parametrize("errors", [[(2, CAUSE)], [(0, PEER), (2, CAUSE)]])
def test_a_cause_already_reported_needs_no_wait(errors: list[tuple[int, str]]) -> None:
    def receive(timeout: float) -> bool:
        raise AssertionError("no wait expected")

    assert wait_for_root_cause(lambda: errors, wait_s=10.0, receive=receive) == (2, CAUSE)
