"""``wait_bounded``: a Spark barrier wait ends after ``rendezvous_timeout_s`` whatever the session's own limit.

The helper is tested here with plain callables (no Spark); tests/spark/test_spark_runtime.py runs it inside a real
barrier stage whose second task never arrives."""

from __future__ import annotations

import threading

import pytest

from torchspark.errors import WaitTimeout
from torchspark.spark.barrier_wait import BARRIER_WAIT_THREAD, wait_bounded


def test_returns_what_the_call_returns() -> None:
    assert wait_bounded(lambda: ["10.0.0.1:1234", ""], 5.0, "worker 0") == ["10.0.0.1:1234", ""]


def test_reraises_the_calls_own_error_unchanged() -> None:
    error = ConnectionResetError("the JVM closed the barrier socket")

    def fail() -> None:
        raise error

    with pytest.raises(ConnectionResetError) as info:
        wait_bounded(fail, 5.0, "worker 0")
    assert info.value is error


def test_a_call_that_never_returns_times_out_naming_both_knobs() -> None:
    release = threading.Event()  # stands for the peer that never arrives
    try:
        with pytest.raises(WaitTimeout) as info:
            wait_bounded(release.wait, 0.2, "worker 1 of 2 in Spark's barrier allGather")
    finally:
        release.set()
    message = str(info.value)
    assert message.startswith(
        "worker 1 of 2 in Spark's barrier allGather did not return within rendezvous_timeout_s=0.2 s"
    ), message
    assert "raise rendezvous_timeout_s" in message and "spark.barrier.sync.timeout" in message
    assert isinstance(info.value, TimeoutError)  # WaitTimeout is a TimeoutError for callers that catch those
    for thread in threading.enumerate():  # released, the helper thread ends
        if thread.name == BARRIER_WAIT_THREAD:
            thread.join(timeout=10)
            assert not thread.is_alive()
