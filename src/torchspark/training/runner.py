"""Runners launch ``run_worker`` on N workers and collect their results.

The training masters hand a :class:`WorkerTask` and the workers' data to a runner; which runner is injectable:
:class:`InProcessRunner` (threads of this process, for tests and tiny jobs), the local-process runner of
:mod:`torchspark.parallel`, and the Spark barrier runner of :mod:`torchspark.spark`.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any, Protocol, Sequence

from torchspark.errors import WorkerError
from torchspark.training.comm import SoloCommunicator, ThreadGroup
from torchspark.training.hooks import WorkerHooks
from torchspark.training.worker import EpochSource, WorkerResult, WorkerTask, run_worker

__all__ = ["Runner", "InProcessRunner", "traceback_tail"]


def traceback_tail(tb: str, max_lines: int = 20) -> str:
    """The last lines of a traceback, keeping its ``Traceback (most recent call last):`` header."""
    lines = [ln for ln in tb.strip().splitlines() if not ln.strip().startswith("SQLSTATE")]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return "\n".join(["Traceback (most recent call last):", "  ...", *lines[-(max_lines - 2):]])


class Runner(Protocol):
    def run(self, task: WorkerTask, sources: Sequence[EpochSource]) -> list[WorkerResult]:
        """Run one worker per source and return the results ordered by rank."""
        ...


class InProcessRunner:
    """Runs each worker in a thread of this process, with an in-memory communicator.

    Args:
        timeout_s: collective timeout; a worker that fails aborts the others, which then raise.
        hooks_factory: builds each rank's hooks (stats recorder, progress) — default: none.
    """

    def __init__(self, timeout_s: float = 300.0, hooks_factory: Any = None) -> None:
        self.timeout_s = timeout_s
        self.hooks_factory = hooks_factory

    def run(self, task: WorkerTask, sources: Sequence[EpochSource]) -> list[WorkerResult]:
        n = len(sources)
        if n == 1:
            hooks = self.hooks_factory(0) if self.hooks_factory else WorkerHooks()
            return [run_worker(task, sources[0], SoloCommunicator(), hooks=hooks)]
        group = ThreadGroup(n, self.timeout_s)
        results: list[WorkerResult | None] = [None] * n
        errors: list[tuple[int, BaseException, str]] = []

        def target(rank: int) -> None:
            try:
                hooks = self.hooks_factory(rank) if self.hooks_factory else WorkerHooks()
                results[rank] = run_worker(task, sources[rank], group.communicator(rank), hooks=hooks)
            except BaseException as e:  # noqa: BLE001 - reported below with the traceback
                errors.append((rank, e, traceback.format_exc()))
                group.abort()

        threads = [threading.Thread(target=target, args=(r,), name=f"torchspark-worker-{r}") for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            # the first failure is the cause; the others are usually peers woken by the abort
            errors.sort(key=lambda e: "BrokenBarrier" in e[2] or "rendezvous_timeout_s" in e[2])
            rank, err, tb = errors[0]
            raise WorkerError(f"worker {rank} failed: {err}\n--- worker traceback ---\n{traceback_tail(tb)}") from err
        return [r for r in results if r is not None]
