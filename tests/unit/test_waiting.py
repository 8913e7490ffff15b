"""The bounded-wait helpers every deadline loop goes through (torchspark.training.waiting)."""

from __future__ import annotations

import threading

from torchspark.training.waiting import Deadline, join_within, wait_until


def test_a_deadline_without_a_limit_never_expires_and_leaves_the_cap():
    d = Deadline.after(None)
    assert not d.expired
    assert d.left() is None
    assert d.left(cap=0.1) == 0.1


def test_a_passed_deadline_is_expired_with_nothing_left():
    d = Deadline.after(0.0)
    assert d.expired
    assert d.left() == 0.0
    assert d.left(cap=5.0) == 0.0


def test_a_future_deadline_caps_what_is_left():
    d = Deadline.after(3600.0)
    assert not d.expired
    assert d.left(cap=0.5) == 0.5
    assert 3000.0 < d.left() <= 3600.0


def test_wait_until_returns_true_once_ready_and_false_on_timeout_or_give_up():
    calls = []

    def ready() -> bool:
        calls.append(1)
        return len(calls) >= 3

    assert wait_until(ready, timeout_s=60.0, poll_s=0.001) is True
    assert len(calls) == 3
    assert wait_until(lambda: False, timeout_s=0.0) is False
    assert wait_until(lambda: False, timeout_s=60.0, give_up=lambda: True) is False


def test_join_within_returns_the_threads_still_running():
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, daemon=True)
    done = threading.Thread(target=lambda: None)
    stuck.start()
    done.start()
    try:
        assert join_within([done, stuck], timeout_s=0.05) == [stuck]
    finally:
        release.set()
        stuck.join()
    assert join_within([stuck], timeout_s=1.0) == []
