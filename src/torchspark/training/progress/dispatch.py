"""Listener calls run off the thread that reads the workers: a bounded queue and one thread that drains it.

Why: the progress server's one thread also reads the workers' heartbeats. A listener that blocks there (an MLflow
server that stopped answering, a listener that sleeps) would starve the heartbeats and the driver's watchdog would
report a healthy worker as lost. A `CallQueue` takes the call instead and returns at once:

  1. `CallQueue.submit` puts ``(fn, args)`` on a bounded queue; when the queue is full (the listener is far
     behind) the call is dropped and counted, never waited for;
  2. the queue's thread makes the calls in order; a call that raises is logged and skipped;
  3. `CallQueue.close` lets the thread finish what is queued within ``timeout_s`` and gives up after it
     (logged; the thread is a daemon), so a stuck listener never keeps a fit from returning.

Example::

    calls = CallQueue("my-listener", max_pending=1000)
    calls.submit(print, "called on the queue's thread")
    calls.close(timeout_s=5.0)  # True: everything queued ran
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CallQueue", "DEFAULT_MAX_PENDING"]

log = logging.getLogger(__name__)

#: calls queued before new ones are dropped (progress reports are cumulative: a dropped one loses nothing lasting)
DEFAULT_MAX_PENDING = 10_000

_STOP = object()


class CallQueue:
    """Calls functions in order on its own daemon thread (steps 1-3 of the module docstring).

    Args:
        name: the thread's name (shown in logs and thread dumps).
        max_pending: calls waiting at most; later ones are dropped (and counted in `dropped`) until the
            thread catches up.
        clock: seconds, monotonic, for `running_s` (injectable for tests).
    """

    def __init__(
        self, name: str, max_pending: int = DEFAULT_MAX_PENDING, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self._clock = clock
        self._call_started: float | None = None  # when the call running now started (None: idle)
        self._queue: queue.Queue[Any] = queue.Queue(max_pending)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        #: calls dropped because the queue was full
        self.dropped = 0
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Queue ``fn(*args)``; False when it was dropped (queue full or closed)."""
        with self._lock:
            if self._closed:
                return False
            try:
                self._queue.put_nowait((fn, args))
                return True
            except queue.Full:
                self.dropped += 1
                if self.dropped == 1:
                    log.warning(
                        "%s: a listener is far behind (%d calls queued); dropping calls until it catches "
                        "up: keep listeners quick",
                        self.name,
                        self._queue.maxsize,
                    )
                return False

    def running_s(self) -> float:
        """How long the call running now has been running (0.0 when the thread is idle): a call that runs for
        long is a listener stuck on something, such as a tracking server that stopped answering."""
        started = self._call_started
        return 0.0 if started is None else max(self._clock() - started, 0.0)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every call queued so far ran; False when they had not after ``timeout_s`` (or closed)."""
        done = threading.Event()
        return self.submit(done.set) and done.wait(timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Run what is queued, then stop the thread; wait at most ``timeout_s``. Idempotent.

        Returns:
            True when every queued call ran, False when the thread was still busy after ``timeout_s`` (logged).
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._queue.put(_STOP, timeout=max(deadline - time.monotonic(), 0.001))
                except queue.Full:
                    pass
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            log.warning(
                "%s: a listener was still running %.1f s after the fit ended; not waiting for it "
                "(what it had not written yet is lost)",
                self.name,
                timeout_s,
            )
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, args = item
            self._call_started = self._clock()
            try:
                fn(*args)
            except Exception:  # a broken listener must never stop the others or the fit
                log.warning("%s: listener call %r failed; ignored", self.name, fn, exc_info=True)
            finally:
                self._call_started = None
