"""Bounded waits: a blocking call on a helper thread, a queue read, a queue write that a stop flag can end.

Every blocking wait in torchspark goes through one of these, so each has a timeout (or a way out) and a message
naming the knob that sets it:

* `call_on_thread` runs a call that cannot be interrupted (Spark's ``allGather``, a Spark action) on a
  daemon thread and waits on an ``Event`` (not ``Thread.join``: a Ctrl-C inside ``join()`` marks the running thread
  as stopped, CPython bpo-45274, after which ``join()`` no longer waits for it);
* `get_within` reads one item from a queue or fails with [`WaitTimeout`][torchspark.errors.WaitTimeout];
* `put_until_stopped` writes to a bounded queue, giving up when a stop flag is set;
* `Deadline` is the one way to spread one timeout over several waits (``left()`` for each), and
  `wait_until` polls a condition that has nothing to hand-shake with (executors registering) until a deadline;
* `join_within` joins threads or processes against one shared deadline.

Example::

    deadline = Deadline.after(timeout_s)
    while not ready():
        if deadline.expired:
            raise WaitTimeout(f"... within timeout_s={timeout_s:g}; raise timeout_s or ...")
        cond.wait(deadline.left(cap=POLL_S))
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from torchspark.errors import WaitTimeout

__all__ = ["call_on_thread", "get_within", "put_until_stopped", "Deadline", "wait_until", "join_within"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how often a wait wakes up to check flags (short: it bounds how late a stop or a Ctrl-C is seen)
POLL_S = 0.1


def call_on_thread(
    call: Callable[[], T],
    name: str,
    timeout_s: float | None = None,
    timeout_message: Callable[[], str] | None = None,
    on_interrupt: Callable[[], None] | None = None,
    interrupt_grace_s: float = 60.0,
) -> T:
    """``call()`` on a daemon thread named ``name``; its value, or its exception re-raised here unchanged.

    Args:
        call: the blocking call.
        name: the helper thread's name (``torchspark-...``).
        timeout_s: stop waiting after this long and raise [`WaitTimeout`][torchspark.errors.WaitTimeout] (None: wait until it returns). The
            thread cannot be interrupted and stays blocked; the caller must make that harmless (a failed Spark
            task ends its Python worker, thread included).
        timeout_message: the message of that WaitTimeout; it must name the knob to raise.
        on_interrupt: called when the wait itself is interrupted (Ctrl-C); then the helper thread gets
            ``interrupt_grace_s`` to finish before the interrupt propagates (e.g. cancel a Spark job group).
    Raises:
        WaitTimeout: ``timeout_s`` ran out.
        BaseException: whatever ``call`` raised, or the interrupt.
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not done.wait(timeout=POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    timeout_message() if timeout_message else f"{name} did not finish within {timeout_s:g} s"
                )
    except WaitTimeout:
        raise
    except BaseException:
        if on_interrupt is not None:
            on_interrupt()
            if not done.wait(timeout=interrupt_grace_s):
                log.warning(
                    "%s did not stop within %.0f s of the interrupt; it is left running", name, interrupt_grace_s
                )
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def get_within(q: Any, timeout_s: float, what: Callable[[], str]) -> Any:
    """One item of ``q`` (a ``queue.Queue`` or multiprocessing queue), or [`WaitTimeout`][torchspark.errors.WaitTimeout] with ``what()``
    as its message after ``timeout_s``."""
    try:
        return q.get(timeout=timeout_s)
    except queue.Empty:
        raise WaitTimeout(what()) from None


def put_until_stopped(q: Any, item: Any, stop: threading.Event, poll_s: float = POLL_S) -> bool:
    """Put ``item`` into the bounded queue ``q``, waiting for room; False (item dropped) once ``stop`` is set."""
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False


@dataclass(frozen=True)
class Deadline:
    """A moment (``time.monotonic()``) by which a wait must end; None: no limit.

    Example: ``d = Deadline.after(5.0)``, then ``q.get(timeout=d.left())`` in a loop until ``d.expired``.
    """

    at: float | None

    @classmethod
    def after(cls, timeout_s: float | None) -> Deadline:
        """The deadline ``timeout_s`` seconds from now (None: never)."""
        return cls(None if timeout_s is None else time.monotonic() + timeout_s)

    def left(self, cap: float | None = None) -> float | None:
        """Seconds left (never negative), at most ``cap`` when given; None when there is no limit and no cap."""
        if self.at is None:
            return cap
        left = max(0.0, self.at - time.monotonic())
        return left if cap is None else min(left, cap)

    @property
    def expired(self) -> bool:
        """Whether the moment has passed (never, without a limit)."""
        return self.at is not None and time.monotonic() >= self.at


def wait_until(
    ready: Callable[[], bool], timeout_s: float, poll_s: float = POLL_S, give_up: Callable[[], bool] | None = None
) -> bool:
    """Poll ``ready()`` every ``poll_s`` until it is true (True) or ``timeout_s`` has passed, or ``give_up()`` is
    true (False). For conditions with nothing to hand-shake with (executors registering with a fresh cluster, a
    worker's report arriving on another channel); the caller raises with a message naming the knob."""
    deadline = Deadline.after(timeout_s)
    while not ready():
        if deadline.expired or (give_up is not None and give_up()):
            return False
        time.sleep(deadline.left(cap=poll_s) or 0.0)
    return True


def join_within(joinables: Iterable[Any], timeout_s: float) -> list[Any]:
    """Join every thread or process against one deadline ``timeout_s`` from now; returns those still alive."""
    items = list(joinables)
    deadline = Deadline.after(timeout_s)
    for item in items:
        item.join(deadline.left())
    return [item for item in items if item.is_alive()]
