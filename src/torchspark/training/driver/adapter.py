"""What every adapter (``SparkNetwork``, ``ParallelWrapper``) does around
`run_fit`, written once: its listeners, the checks before a fit, the fit itself
and what the last fit left.

An adapter turns the user's data into the workers' shares and picks a runner; `FitAdapter` does the rest:

  1. keeps the progress listeners (plain callables) and the training listeners (``TrainingListener`` objects);
  2. before a fit, `check_first_batch` runs the network on a few examples of the first minibatch, so a wrong
     shape or a NaN fails on the driver before any worker starts;
  3. `FitAdapter.fit` builds the task (workers report their agreed scores when a training listener listens),
     wires the training listeners to the fit's events, runs `run_fit`;
  4. keeps the outcome: `FitAdapter.score`, `FitAdapter.results`, `FitAdapter.stats`.
``training`` never imports ``listeners``: the adapter passes the listener class and the event source it uses
(``TrainingListener``, ``TrainingEvents``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torchspark.data.loaders import example_shapes, loader_name
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network
from torchspark.stats import StatsCollector, TrainingStats
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.elastic import Elastic
from torchspark.training.driver.fit import FitEvents, FitOutcome, build_task, run_fit
from torchspark.training.driver.runner import Runner
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.task import WorkerResult
from torchspark.training.worker.loop import load_item
from torchspark.validation import check_int

__all__ = ["FitAdapter", "OpenEvents", "check_runner", "check_first_batch", "elastic_plan"]


class OpenEvents(Protocol):
    """Builds one fit's `FitEvents` for its training listeners (the
    signature of [`torchspark.listeners.TrainingEvents`][torchspark.listeners.TrainingEvents])."""

    def __call__(
        self, listeners: Sequence[Any], *, runner: str, master: Any, network: Any, epochs: int, num_workers: int
    ) -> FitEvents: ...


def check_runner(runner: Any) -> None:
    """Refuse a ``runner=`` that is not a [`Runner`][torchspark.training.Runner] (None: the adapter's
    own).

    Raises:
        ConfigError: ``runner`` has no ``run`` method, e.g. ``runner="local"``.
    """
    if runner is not None and not callable(getattr(runner, "run", None)):
        raise ConfigError(f"runner must have a run(task, data, context) method (a Runner), got {type(runner).__name__}")


def check_first_batch(network: Network, item: Any) -> None:
    """Fail fast on the driver: run ``network`` on a few examples of the first minibatch ``item`` (a DataSet, a
    serialized batch, a batch-file path or a file slice).

    Raises:
        DataError: non-finite features, or data the network cannot take (the message of ``network.score``; for
            the file of a user ``loader``, naming the loader, the file and the shape it returned).
    """
    batch = load_item(os.fspath(item) if isinstance(item, os.PathLike) else item)
    sample = batch.slice(0, min(4, len(batch)))
    sample.check_finite("training features")
    loader = getattr(item, "loader", None)
    try:
        network.score(sample)
    except DataError as e:
        if loader is None:
            raise
        raise DataError(
            f"the loader {loader_name(loader)} returned {example_shapes(sample)} per example for "
            f"{item.slices[0][0]}, which the network does not take: {e}"
        ) from e


class FitAdapter:
    """The adapter's side of its fits: listeners in, outcome out (steps 1, 3 and 4 of the module docstring).

    Args:
        name: the adapter's name in the listeners' ``FitStarted`` (``"SparkNetwork"``, ``"ParallelWrapper"``).
        listener_type: the class training listeners must be (``torchspark.listeners.TrainingListener``).
        open_events: builds a fit's events for them (``torchspark.listeners.TrainingEvents``).

    Example::

        fits = FitAdapter("ParallelWrapper", TrainingListener, TrainingEvents)
        fits.fit(network, master, runner, shares, epochs=2, num_workers=2, collect_stats=False,
                 recorder=StatsCollector(DRIVER_ID, enabled=False), description="fit: 2 workers")
        fits.score  # the last fit's score
    """

    def __init__(self, name: str, listener_type: type, open_events: OpenEvents) -> None:
        self.name = name
        self._listener_type = listener_type
        self._open_events = open_events
        self.progress_listeners: list[Callable[[ProgressUpdate], None]] = []
        self.training_listeners: list[Any] = []
        #: the last fit's score: the mean over workers of their last minibatch loss (NaN before any fit)
        self.score = math.nan
        #: every worker's result of the last fit, by rank
        self.results: list[WorkerResult] = []
        #: timings of the last fit (None unless collected)
        self.stats: TrainingStats | None = None

    def add_progress_listener(self, listener: Callable[[ProgressUpdate], None]) -> None:
        """Call ``listener(update)`` (on a driver thread) for every progress report of every later fit."""
        self.progress_listeners.append(listener)

    def add_training_listener(self, listener: Any) -> None:
        """Tell ``listener`` about every later fit: its start, progress, epochs and end.

        Raises:
            ConfigError: ``listener`` is not a ``TrainingListener`` (a plain callable goes to
                `add_progress_listener`).
        """
        if not isinstance(listener, self._listener_type):
            raise ConfigError(
                f"add_training_listener takes a torchspark.listeners.TrainingListener, got "
                f"{type(listener).__name__}; use add_progress_listener for a plain callable"
            )
        self.training_listeners.append(listener)

    def fit(
        self,
        network: Network,
        master: TrainingMaster,
        runner: Runner,
        data: Any,
        *,
        epochs: int,
        num_workers: int,
        collect_stats: bool,
        recorder: StatsCollector,
        description: str,
        run_id: str | None = None,
        restart_epoch: bool = False,
        progress: bool | None = None,
        report_scores: bool = False,
        score_listeners: Sequence[Callable[[ScoreReport], None]] = (),
        total_examples: int | None = None,
        data_for: Callable[[int], Any] | None = None,
        capacity: Callable[[], int | None] | None = None,
    ) -> FitOutcome:
        """Train ``network`` in place on ``data`` through ``runner`` (`run_fit`) and keep the outcome.

        Args:
            network, master, runner, data: the fit (``data`` in the form ``runner`` takes).
            epochs, num_workers: the fit's epochs and workers (also told to the training listeners).
            collect_stats, recorder: stats collection and the driver's collector.
            description: names the fit in job descriptions, messages and the progress bar.
            run_id: the checkpointed run the fit continues or starts.
            restart_epoch: on resuming ``run_id``, a rank whose data no longer matches the checkpoint's position
                trains the interrupted epoch again from its start instead of refusing.
            progress: draw a progress bar (None: only on a terminal).
            report_scores: workers report their agreed score even without a training listener.
            score_listeners: called with each agreed score.
            total_examples: examples of the whole fit when known (the bar's total).
            data_for: ``data`` re-dealt over ``n`` workers (elastic recovery, the master's ``min_workers``); None:
                this route cannot re-deal its data.
            capacity: how many workers the runner can start now; None: the runner's own ``capacity()`` method
                when it has one (`SparkBarrierRunner`: free task slots), else
                unknown.
        Raises:
            ConfigError: ``min_workers`` above ``num_workers``, or below it on a route that cannot re-deal its data.
            WorkerError: as `run_fit`; the outcome of the previous fit is kept then.
        """
        task = build_task(
            network,
            master,
            epochs,
            collect_stats,
            recorder,
            report_scores=report_scores or bool(self.training_listeners),
            run_id=run_id,
            restart_epoch=restart_epoch,
        )
        events = (
            self._open_events(
                self.training_listeners,
                runner=self.name,
                master=master,
                network=network,
                epochs=epochs,
                num_workers=num_workers,
            )
            if self.training_listeners
            else None
        )
        capacity = capacity if capacity is not None else getattr(runner, "capacity", None)
        elastic = elastic_plan(self.name, master, num_workers, data_for, capacity)
        outcome = run_fit(
            network,
            task,
            runner,
            data,
            recorder=recorder,
            description=description,
            listeners=self.progress_listeners,
            score_listeners=score_listeners,
            progress=progress,
            events=events,
            max_failures=master.max_failures,
            total_examples=total_examples,
            elastic=elastic,
            stall_timeout_s=master.stall_timeout_s,
        )
        self.score, self.results, self.stats = outcome.score, outcome.results, outcome.stats
        return outcome


def elastic_plan(
    name: str,
    master: TrainingMaster,
    num_workers: int,
    data_for: Callable[[int], Any] | None,
    capacity: Callable[[], int | None] | None = None,
) -> Elastic | None:
    """The fit's [`Elastic`][torchspark.training.driver.elastic.Elastic] when the master's ``min_workers`` is below the
    fit's ``num_workers`` (None otherwise: every attempt runs every worker); the master's ``regrow`` resolved (None:
    ``"epoch"`` with a ``checkpoint_directory``, else ``"attempt"``).

    Raises:
        ConfigError: ``min_workers`` above ``num_workers``; or below it while ``data_for`` is None (a route whose
            data cannot be re-dealt over fewer workers: a one-shot stream, the rounds or Connect route).
    """
    wanted = master.min_workers
    if wanted is None:
        return None
    check_int("min_workers", wanted, 1, num_workers, owner=name, fix=f"this fit has {num_workers} workers")
    if wanted == num_workers:
        return None
    if data_for is None:
        raise ConfigError(
            f"{name}: min_workers={wanted} (elastic recovery) needs data that can be re-dealt over fewer workers, "
            "which this route cannot do (a one-shot stream, averaging_via='spark', a Spark Connect session or "
            "shuffle_scope='global' on Spark); leave min_workers=None, or pass a DataSet, batch files or an RDD"
        )
    regrow = master.regrow or ("epoch" if master.checkpoint_directory is not None else "attempt")
    return Elastic(num_workers, wanted, data_for, capacity, regrow)
