"""What a training loop reports while it runs: timed phases, scores and progress.

Loops talk to a [`WorkerHooks`][torchspark.training.WorkerHooks] object; the runner decides where it goes (the stats collector of
[`torchspark.stats`][torchspark.stats], a progress channel to the driver, or nowhere).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["PhaseRecorder", "NullRecorder", "WorkerHooks", "ProgressUpdate", "ScoreReport"]


class PhaseRecorder(Protocol):
    """The slice of [`torchspark.stats.StatsCollector`][torchspark.stats.StatsCollector] the loops use."""

    def phase(self, name: str, **attrs: Any) -> AbstractContextManager[Any]: ...

    def record_score(self, iteration: int, score: float) -> None: ...

    def record_encoding(
        self, step: int, bytes_sent: int, dense_bytes: int, sparsity: float, threshold: float, format: str
    ) -> None: ...


#: the one context manager every [`NullRecorder.phase`][torchspark.training.NullRecorder.phase] returns: ``nullcontext`` is reusable and costs a tenth of
#: a generator-based context manager, and a loop enters two or three phases per step
_NO_PHASE: AbstractContextManager[None] = contextlib.nullcontext()


class NullRecorder:
    """Records nothing (stats collection off)."""

    def phase(self, name: str, **attrs: Any) -> AbstractContextManager[None]:
        return _NO_PHASE

    def record_score(self, iteration: int, score: float) -> None:
        return None

    def record_encoding(
        self, step: int, bytes_sent: int, dense_bytes: int, sparsity: float, threshold: float, format: str
    ) -> None:
        return None


@dataclass(frozen=True)
class ProgressUpdate:
    """One worker's progress, sent to the driver's progress bar."""

    rank: int
    epoch: int
    iteration: int
    examples: int
    score: float
    #: gradient sharing: payload bytes this worker handed to the exchange so far in the fit (0 for averaging)
    bytes_sent: int = 0
    #: gradient sharing: what dense float32 exchange of the same updates would have sent so far in the fit
    dense_bytes: int = 0
    #: the worker process's id (set by the progress channel; lets the driver name the process in a failure);
    #: transport metadata, left out of comparisons
    pid: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ScoreReport:
    """The score every worker agrees on after a synchronisation, sent by rank 0 to the driver.

    Averaging: after each round, the example-weighted mean over workers of each worker's last minibatch loss in
    the round (the value the round's all-reduce already carries). Gradient sharing has no rounds that average
    anything, so it reports once per epoch the example-weighted mean loss of every minibatch every worker trained.
    """

    epoch: int
    #: 1-based number of the averaging round within the epoch; None for a gradient-sharing epoch score
    round: int | None
    #: examples behind the score, summed over workers (the round's, or the epoch's)
    examples: int
    score: float


@dataclass
class WorkerHooks:
    """Where a loop's reports go.

    Args:
        recorder: timed phases and series (a [`torchspark.stats.StatsCollector`][torchspark.stats.StatsCollector] or [`NullRecorder`][torchspark.training.NullRecorder]).
        progress: called with a [`ProgressUpdate`][torchspark.training.ProgressUpdate] every ``progress_every`` minibatches (None = off).
        progress_every: how often to report; each report is one small message to the driver.
        report_score: called on rank 0 with a [`ScoreReport`][torchspark.training.ScoreReport] after every averaging round / sharing epoch
            (None = off). Set it on every rank or on none: with it, gradient sharing runs one extra small
            all-reduce per epoch, which all ranks must join.
    """

    recorder: PhaseRecorder = field(default_factory=NullRecorder)
    progress: Callable[[ProgressUpdate], None] | None = None
    progress_every: int = 10
    report_score: Callable[[ScoreReport], None] | None = None
    #: called with the worker's traceback text when it fails (e.g. sent to the driver's progress server)
    report_error: Callable[[str], None] | None = None
    #: releases what the hooks hold (progress connection); called once when the worker ends
    close: Callable[[], None] | None = None
    #: called by a loop at every consistent cut inside an epoch (after an averaging round / an applied exchange)
    #: with ``(outcome so far, algorithm tensors, algorithm record)``; the worker wires it to the fit's checkpoint
    #: writer (None: the fit does not checkpoint). Same calls on every rank.
    checkpoint: Callable[[Any, dict[str, Any], dict[str, Any]], None] | None = None
