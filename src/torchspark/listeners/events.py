"""What a training listener hears: the start of a fit, its progress, each finished epoch and the end.

A :class:`TrainingListener` is called on the driver; the events come from the fit's progress channel (the
workers' :class:`~torchspark.training.hooks.ProgressUpdate` and :class:`~torchspark.training.hooks.ScoreReport`
messages), summed over workers by :class:`~torchspark.listeners.hub.TrainingEvents`. Override only the methods
you need; the others do nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FitStarted", "IterationEvent", "EpochEvent", "FitEnded", "TrainingListener"]


@dataclass(frozen=True)
class FitStarted:
    """A fit begins.

    ``master`` is the training master's ``to_dict()`` (JSON-ready, with its ``type``); ``network`` describes the
    network (module class, parameter count, updater, loss, seed...: :func:`~torchspark.listeners.hub.network_params`).
    """

    runner: str
    epochs: int
    num_workers: int | None
    start_epoch: int
    start_iteration: int
    master: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IterationEvent:
    """Progress of the whole fit, after one worker's report.

    ``iteration`` and ``epoch`` are the network's counters (they continue across fits); ``iteration`` counts
    synchronous steps (the furthest worker's minibatches), so it only advances when a worker reports (every
    ``progress_every`` minibatches). Sharing traffic is summed over workers and 0 for parameter averaging.
    """

    iteration: int
    epoch: int
    #: mean of every worker's latest minibatch loss
    score: float
    #: examples trained so far in this fit, all workers
    examples: int
    examples_per_second: float
    bytes_sent: int
    dense_bytes: int
    #: the worker whose report this is
    rank: int


@dataclass(frozen=True)
class EpochEvent:
    """One epoch finished on every worker (or the fit ended).

    ``score`` is the epoch's score every worker agrees on when the workers report scores (gradient sharing: the
    example-weighted mean loss of the epoch; averaging: the mean over the epoch's rounds), else the mean of the
    workers' last reported minibatch loss. ``seconds`` runs from the previous epoch's end (or the fit's start).
    """

    epoch: int
    score: float
    examples: int
    seconds: float
    examples_per_second: float
    bytes_sent: int
    dense_bytes: int


@dataclass(frozen=True)
class FitEnded:
    """A fit ended. ``network`` is the driver's network (trained, or as the failed fit left it); ``stats`` the
    fit's :class:`~torchspark.stats.TrainingStats` (None when not collected); ``error`` what failed, if anything."""

    network: Any
    score: float
    seconds: float
    examples: int
    stats: Any = None
    error: BaseException | None = None


class TrainingListener:
    """Base class of driver-side training listeners (MLflow, TensorBoard, your own).

    Methods run on a driver thread (the progress server's, or the driver's own); keep them quick: a slow listener
    delays the live progress of the fit (never the training itself). A listener that raises is logged and ignored.
    """

    def on_fit_start(self, event: FitStarted) -> None:
        """Called once before the workers start."""

    def on_iteration(self, event: IterationEvent) -> None:
        """Called for every progress report a worker sends."""

    def on_epoch_end(self, event: EpochEvent) -> None:
        """Called once per epoch, in order, when every worker has moved past it (or at the fit's end)."""

    def on_fit_end(self, event: FitEnded) -> None:
        """Called once after the fit, also when it failed (``event.error``)."""
