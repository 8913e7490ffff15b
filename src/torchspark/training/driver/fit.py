"""One fit's life cycle on the driver, the same for every way of running workers.

``SparkNetwork`` and ``ParallelWrapper`` are thin adapters: they turn the user's data into the workers' shares and
pick a [`Runner`][torchspark.training.Runner]; then `run_fit`

  1. builds the [`WorkerTask`][torchspark.training.WorkerTask] from the network and the training master (`build_task`);
  2. opens the fit's progress side: the progress bar, the caller's listeners, and (when the runner asks for it) the
     progress server workers stream to (`FitContext`);
  3. runs the workers through the runner (which times the driver's ``fit`` phase: the rounds route has one per
     round, between its ``broadcast`` and ``aggregation`` phases); the runner maps a worker's failure to
     [`WorkerError`][torchspark.errors.WorkerError] (the root cause, with its traceback), and a lost worker, process,
     executor or hung peer to [`WorkerLost`][torchspark.errors.WorkerLost];
  3a. on ``WorkerLost``, while ``max_failures`` allows (`torchspark.training.driver.recovery.decide`), records the
     failure and runs the workers again as a new *attempt* (new processes / barrier stage, a new progress server
     and token, rendezvous keys named by the attempt) from the newest state the driver can reach: the fit's newest
     checkpoint, else the task the fit started with (`restart_task`);
  4. always closes the bar and each attempt's progress server, reading what finished workers sent last;
  5. merges the results into the driver's network (rank 0's parameters, updater state and buffers; the iteration
     and epoch counters advance by the fit's totals, whatever a runner did to them in between);
  6. builds the fit's [`TrainingStats`][torchspark.stats.TrainingStats] when stats are collected.
A change to "what happens when a worker dies" (retry, checkpoint) belongs here, once for every route. Before the
workers start, `resume_task` turns the task into the one that continues the
run's newest checkpoint, when the fit checkpoints and its run has one (``fit(..., run_id=...)``).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from torchspark.errors import WorkerLost
from torchspark.nn import Network, NetworkBlueprint
from torchspark.stats import StatsCollector, TrainingStats
from torchspark.training.checkpoint import plan_for
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.context import FitContext
from torchspark.training.driver.elastic import Elastic, WorldChange, WorldTracker
from torchspark.training.driver.recovery import (
    Decision,
    FailureRecord,
    decide,
    exhausted_error,
    hang_error,
    record_failure,
    repeated_hang,
)
from torchspark.training.driver.resume import open_run, resume_task
from torchspark.training.driver.runner import InProcessRunner, Runner
from torchspark.training.driver.stats import build_training_stats
from torchspark.training.hooks import PhaseRecorder, ProgressUpdate, ScoreReport
from torchspark.training.progress import ProgressBar
from torchspark.training.task import WorkerResult, WorkerTask, merge_results

__all__ = ["FitContext", "FitEvents", "FitOutcome", "build_task", "run_fit", "restart_task"]

log = logging.getLogger(__name__)

#: how long a finished fit waits for the workers' last progress messages (they have ended: it returns at once)
DRAIN_S = 10.0


@dataclass
class FitOutcome:
    """What a fit hands back to the adapter: results by rank, the fit's score (``score``), its stats."""

    results: list[WorkerResult]
    score: float
    stats: TrainingStats | None
    #: the failed attempts the fit recovered from (empty when nothing failed)
    failures: list[FailureRecord] | None = None
    #: each change of the world size (elastic recovery: ``min_workers`` on the master)
    world_changes: list[WorldChange] = field(default_factory=list)


class FitEvents(Protocol):
    """What `run_fit` tells a fit's training listeners (implemented by
    [`torchspark.listeners.TrainingEvents`][torchspark.listeners.TrainingEvents], which the adapters pass in: ``training`` never imports
    ``listeners``)."""

    def start(self) -> None:
        """The fit starts (before any worker)."""
        ...

    def on_progress(self, update: ProgressUpdate) -> None:
        """A worker's progress report (on a driver thread)."""
        ...

    def on_score(self, report: ScoreReport) -> None:
        """A score the workers agreed on (``task.report_scores``)."""
        ...

    def end(self, network: Network, score: float, stats: Any = None, error: BaseException | None = None) -> None:
        """The fit ended: with its score and stats, or with the ``error`` it raises."""
        ...


def build_task(
    network: Network,
    master: TrainingMaster,
    epochs: int,
    collect_stats: bool,
    recorder: PhaseRecorder,
    *,
    report_scores: bool = False,
    run_id: str | None = None,
    restart_epoch: bool = False,
) -> WorkerTask:
    """Step 1: the task every worker receives (timed as the driver's ``broadcast`` phase: the blueprint is the
    network's weights).

    With a ``checkpoint_directory`` on the master the task carries the fit's
    `CheckpointPlan`: run ``run_id`` (a fresh id when None);
    ``restart_epoch``: a resumed rank whose data no longer matches its checkpoint's position trains the interrupted
    epoch again from its start instead of refusing.

    Raises:
        ConfigError: ``run_id`` without a ``checkpoint_directory``, or a malformed ``run_id``; ``restart_epoch``
            without a ``run_id``.
    """
    plan = plan_for(master, run_id, network.iteration, network.epoch, restart_epoch)
    with recorder.phase("broadcast"):
        return WorkerTask(
            mode=master.mode,  # type: ignore[attr-defined]
            settings=master.algorithm_settings(),
            blueprint=NetworkBlueprint.of(network).to_bytes(),
            epochs=epochs,
            prefetch=master.worker_prefetch_num_batches,
            pin_memory=master.pin_memory,
            data_timeout_s=master.data_timeout_s,
            collect_stats=collect_stats,
            flush_denormal=master.flush_denormal,
            report_scores=report_scores,
            checkpoint=plan,
            first_epoch=network.epoch,
            shuffle_seed=master.rng_seed,
            accumulate_steps=master.accumulate_steps,
        )


def restart_task(task: WorkerTask, attempt: int) -> tuple[WorkerTask, dict[str, Any]]:
    """The task attempt ``attempt`` runs and where it restarts from (``summary()["recovered_from"]``).

    The newest state the driver can reach: the fit's newest complete checkpoint
    (`resume_task`; the lost work is then at most one ``checkpoint_every``
    interval), else the state the fit started with (the original task: all of the failed attempt's work is lost).
    ``recovered_from`` says which: ``checkpoint`` (its path, or None), ``epoch`` (epochs of the fit done there) and
    ``iteration`` (the fit's iterations done there).
    """
    resumed, point = resume_task(task)
    resumed = replace(resumed, attempt=attempt)
    if point is None:
        return resumed, {"attempt": attempt, "epoch": 0, "iteration": 0, "checkpoint": None}
    return resumed, {
        "attempt": attempt,
        "epoch": point.fit_epoch,
        "iteration": point.iteration - point.fit_start_iteration,
        "checkpoint": point.path,
    }


def run_fit(
    network: Network,
    task: WorkerTask,
    runner: Runner,
    data: Any,
    *,
    recorder: StatsCollector,
    description: str,
    listeners: Sequence[Callable[[ProgressUpdate], None]] = (),
    score_listeners: Sequence[Callable[[ScoreReport], None]] = (),
    progress: bool | None = None,
    events: FitEvents | None = None,
    max_failures: int = 0,
    total_examples: int | None = None,
    elastic: Elastic | None = None,
    stall_timeout_s: float | None = None,
) -> FitOutcome:
    """Steps 2-6 of the module docstring: run ``task`` on ``data`` through ``runner`` and update ``network``.

    Args:
        network: the driver's network, updated in place.
        task: from `build_task`.
        runner: how workers run (any [`Runner`][torchspark.training.Runner]).
        data: the workers' shares in the form ``runner`` takes.
        recorder: the driver's stats collector (its phases become the ``driver`` row of the stats).
        description: names the fit in Spark's UI and in messages.
        listeners: the caller's progress listeners.
        score_listeners: called with the scores workers report (``task.report_scores``).
        progress: draw a progress bar (None: only when stderr is a terminal).
        events: the fit's training listeners (`FitEvents`, e.g. [`TrainingEvents`][torchspark.listeners.TrainingEvents]):
            fed by the progress channel, told when the fit starts and ends (also when it fails).
        max_failures: lost workers the fit recovers from (the master's ``max_failures``); 0 = none.
        total_examples: examples the whole fit trains (all epochs), when known: the bar then shows the total, the
            percentage and the time left.
        elastic: lets a recovery attempt run with fewer workers (down to ``min_workers``) and grow back
            ([`elastic`][torchspark.training.driver.elastic]); None: every attempt runs ``data``'s workers.
        stall_timeout_s: the progress watchdog (the master's ``stall_timeout_s``): an attempt in which no worker
            reports a new step for this long fails as a hang ([`stall`][torchspark.training.driver.stall]); None: off.
    Raises:
        ConfigError: a checkpointing fit whose storage is unusable or whose run another live fit holds
            (`open_run`), found before any worker starts.
        WorkerError: a worker failed (the user's error, never retried), or ``max_failures`` was exhausted (then a
            [`WorkerLost`][torchspark.errors.WorkerLost] listing every failure); the network keeps what it had (the rounds route: the last
            completed round).
    """
    lock = open_run(task.checkpoint, isinstance(runner, InProcessRunner))
    try:
        return _run_fit(
            network,
            task,
            runner,
            data,
            recorder=recorder,
            description=description,
            listeners=listeners,
            score_listeners=score_listeners,
            progress=progress,
            events=events,
            max_failures=max_failures,
            total_examples=total_examples,
            world=WorldTracker(elastic, data),
            stall_timeout_s=stall_timeout_s,
        )
    finally:
        if lock is not None:
            lock.release()


def _run_fit(
    network: Network,
    task: WorkerTask,
    runner: Runner,
    data: Any,
    *,
    recorder: StatsCollector,
    description: str,
    listeners: Sequence[Callable[[ProgressUpdate], None]],
    score_listeners: Sequence[Callable[[ScoreReport], None]],
    progress: bool | None,
    events: FitEvents | None,
    max_failures: int,
    total_examples: int | None,
    world: WorldTracker,
    stall_timeout_s: float | None,
) -> FitOutcome:
    bar = ProgressBar(total_examples=total_examples, desc=f"fit x{task.epochs}", enabled=progress)
    if events is not None:
        listeners, score_listeners = [*listeners, events.on_progress], [*score_listeners, events.on_score]
        events.start()
    start = (network.iteration, network.epoch)
    task, point = resume_task(task)  # a run_id with checkpoints continues from the newest one
    if task.checkpoint is not None:
        log.info(
            "%s: checkpoints of run %r go to %s; fit(..., run_id=%r) continues it",
            description,
            task.checkpoint.run_id,
            task.checkpoint.directory,
            task.checkpoint.run_id,
        )
    if point is not None:  # the counters as they were when the run's fit started (maybe in another process)
        start = (point.fit_start_iteration, point.fit_start_epoch)
    start_state = _network_state(network)
    failures: list[FailureRecord] = []
    counted = 0  # the failures that count against max_failures (not a growth that did not hold: elastic.py)
    recovered_from: dict[str, Any] | None = None
    results: list[WorkerResult] | None = None
    try:
        try:
            attempt = 0
            while results is None:
                attempt_task, restart = (task, None) if attempt == 0 else restart_task(task, attempt)
                attempt_task = world.bounded(attempt_task)  # a smaller world that may grow: to the epoch's end
                context = FitContext(
                    network,
                    recorder,
                    description,
                    [*listeners, bar.update],
                    score_listeners,
                    attempt=attempt,
                    stall_timeout_s=stall_timeout_s,
                )
                started = time.time()
                try:
                    results = runner.run(attempt_task, world.data, context)
                    recovered_from = restart
                except WorkerLost as error:
                    failures.append(
                        record_failure(
                            error, attempt, started, context.reached(), context.worker_pids(), context.suspect()
                        )
                    )
                    counted = _retry_or_raise(error, failures, counted, max_failures, world.counts_failure(attempt + 1))
                    _restore(network, start, start_state)  # runners that train the driver's network in place
                    world.after_failure(failures[-1].rank, attempt + 1, task)
                    attempt += 1
                    continue
                finally:
                    context.close(drain_s=DRAIN_S if results is not None else 0.0, succeeded=results is not None)
                if attempt_task.epochs < task.epochs:  # a bounded attempt ended cleanly at its epoch boundary
                    results = None
                    _restore(network, start, start_state)
                    world.at_boundary(attempt + 1, task)
                    attempt += 1
        finally:
            bar.close()
    except BaseException as e:
        if events is not None:
            events.end(network, float("nan"), error=e)
        raise
    with recorder.phase("aggregation"):
        network.iteration, network.epoch = start
        score = merge_results(network, results)
    network.epoch += task.epochs
    diverged = network.extra_config.get("sharing.divergence")
    if diverged:  # a worker only warned (on_divergence="warn"): say it where the user is
        what = "training diverged" if "diverged" in diverged else "gradient sharing skipped steps"
        warnings.warn(f"{what}: {diverged}", RuntimeWarning, stacklevel=3)
    stats = build_training_stats(recorder, results, task.epochs, network.extra_config) if task.collect_stats else None
    if stats is not None:
        stats.set_summary("failures", [f.to_dict() for f in failures])
        stats.set_summary("recovered_from", recovered_from)
        stats.set_summary("world_changes", [c.to_dict() for c in world.changes])
    if events is not None:
        events.end(network, score, stats)
    return FitOutcome(results, score, stats, failures, world.changes)


def _retry_or_raise(
    error: WorkerLost, failures: list[FailureRecord], counted: int, max_failures: int, counts: int
) -> int:
    """After the lost attempt ``failures[-1]``: raise when the fit ends there (the same hang twice, or
    ``max_failures`` exhausted), else return the failures counted so far (``counts``: 0 for a growth at an epoch
    boundary that did not hold, [`elastic`][torchspark.training.driver.elastic])."""
    if repeated_hang(failures):
        raise hang_error(failures, error) from error
    if decide(error, counted + counts, max_failures) is Decision.EXHAUSTED:
        raise exhausted_error(failures, max_failures, error) from error
    log.warning(
        "%s; recovering: attempt %d (failure %d of at most %d)",
        failures[-1].describe(),
        failures[-1].attempt + 1,
        counted + counts,
        max_failures,
    )
    return counted + counts


def _network_state(network: Network) -> tuple[Any, Any, Any, Any]:
    return (
        network.params().detach().clone(),
        network.updater_state().detach().clone(),
        {k: v.clone() for k, v in network.buffer_state().items()},
        network.amp.state_tensors(),
    )


def _restore(network: Network, start: tuple[int, int], state: tuple[Any, Any, Any, Any]) -> None:
    params, updater, buffers, scaler = state
    network.set_params(params)
    network.set_updater_state(updater)
    network.load_buffer_state(buffers)
    network.amp.load_state_tensors(scaler)
    network.iteration, network.epoch = start
