"""One fit's life cycle on the driver, the same for every way of running workers.

``SparkNetwork`` and ``ParallelWrapper`` are thin adapters: they turn the user's data into the workers' shares and
pick a :class:`~torchspark.training.runner.Runner`; then :func:`run_fit`

  1. builds the :class:`WorkerTask` from the network and the training master (:func:`build_task`);
  2. opens the fit's progress side: the progress bar, the caller's listeners, and (when the runner asks for it) the
     progress server workers stream to (:class:`FitContext`);
  3. runs the workers through the runner (which times the driver's ``fit`` phase: the rounds route has one per
     round, between its ``broadcast`` and ``aggregation`` phases); the runner maps a worker's failure to
     :class:`~torchspark.errors.WorkerError` (the root cause, with its traceback);
  4. always closes the bar and the progress server, reading what finished workers sent last;
  5. merges the results into the driver's network (rank 0's parameters, updater state and buffers; the iteration
     and epoch counters advance by the fit's totals, whatever a runner did to them in between);
  6. builds the fit's :class:`~torchspark.stats.TrainingStats` when stats are collected.
A change to "what happens when a worker dies" (retry, checkpoint) belongs here, once for every route.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torchspark.nn import Network, NetworkBlueprint
from torchspark.stats import StatsCollector, TrainingStats
from torchspark.training.hooks import PhaseRecorder, ProgressUpdate, ScoreReport
from torchspark.training.masters import TrainingMaster
from torchspark.training.ports import listen_in_range
from torchspark.training.progress import ProgressBar, ProgressEndpoint, ProgressServer
from torchspark.training.reporting import build_training_stats
from torchspark.training.runner import Runner
from torchspark.training.worker import WorkerResult, WorkerTask, merge_results

__all__ = ["FitContext", "FitOutcome", "build_task", "run_fit"]

log = logging.getLogger(__name__)

#: how long a finished fit waits for the workers' last progress messages (they have ended: it returns at once)
DRAIN_S = 10.0


@dataclass
class FitOutcome:
    """What a fit hands back to the adapter: results by rank, the fit's score (``get_score()``), its stats."""

    results: list[WorkerResult]
    score: float
    stats: TrainingStats | None


class FitContext:
    """The driver's side of one fit, offered to the runner (the :class:`~torchspark.training.runner.RunContext`).

    The progress server opens only when a runner asks for its address: the rounds route reports progress from the
    driver (:meth:`notify`) and needs no port.

    Args:
        network: the driver's network.
        recorder: the driver's stats recorder.
        description: names the fit in job descriptions.
        listeners: progress listeners (the caller's and the bar's), called on driver threads.
        score_listeners: called with each :class:`ScoreReport` workers send.
    """

    def __init__(self, network: Network, recorder: PhaseRecorder, description: str,
                 listeners: Sequence[Callable[[ProgressUpdate], None]] = (),
                 score_listeners: Sequence[Callable[[ScoreReport], None]] = ()) -> None:
        self.network = network
        self.recorder = recorder
        self.description = description
        self._listeners = list(listeners)
        self._score_listeners = list(score_listeners)
        self._server: ProgressServer | None = None

    def progress_address(self, host: str = "127.0.0.1", advertise_host: str | None = None,
                         port_range: tuple[int, int] | None = None) -> ProgressEndpoint:
        """Start the progress server on ``host`` (once per fit; on a port inside ``port_range`` when set, the mesh
        option) and return the address workers dial."""
        if self._server is None:
            self._server = listen_in_range(
                lambda port: ProgressServer(host=host, port=port, advertise_host=advertise_host,
                                            listeners=self._listeners, score_listeners=self._score_listeners).start(),
                port_range, "the driver's progress server")
        return self._server.endpoint

    def reported_errors(self) -> list[tuple[int, str]]:
        return self._server.errors() if self._server is not None else []

    def notify(self, update: ProgressUpdate) -> None:
        for fn in self._listeners:
            try:
                fn(update)
            except Exception:  # a broken display must never stop training
                log.warning("a progress listener failed", exc_info=True)

    def close(self, drain_s: float = 0.0) -> None:
        """Close the progress server; ``drain_s`` > 0 first reads what workers that have ended sent last."""
        if self._server is not None:
            self._server.close(drain_s=drain_s)


def build_task(network: Network, master: TrainingMaster, epochs: int, collect_stats: bool,
               recorder: PhaseRecorder, *, report_scores: bool = False) -> WorkerTask:
    """Step 1: the task every worker receives (timed as the driver's ``broadcast`` phase: the blueprint is the
    network's weights)."""
    with recorder.phase("broadcast"):
        return WorkerTask(
            mode=master.mode,  # type: ignore[attr-defined]
            settings=master.algorithm_settings(),
            blueprint=NetworkBlueprint.of(network).to_bytes(),
            epochs=epochs,
            prefetch=master.worker_prefetch_num_batches,
            data_timeout_s=master.data_timeout_s,
            collect_stats=collect_stats,
            flush_denormal=master.flush_denormal,
            report_scores=report_scores,
        )


def run_fit(network: Network, task: WorkerTask, runner: Runner, data: Any, *, recorder: StatsCollector,
            description: str, listeners: Sequence[Callable[[ProgressUpdate], None]] = (),
            score_listeners: Sequence[Callable[[ScoreReport], None]] = (),
            progress: bool | None = None, total_examples: int | None = None) -> FitOutcome:
    """Steps 2-6 of the module docstring: run ``task`` on ``data`` through ``runner`` and update ``network``.

    Args:
        network: the driver's network, updated in place.
        task: from :func:`build_task`.
        runner: how workers run (any :class:`~torchspark.training.runner.Runner`).
        data: the workers' shares in the form ``runner`` takes.
        recorder: the driver's stats collector (its phases become the ``driver`` row of the stats).
        description: names the fit in Spark's UI and in messages.
        listeners: the caller's progress listeners.
        score_listeners: called with the scores workers report (``task.report_scores``).
        progress: draw a progress bar (None: only when stderr is a terminal).
        total_examples: examples the whole fit trains (all epochs), when known: the bar then shows the total, the
            percentage and the time left.
    Raises:
        WorkerError: a worker failed; the network keeps what it had (the rounds route: the last completed round).
    """
    bar = ProgressBar(total_examples=total_examples, desc=f"fit x{task.epochs}", enabled=progress)
    context = FitContext(network, recorder, description, [*listeners, bar.update], score_listeners)
    start = (network.iteration, network.epoch)
    results: list[WorkerResult] | None = None
    try:
        results = runner.run(task, data, context)
    finally:
        bar.close()
        context.close(drain_s=DRAIN_S if results is not None else 0.0)
    with recorder.phase("aggregation"):
        network.iteration, network.epoch = start
        score = merge_results(network, results)
    network.epoch += task.epochs
    diverged = network.extra_config.get("sharing.divergence")
    if diverged:  # a worker only warned (on_divergence="warn"): say it where the user is
        warnings.warn(f"training diverged: {diverged}", RuntimeWarning, stacklevel=3)
    stats = build_training_stats(recorder, results, task.epochs, network.extra_config) if task.collect_stats else None
    return FitOutcome(results, score, stats)
