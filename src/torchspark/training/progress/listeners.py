"""Listener types of the progress channel and the example tally shared by the server and the bar."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from torchspark.training.hooks import ProgressUpdate, ScoreReport

__all__ = [
    "ProgressListener",
    "ErrorListener",
    "ScoreListener",
    "ExampleTally",
    "ErrorLog",
    "call_listeners",
    "printable",
]

logger = logging.getLogger(__name__)

ProgressListener = Callable[[ProgressUpdate], None]
ErrorListener = Callable[[int, str], None]
ScoreListener = Callable[[ScoreReport], None]


class ExampleTally:
    """Counts examples from cumulative per-(rank, epoch) counts; late or repeated reports add nothing."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], int] = {}
        self.total = 0

    def add(self, update: ProgressUpdate) -> int:
        """Record ``update`` and return how many new examples it reports."""
        key = (update.rank, update.epoch)
        prev = self._seen.get(key, 0)
        if update.examples <= prev:
            return 0
        self._seen[key] = update.examples
        self.total += update.examples - prev
        return update.examples - prev


# control characters other than newline and tab: a traceback holding them would steer the terminal it is logged to
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab written as ``\\xNN`` (ANSI escapes, carriage
    returns and backspaces in a worker's error can then neither recolour nor overwrite the driver's log).

    Example: ``printable("a\x1b[31mb") == "a\\x1b[31mb"``.
    """
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class ErrorLog:
    """Worker tracebacks kept on the driver, bounded: each cut to its last ``max_chars`` characters (the end names
    the error), at most ``max_errors`` of them and ``max_bytes`` of text in all; later ones are only counted (the
    first errors hold the root cause). Not thread-safe: the server calls it under its lock."""

    def __init__(self, max_chars: int, max_bytes: int, max_errors: int) -> None:
        self.max_chars, self.max_bytes, self.max_errors = max_chars, max_bytes, max_errors
        self.kept: list[tuple[int, str]] = []
        self.bytes = 0
        self.dropped = 0

    def add(self, rank: int, tb: str) -> str | None:
        """Keep ``tb`` (cut, control characters escaped: `printable`) and return the kept text, or None when
        it was over the limits and only counted."""
        tb = printable(tb)
        if len(tb) > self.max_chars:
            tb = "...[truncated]\n" + tb[-self.max_chars :]
        size = len(tb.encode("utf-8", "replace"))
        if len(self.kept) >= self.max_errors or self.bytes + size > self.max_bytes:
            self.dropped += 1
            return None
        self.kept.append((rank, tb))
        self.bytes += size
        return tb


def call_listeners(listeners: Sequence[Callable[..., None]], *args: Any) -> None:
    for fn in listeners:
        try:
            fn(*args)
        except Exception:  # a broken display must never stop the channel
            logger.exception("progress listener %r raised; ignored", fn)
