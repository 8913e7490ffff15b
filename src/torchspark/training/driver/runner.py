"""Runners launch ``run_worker`` on N workers and collect their results: the one protocol every route implements.

The driver (:mod:`torchspark.training.driver`) hands a runner the :class:`WorkerTask`, the workers' data and a
:class:`RunContext` (the fit's progress channel, stats and network); the runner starts the workers, supervises them
and returns their results by rank. Implementations:

* :class:`InProcessRunner` (here): threads of this process with an in-memory communicator; any adapter's data
  (``SparkNetwork(..., runner=InProcessRunner())`` too), so tests check a master's logic without processes;
* :class:`~torchspark.parallel.runner.LocalProcessRunner`: worker processes on this machine (``ParallelWrapper``);
* :class:`~torchspark.spark.runners.SparkBarrierRunner`: one Spark barrier stage whose tasks all-reduce;
* :class:`~torchspark.spark.runners.SparkRoundsRunner`: one Spark job per averaging round (``averaging_via="spark"``).

A worker's failure becomes a :class:`~torchspark.errors.WorkerError` carrying the end of its traceback, on every
route (:mod:`~torchspark.training.driver.failures`).
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from torchspark.nn import Network
from torchspark.training.comm import SoloCommunicator, ThreadGroup
from torchspark.training.driver.failures import root_cause, traceback_tail, worker_error_type
from torchspark.training.hooks import PhaseRecorder, ProgressUpdate, WorkerHooks
from torchspark.training.progress import ProgressEndpoint
from torchspark.training.task import EpochSource, WorkerResult, WorkerTask
from torchspark.training.worker.loop import run_worker
from torchspark.training.worker.reporting import open_worker_hooks

__all__ = ["Runner", "RunContext", "WorkerData", "InProcessRunner"]


class RunContext(Protocol):
    """What the driver offers a runner during one fit (implemented by :class:`~torchspark.training.driver.fit.FitContext`).

    Attributes:
        network: the driver's network. Runners that keep the fit's state on the driver between jobs (the rounds
            route) update it in place, so a failed fit leaves the last completed round; the others leave it alone.
        recorder: the driver's stats recorder; a runner times the workers' run as its ``fit`` phase.
        description: a short name of the fit for job descriptions and messages.
    """

    network: Network
    recorder: PhaseRecorder
    description: str

    def progress_address(self, host: str = "127.0.0.1", advertise_host: str | None = None,
                         port_range: tuple[int, int] | None = None) -> ProgressEndpoint:
        """Open the fit's progress channel (once, on a port inside ``port_range`` when set) and return the
        address workers connect to, with the fit's token."""
        ...

    def reported_errors(self) -> list[tuple[int, str]]:
        """``(rank, traceback)`` of every error workers reported over the progress channel so far."""
        ...

    def notify(self, update: ProgressUpdate) -> None:
        """Progress computed on the driver (runners whose workers do not stream progress themselves)."""
        ...


@runtime_checkable
class WorkerData(Protocol):
    """The workers' data as an adapter prepared it for its runner (a Spark RDD, per-worker lists, a stream).

    Every kind can also give plain per-worker sources, which is how :class:`InProcessRunner` runs any adapter's
    data in this process.
    """

    @property
    def workers(self) -> int: ...

    def local_sources(self) -> list[EpochSource]:
        """One :class:`EpochSource` per worker, in rank order, readable in this process."""
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
            without one, none.
    """

    def __init__(self, timeout_s: float = 300.0,
                 hooks_factory: Callable[[int], WorkerHooks] | None = None) -> None:
        self.timeout_s = timeout_s
        self.hooks_factory = hooks_factory

    def run(self, task: WorkerTask, data: Sequence[EpochSource] | WorkerData,
            context: RunContext | None = None) -> list[WorkerResult]:
        """Run the workers on ``data`` (per-worker sources, or any adapter's :class:`WorkerData`)."""
        sources = data.local_sources() if isinstance(data, WorkerData) else list(data)
        address = context.progress_address() if context is not None else None

        def hooks_for(rank: int) -> WorkerHooks:
            if self.hooks_factory is not None:
                return self.hooks_factory(rank)
            if address is not None:
                return open_worker_hooks(rank, task.collect_stats, address, report_scores=task.report_scores)
            return WorkerHooks()

        n = len(sources)
        group = ThreadGroup(n, self.timeout_s) if n > 1 else None
        results: list[WorkerResult | None] = [None] * n
        failures: list[tuple[int, str]] = []

        def target(rank: int) -> None:
            hooks = None
            try:
                hooks = hooks_for(rank)
                comm = group.communicator(rank) if group is not None else SoloCommunicator()
                results[rank] = run_worker(task, sources[rank], comm, hooks=hooks)
            except BaseException:  # noqa: BLE001 - reported below with the traceback
                failures.append((rank, traceback.format_exc()))
                if group is not None:
                    group.abort()
            finally:
                if hooks is not None and hooks.close is not None:
                    hooks.close()

        threads = [threading.Thread(target=target, args=(r,), name=f"torchspark-worker-{r}") for r in range(n)]
        with context.recorder.phase("fit") if context is not None else contextlib.nullcontext():
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if failures:
            # the first failure is the cause; the others are usually peers woken by the abort
            rank, tb = root_cause(failures)  # type: ignore[misc]
            lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
            raise worker_error_type(tb)(f"worker {rank} failed: {lines[-1] if lines else tb}\n"
                                        f"--- worker traceback ---\n{traceback_tail(tb)}")
        return [r for r in results if r is not None]
