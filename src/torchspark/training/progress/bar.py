"""The driver's ``tqdm`` display of a fit, fed by a progress-server listener."""

from __future__ import annotations

import math
import sys
import threading
from typing import TextIO

from torchspark.errors import ConfigError
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.progress.listeners import ExampleTally

__all__ = ["ProgressBar"]


class ProgressBar:
    """A ``tqdm`` bar of examples trained, with examples/s and the mean of the workers' latest scores.

    Feed it from a server: ``ProgressServer(listeners=[bar.update])``. Thread-safe.

    Args:
        total_examples: examples expected over the whole fit (all epochs, all workers); None = no total.
        desc: label; the latest epoch number is appended.
        enabled: True/False force the display on/off; None = on only when ``file`` is a terminal. A disabled
            bar renders nothing but still counts (`examples`, `score`).
        file: where to draw; default ``sys.stderr``.
        mininterval: minimum seconds between redraws; raise it if the bar floods a slow terminal.
    """

    def __init__(
        self,
        total_examples: int | None = None,
        desc: str = "epoch",
        enabled: bool | None = None,
        file: TextIO | None = None,
        mininterval: float = 0.5,
    ) -> None:
        # plain tqdm, not tqdm.auto: a notebook widget would ignore ``file`` and ``enabled``
        from tqdm import tqdm  # imported lazily: only the driver draws

        if total_examples is not None and total_examples < 0:
            raise ConfigError(f"ProgressBar total_examples must be >= 0 or None, got {total_examples}")
        out = sys.stderr if file is None else file
        if enabled is None:
            isatty = getattr(out, "isatty", None)
            enabled = bool(isatty()) if callable(isatty) else False
        self.enabled = enabled
        self._desc = desc
        self._lock = threading.Lock()
        self._tally = ExampleTally()
        self._scores: dict[int, float] = {}
        self._epoch = -1
        self._closed = False
        self._bar = tqdm(
            total=total_examples,
            desc=desc,
            unit="ex",
            unit_scale=True,
            file=out,
            disable=not enabled,
            mininterval=mininterval,
            dynamic_ncols=True,
        )

    @property
    def examples(self) -> int:
        """Examples counted so far."""
        with self._lock:
            return self._tally.total

    @property
    def score(self) -> float:
        """Mean over workers of each worker's latest finite score (NaN before any)."""
        with self._lock:
            return self._mean_score()

    def _mean_score(self) -> float:
        finite = [s for s in self._scores.values() if math.isfinite(s)]
        return sum(finite) / len(finite) if finite else float("nan")

    def update(self, update: ProgressUpdate) -> None:
        """Count one worker update and redraw (rate-limited by ``mininterval``)."""
        with self._lock:
            if self._closed:
                return
            added = self._tally.add(update)
            self._scores[update.rank] = update.score
            if update.epoch > self._epoch:
                self._epoch = update.epoch
                self._bar.set_description_str(f"{self._desc} {update.epoch}", refresh=False)
            score = self._mean_score()
            if math.isfinite(score):
                self._bar.set_postfix_str(f"score={score:.4g}", refresh=False)
            self._bar.update(added)

    __call__ = update

    def close(self) -> None:
        """Draw the final state and release the terminal line. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
