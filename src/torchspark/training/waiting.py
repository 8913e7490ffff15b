"""Bounded waits: a blocking call on a helper thread, a queue read, a queue write that a stop flag can end.

Every blocking wait in torchspark goes through one of these, so each has a timeout (or a way out) and a message
naming the knob that sets it:

* :func:`call_on_thread` runs a call that cannot be interrupted (Spark's ``allGather``, a Spark action) on a
  daemon thread and waits on an ``Event`` (not ``Thread.join``: a Ctrl-C inside ``join()`` marks the running thread
  as stopped, CPython bpo-45274, after which ``join()`` no longer waits for it);
* :func:`get_within` reads one item from a queue or fails with :class:`WaitTimeout`;
* :func:`put_until_stopped` writes to a bounded queue, giving up when a stop flag is set.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, TypeVar

from torchspark.errors import WaitTimeout

__all__ = ["call_on_thread", "get_within", "put_until_stopped"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how often a wait wakes up to check flags (short: it bounds how late a stop or a Ctrl-C is seen)
POLL_S = 0.1


def call_on_thread(call: Callable[[], T], name: str, timeout_s: float | None = None,
                   timeout_message: Callable[[], str] | None = None,
                   on_interrupt: Callable[[], None] | None = None, interrupt_grace_s: float = 60.0) -> T:
    """``call()`` on a daemon thread named ``name``; its value, or its exception re-raised here unchanged.

    Args:
        call: the blocking call.
        name: the helper thread's name (``torchspark-...``).
        timeout_s: stop waiting after this long and raise :class:`WaitTimeout` (None: wait until it returns). The
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
        while not done.wait(timeout=POLL_S if deadline is None else max(0.0, min(POLL_S,
                                                                                 deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(timeout_message() if timeout_message else
                                  f"{name} did not finish within {timeout_s:g} s")
    except WaitTimeout:
        raise
    except BaseException:
        if on_interrupt is not None:
            on_interrupt()
            if not done.wait(timeout=interrupt_grace_s):
                log.warning("%s did not stop within %.0f s of the interrupt; it is left running", name,
                            interrupt_grace_s)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def get_within(q: Any, timeout_s: float, what: Callable[[], str]) -> Any:
    """One item of ``q`` (a ``queue.Queue`` or multiprocessing queue), or :class:`WaitTimeout` with ``what()``
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
