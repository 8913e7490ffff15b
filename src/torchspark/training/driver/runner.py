"""Runners start N workers (each runs the one worker body, `torchspark.training.worker.body.worker_main`) and
collect their results: the one protocol every route implements.

The driver (`torchspark.training.driver`) hands a runner the [`WorkerTask`][torchspark.training.WorkerTask], the workers' data and a
`RunContext` (the fit's progress channel, stats and network); the runner starts the workers, supervises them
and returns their results by rank. Implementations:

* [`InProcessRunner`][torchspark.training.InProcessRunner] (here): threads of this process with an in-memory communicator; any adapter's data
  (``SparkNetwork(..., runner=InProcessRunner())`` too), so tests check a master's logic without processes;
* [`LocalProcessRunner`][torchspark.parallel.LocalProcessRunner]: worker processes on this machine (``ParallelWrapper``);
* `SparkBarrierRunner`: one Spark barrier stage whose tasks all-reduce;
* `SparkRoundsRunner`: one Spark job per averaging round (``averaging_via="spark"``).
* `ConnectBarrierRunner`: one barrier ``mapInArrow`` stage of a Spark Connect
  session (no SparkContext: weights in the closure or as artifacts, results as rows).

A worker's failure becomes a [`WorkerError`][torchspark.errors.WorkerError] carrying the end of its traceback, on every
route (`failures`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from torchspark.errors import ConfigError, WorkerLost
from torchspark.nn import Network
from torchspark.training.comm import ThreadGroup
from torchspark.training.driver.failures import root_cause, worker_failure
from torchspark.training.hooks import NullRecorder, PhaseRecorder, ProgressUpdate, WorkerHooks
from torchspark.training.progress import ProgressDirectory, ProgressEndpoint
from torchspark.training.task import EpochSource, WorkerResult, WorkerTask
from torchspark.training.worker.body import WorkerEnv, solo, train, worker_main

__all__ = ["Runner", "RunContext", "NullContext", "NULL_CONTEXT", "WorkerData", "InProcessRunner"]


class RunContext(Protocol):
    """What the driver offers a runner during one fit: implemented by
    `FitContext`, and by `NULL_CONTEXT` for a runner used on its own.

    Attributes:
        network: the driver's network. Runners that keep the fit's state on the driver between jobs (the rounds
            route) update it in place, so a failed fit leaves the last completed round; the others leave it alone.
        recorder: the driver's stats recorder; a runner times the workers' run as its ``fit`` phase.
        description: a short name of the fit for job descriptions and messages.
        attempt: which launch of the workers this is (0 first; each recovery adds one).
        stall_timeout_s: the master's ``stall_timeout_s`` (None: off), for runners that watch progress themselves
            (the rounds route: [`round_watch`][torchspark.spark.rounds.round_watch]).
    """

    recorder: PhaseRecorder
    description: str
    attempt: int
    stall_timeout_s: float | None

    @property
    def network(self) -> Network:  # read-only: runners update the network in place, never replace it
        ...

    def progress_address(
        self, host: str = "127.0.0.1", advertise_host: str | None = None, port_range: tuple[int, int] | None = None
    ) -> ProgressEndpoint | None:
        """Open the fit's progress channel (once, on a port inside ``port_range`` when set) and return the
        address workers connect to, with the fit's token; None when the fit has no channel (`NULL_CONTEXT`)."""
        ...

    def progress_directory(self, base: str, poll_s: float = 1.0, flush_s: float = 1.0) -> ProgressDirectory | None:
        """Open the fit's progress channel as a directory under ``base`` that the driver polls every ``poll_s``
        (`torchspark.training.progress.files`: workers need no connection to the driver) and return where
        workers write; None when the fit has no channel (`NULL_CONTEXT`)."""
        ...

    def reported_errors(self) -> list[tuple[int, str]]:
        """``(rank, traceback)`` of every error workers reported over the progress channel so far."""
        ...

    def notify(self, update: ProgressUpdate) -> None:
        """Progress computed on the driver (runners whose workers do not stream progress themselves)."""
        ...

    def stalled(self, world_size: int, timeout_s: float) -> WorkerLost | None:
        """The watchdog runners poll while workers run: a [`WorkerLost`][torchspark.errors.WorkerLost] when a rank
        stopped sending heartbeats for ``timeout_s`` (or the runner still waits ``timeout_s`` after every rank
        finished), or when no rank reported a new step for the master's ``stall_timeout_s`` (every worker hung at
        once: [`stall`][torchspark.training.driver.stall]), else None. A runner that polls it gets both."""
        ...


class NullContext:
    """The context of a runner run on its own (tests, benchmarks): no progress channel, no stats, nothing
    reported, no watchdog. It has no network: a runner that trains the driver's network in place (the rounds
    route) needs `run_fit`'s context.

    Example: ``InProcessRunner().run(task, shards)`` runs with `NULL_CONTEXT`.
    """

    recorder: PhaseRecorder = NullRecorder()
    description = "torchspark fit"
    attempt = 0
    stall_timeout_s: float | None = None

    @property
    def network(self) -> Network:
        raise ConfigError(
            "this runner trains the driver's network in place; run it through run_fit, whose context holds the network"
        )

    def progress_address(
        self, host: str = "127.0.0.1", advertise_host: str | None = None, port_range: tuple[int, int] | None = None
    ) -> ProgressEndpoint | None:
        return None

    def progress_directory(self, base: str, poll_s: float = 1.0, flush_s: float = 1.0) -> ProgressDirectory | None:
        return None

    def reported_errors(self) -> list[tuple[int, str]]:
        return []

    def notify(self, update: ProgressUpdate) -> None:
        return None

    def stalled(self, world_size: int, timeout_s: float) -> WorkerLost | None:
        return None


#: the one `NullContext` (it holds no state): the default of runners' ``context``
NULL_CONTEXT: RunContext = NullContext()


@runtime_checkable
class WorkerData(Protocol):
    """The workers' data as an adapter prepared it for its runner (a Spark RDD, per-worker lists, a stream).

    Every kind can also give plain per-worker sources, which is how [`InProcessRunner`][torchspark.training.InProcessRunner] runs any adapter's
    data in this process.
    """

    @property
    def workers(self) -> int: ...

    def local_sources(self) -> list[EpochSource]:
        """One `EpochSource` per worker, in rank order, readable in this process."""
        ...


class Runner(Protocol):
    def run(self, task: WorkerTask, data: Any, context: RunContext) -> list[WorkerResult]:
        """Run one worker per share of ``data`` and return the results ordered by rank.

        Raises:
            WorkerError: a worker failed (the root cause, not a peer's symptom); the workers are stopped first.
        """
        ...


class InProcessRunner:
    """Runs each worker in a thread of this process, with an in-memory communicator.

    Args:
        timeout_s: collective timeout; a worker that fails aborts the others, which then raise.
        hooks_factory: builds each rank's hooks (stats recorder, progress). Default: with a driver context, the
            real progress channel (progress, errors, stats on the driver's clock), as worker processes get it;
            with `NULL_CONTEXT`, none.
    """

    def __init__(self, timeout_s: float = 300.0, hooks_factory: Callable[[int], WorkerHooks] | None = None) -> None:
        self.timeout_s = timeout_s
        self.hooks_factory = hooks_factory

    def run(
        self, task: WorkerTask, data: Sequence[EpochSource] | WorkerData, context: RunContext = NULL_CONTEXT
    ) -> list[WorkerResult]:
        """Run the workers on ``data`` (per-worker sources, or any adapter's `WorkerData`)."""
        sources = data.local_sources() if isinstance(data, WorkerData) else list(data)
        address = context.progress_address()
        n = len(sources)
        group = ThreadGroup(n, self.timeout_s) if n > 1 else None
        results: list[WorkerResult | None] = [None] * n
        failures: list[tuple[int, str]] = []

        def failed(rank: int, trace: str) -> None:
            failures.append((rank, trace))
            if group is not None:
                group.abort()

        def target(rank: int) -> None:
            env = WorkerEnv(
                rank,
                rendezvous=solo if group is None else lambda device: (group.communicator(rank), None),
                progress=address,
                collect_stats=task.collect_stats,
                report_scores=task.report_scores,
                # no driver channel (NULL_CONTEXT): no hooks, unless the caller builds them
                hooks=self.hooks_factory or (None if address is not None else lambda rank: WorkerHooks()),
                on_error=failed,
            )
            results[rank] = worker_main(env, train(task, sources[rank]))

        threads = [threading.Thread(target=target, args=(r,), name=f"torchspark-worker-{r}") for r in range(n)]
        with context.recorder.phase("fit"):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if failures:
            # the first failure is the cause; the others are usually peers woken by the abort
            raise worker_failure(*root_cause(failures))  # type: ignore[misc]
        return [r for r in results if r is not None]
