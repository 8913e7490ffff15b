"""What a training loop reports while it runs: timed phases, scores and progress.

Loops talk to a :class:`WorkerHooks` object; the runner decides where it goes (the stats collector of
:mod:`torchspark.stats`, a progress channel to the driver, or nowhere).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Protocol

__all__ = ["PhaseRecorder", "NullRecorder", "WorkerHooks", "ProgressUpdate"]


class PhaseRecorder(Protocol):
    """The slice of :class:`torchspark.stats.StatsCollector` the loops use."""

    def phase(self, name: str, **attrs: Any) -> ContextManager[Any]: ...

    def record_score(self, iteration: int, score: float) -> None: ...

    def record_encoding(self, step: int, bytes_sent: int, dense_bytes: int, sparsity: float, threshold: float,
                        format: str) -> None: ...


class NullRecorder:
    """Records nothing (stats collection off)."""

    @contextlib.contextmanager
    def phase(self, name: str, **attrs: Any) -> Iterator[None]:
        yield None

    def record_score(self, iteration: int, score: float) -> None:
        return None

    def record_encoding(self, step: int, bytes_sent: int, dense_bytes: int, sparsity: float, threshold: float,
                        format: str) -> None:
        return None


@dataclass(frozen=True)
class ProgressUpdate:
    """One worker's progress, sent to the driver's progress bar."""

    rank: int
    epoch: int
    iteration: int
    examples: int
    score: float


@dataclass
class WorkerHooks:
    """Where a loop's reports go.

    Args:
        recorder: timed phases and series (a :class:`torchspark.stats.StatsCollector` or :class:`NullRecorder`).
        progress: called with a :class:`ProgressUpdate` every ``progress_every`` minibatches (None = off).
        progress_every: how often to report; each report is one small message to the driver.
    """

    recorder: PhaseRecorder = field(default_factory=NullRecorder)
    progress: Callable[[ProgressUpdate], None] | None = None
    progress_every: int = 10
    #: called with the worker's traceback text when it fails (e.g. sent to the driver's progress server)
    report_error: Callable[[str], None] | None = None
    #: releases what the hooks hold (progress connection); called once when the worker ends
    close: Callable[[], None] | None = None
