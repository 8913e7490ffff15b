"""What a training listener hears: the start of a fit, its progress, each finished epoch and the end.

A [`TrainingListener`][torchspark.listeners.TrainingListener] is called on the driver; the events come from the fit's progress channel (the
workers' [`ProgressUpdate`][torchspark.training.ProgressUpdate] and [`ScoreReport`][torchspark.training.ScoreReport]
messages), summed over workers by [`TrainingEvents`][torchspark.listeners.TrainingEvents]. Override only the methods
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
    network (module class, parameter count, updater, loss, seed...: [`network_params`][torchspark.listeners.network_params]).
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
    fit's [`TrainingStats`][torchspark.stats.TrainingStats] (None when not collected); ``error`` what failed, if anything."""

    network: Any
    score: float
    seconds: float
    examples: int
    stats: Any = None
    error: BaseException | None = None


class TrainingListener:
    """Base class of driver-side training listeners (MLflow, TensorBoard, your own).

    Each listener's methods run in order on a driver thread of its own, never on the thread that reads the workers'
    heartbeats: a slow listener (a tracking server that stopped answering) delays only its own events, never the
    training or the detection of a lost worker. A listener far behind has progress events dropped (logged); one
    that raises is logged and ignored.

    Attributes:
        end_timeout_s: how long the end of a fit waits for this listener to finish its queued events
            (``on_fit_end`` included) before ``fit()`` returns without it (logged; what it had not written is
            lost). Raise it for a listener that uploads large artifacts at the end; override it in a subclass or
            set it on the instance::

                listener = MyListener()
                listener.end_timeout_s = 300.0

        hung_end_timeout_s: how long the end waits instead when the listener was seen hung: it is still in a call
            that began before the end and has run for `HUNG_CALL_S` seconds or
            more (an MLflow server that stopped answering: MLflow retries each request for minutes), or in any
            call begun before the end after the previous fit's end gave up on it. Its queued
            events then end behind that call, and waiting ``end_timeout_s`` would only delay ``fit()``. The
            trade-off: a server that merely paused for that long and would have recovered loses the fit's last
            metrics, model and status (the listener's thread, a daemon, may still write them while the process
            runs on). Set it to ``end_timeout_s`` or more to always wait the full time.
    """

    end_timeout_s: float = 60.0
    hung_end_timeout_s: float = 10.0

    def on_fit_called(self, event: FitStarted) -> None:
        """Called once on the thread that called ``fit()``, just before [`on_fit_start`][torchspark.listeners.TrainingListener.on_fit_start] is queued: read the
        caller's thread-local state here (MLflow's active run). Keep it instant (no I/O): it runs on the fit's
        own thread; an exception is logged and ignored."""

    def on_fit_start(self, event: FitStarted) -> None:
        """Called once before the workers start."""

    def on_iteration(self, event: IterationEvent) -> None:
        """Called for every progress report a worker sends."""

    def on_epoch_end(self, event: EpochEvent) -> None:
        """Called once per epoch, in order, when every worker has moved past it (or at the fit's end)."""

    def on_fit_end(self, event: FitEnded) -> None:
        """Called once after the fit, also when it failed (``event.error``)."""
