"""Listener types of the progress channel and the example tally shared by the server and the bar."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from torchspark.training.hooks import ProgressUpdate, ScoreReport

__all__ = ["ProgressListener", "ErrorListener", "ScoreListener", "ExampleTally", "call_listeners"]

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


def call_listeners(listeners: Sequence[Callable[..., None]], *args: Any) -> None:
    for fn in listeners:
        try:
            fn(*args)
        except Exception:  # a broken display must never stop the channel
            logger.exception("progress listener %r raised; ignored", fn)
