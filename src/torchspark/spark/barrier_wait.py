"""Bounding Spark's barrier waits by the training master's ``rendezvous_timeout_s``.

``BarrierTaskContext.allGather`` (and ``barrier``) block until every task of the stage arrives or until
``spark.barrier.sync.timeout`` runs out. That limit belongs to the session, not to the fit: Spark's default is
365 days, and only [`torchspark.spark.local_session`][torchspark.spark.local_session] sets it to ``rendezvous_timeout_s``. On a session built
elsewhere a task whose peers never start would wait for a year.

`wait_bounded` runs the blocking call on a helper thread
(`call_on_thread`) and stops waiting after ``timeout_s``, so the
master's timeout holds on any session; whichever of the two limits is shorter ends the wait. The helper thread
cannot be interrupted and stays blocked in Spark's socket read, which is harmless: the timeout fails the task,
Spark then fails the whole barrier stage and ends the task's Python worker, thread included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torchspark.training.waiting import call_on_thread

__all__ = ["wait_bounded", "BARRIER_WAIT_THREAD"]

T = TypeVar("T")

#: Name of the helper thread (prefixed ``torchspark-`` like every thread torchspark starts).
BARRIER_WAIT_THREAD = "torchspark-barrier-wait"


def wait_bounded(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """``call()``, or [`WaitTimeout`][torchspark.errors.WaitTimeout] when it has not returned within ``timeout_s`` seconds.

    Args:
        call: the blocking call, e.g. ``lambda: ctx.allGather(message)``.
        timeout_s: how long to wait (the master's ``rendezvous_timeout_s``).
        what: who waits for what, for the error message (``"worker 1 in Spark's barrier allGather"``).
    Returns:
        What ``call`` returned.
    Raises:
        WaitTimeout: ``call`` did not return in time; the message names ``rendezvous_timeout_s`` (the knob to
            raise) and ``spark.barrier.sync.timeout`` (Spark's own, session-wide limit).
        BaseException: whatever ``call`` raised, unchanged.
    """
    return call_on_thread(
        call,
        BARRIER_WAIT_THREAD,
        timeout_s,
        lambda: (
            f"{what} did not return within rendezvous_timeout_s={timeout_s:g} s: not every task of the barrier "
            "stage arrived. All workers must start together: check that the cluster has a free task slot per "
            "worker, and raise rendezvous_timeout_s if executors are merely slow to start. (Spark's own limit, "
            "the session's spark.barrier.sync.timeout, also ends the wait when it is shorter.)"
        ),
    )
