"""What the driver does with a worker's message, whichever channel brought it: one place for both readers.

The TCP `ProgressServer` and the directory
`DirectoryProgressReader` receive the same lines (`wire`) and
feed the same state: each rank's latest update, the example tally, the kept tracebacks, the liveness watchdog and
the listeners. `ProgressInbox` is that state and the handling of the message kinds both channels carry
(``progress``, ``alive``, ``error``, ``score``); each reader adds the kinds only it has (the server answers
``clock`` probes, the directory carries ``closed``) through ``extra`` handlers of `ProgressInbox.receive`.

Example (what a reader does with each line it reads)::

    inbox = ProgressInbox(listeners=[bar.update])
    rank = inbox.receive(line, origin="worker 10.0.0.7")   # the rank a progress/alive line names, else None
    inbox.latest(), inbox.errors(), inbox.liveness.snapshot()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchspark.training.hooks import ProgressUpdate
from torchspark.training.progress.listeners import (
    ErrorListener,
    ErrorLog,
    ExampleTally,
    ProgressListener,
    ScoreListener,
    call_listeners,
)
from torchspark.training.progress.liveness import Liveness
from torchspark.training.progress.wire import (
    ChannelLimits,
    Malformed,
    int_field,
    parse_line,
    progress_from_msg,
    score_from_msg,
)

__all__ = ["ProgressInbox", "MessageHandler", "COMMON_KINDS"]

logger = logging.getLogger(__name__)

#: a reader's own handler of one message kind (the parsed message in; raise ``Malformed`` to refuse it)
MessageHandler = Callable[[dict[str, Any]], None]
#: the message kinds every channel carries
COMMON_KINDS = ("progress", "alive", "error", "score")


class ProgressInbox:
    """The driver's state of a fit's progress channel and the handling of each worker message.

    Listeners are called through `notify`: directly here; the TCP server overrides it to run them on a
    thread of their own. Every method is safe to call from any thread.

    Args:
        listeners: progress listeners, called with each [`ProgressUpdate`][torchspark.training.ProgressUpdate].
        score_listeners: called with each [`ScoreReport`][torchspark.training.ScoreReport].
        error_listeners: called with ``(rank, traceback_text)`` for each worker error kept.
        limits: bounds on the kept tracebacks (``max_error_chars``, ``max_error_bytes``, ``max_errors``).
        liveness: the watchdog's record of every rank's last message (default: a fresh one on the monotonic clock).
    """

    def __init__(
        self,
        listeners: Iterable[ProgressListener] = (),
        score_listeners: Iterable[ScoreListener] = (),
        error_listeners: Iterable[ErrorListener] = (),
        limits: ChannelLimits = ChannelLimits(),
        liveness: Liveness | None = None,
    ) -> None:
        self._lock = threading.Lock()  # guards the state below; subclasses may guard theirs with it too
        self._listeners: list[ProgressListener] = list(listeners)
        self._score_listeners: list[ScoreListener] = list(score_listeners)
        self._error_listeners: list[ErrorListener] = list(error_listeners)
        self._limits = limits
        self._latest: dict[int, ProgressUpdate] = {}
        self._tally = ExampleTally()
        self._errors = ErrorLog(limits.max_error_chars, limits.max_error_bytes, limits.max_errors)
        self._malformed = 0
        #: every rank's last message and whether it ended (the driver's watchdog reads it)
        self.liveness = liveness if liveness is not None else Liveness()

    # listeners
    def add_listener(self, fn: ProgressListener) -> None:
        """Call ``fn(update)`` for every progress message received from now on."""
        with self._lock:
            self._listeners = [*self._listeners, fn]  # copy-on-write: readers iterate without the lock

    def add_score_listener(self, fn: ScoreListener) -> None:
        """Call ``fn(report)`` for every score report received from now on."""
        with self._lock:
            self._score_listeners = [*self._score_listeners, fn]

    def add_error_listener(self, fn: ErrorListener) -> None:
        """Call ``fn(rank, traceback_text)`` for every worker error kept from now on."""
        with self._lock:
            self._error_listeners = [*self._error_listeners, fn]

    def notify(self, listeners: list[Any], *args: Any) -> None:
        """Call every listener of ``listeners`` with ``args`` (one that raises is logged and skipped)."""
        if listeners:
            call_listeners(listeners, *args)

    # what the driver reads
    def latest(self) -> dict[int, ProgressUpdate]:
        """The latest update of each rank that reported."""
        with self._lock:
            return dict(self._latest)

    def total_examples(self) -> int:
        """Examples reported by all workers over all epochs (updates carry cumulative per-epoch counts)."""
        with self._lock:
            return self._tally.total

    def errors(self) -> list[tuple[int, str]]:
        """``(rank, traceback_text)`` of every worker error kept, in arrival order."""
        with self._lock:
            return list(self._errors.kept)

    def retained_error_bytes(self) -> int:
        """Bytes of traceback text kept (at most ``limits.max_error_bytes``)."""
        with self._lock:
            return self._errors.bytes

    def dropped_error_count(self) -> int:
        """Errors whose text was dropped because ``limits.max_error_bytes`` or ``max_errors`` was reached."""
        with self._lock:
            return self._errors.dropped

    def malformed_count(self) -> int:
        """How many received lines (or unreadable chunks) were malformed and ignored."""
        with self._lock:
            return self._malformed

    # receiving
    def receive(self, line: bytes, origin: str, extra: Mapping[str, MessageHandler] | None = None) -> int | None:
        """Parse one line and act on it; returns the rank a ``progress`` or ``alive`` message names, else None.

        Args:
            line: one line of the wire format (`wire`).
            origin: where it came from, for the warning about a malformed line (a peer address, a directory).
            extra: the reader's own message kinds and their handlers (tried before the common ones).

        A malformed line (bad JSON, an unknown kind, a field of the wrong type) is counted, logged and skipped.
        """
        try:
            msg = parse_line(line)
            kind = msg["kind"]
            if extra and kind in extra:
                extra[kind](msg)
                return None
            if kind == "progress":
                return self._on_progress(progress_from_msg(msg))
            if kind == "alive":
                rank = int_field(msg, "rank")
                self.liveness.seen(rank, int_field(msg, "pid"))
                return rank
            if kind == "error":
                self._on_error(msg)
            elif kind == "score":
                report = score_from_msg(msg)
                with self._lock:
                    listeners = self._score_listeners
                self.notify(listeners, report)
            else:
                expected = ", ".join([*COMMON_KINDS, *(extra or ())])
                raise Malformed(f"unknown kind {kind!r} (expected {expected})")
        except Malformed as e:
            self.count_malformed()
            logger.warning("progress: ignoring a malformed line from %s (%s): %.200r", origin, e, line)
        return None

    def count_malformed(self) -> None:
        """Count one line or chunk that could not be read."""
        with self._lock:
            self._malformed += 1

    def _on_progress(self, update: ProgressUpdate) -> int:
        self.liveness.seen(update.rank, update.pid)
        with self._lock:
            self._latest[update.rank] = update
            self._tally.add(update)
            listeners = self._listeners
        self.notify(listeners, update)
        return update.rank

    def _on_error(self, msg: dict[str, Any]) -> None:
        rank, tb = int_field(msg, "rank"), msg.get("traceback")
        if not isinstance(tb, str):
            raise Malformed(f"field 'traceback' must be a string, got {type(tb).__name__}")
        with self._lock:
            kept = self._errors.add(rank, tb)
            first_drop = kept is None and self._errors.dropped == 1
            listeners = self._error_listeners
        if kept is None:
            if first_drop:
                logger.warning(
                    "progress: worker error text over max_error_bytes=%d / max_errors=%d; later errors are "
                    "counted, not kept",
                    self._limits.max_error_bytes,
                    self._limits.max_errors,
                )
            return
        logger.error("worker %d reported an error:\n%s", rank, kept)
        self.notify(listeners, rank, kept)
