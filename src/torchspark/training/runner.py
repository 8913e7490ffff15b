"""Runners launch ``run_worker`` on N workers and collect their results.

The training masters hand a :class:`WorkerTask` and the workers' data to a runner; which runner is injectable:
:class:`InProcessRunner` (threads of this process, for tests and tiny jobs), the local-process runner of
:mod:`torchspark.parallel`, and the Spark barrier runner of :mod:`torchspark.spark`.
"""

from __future__ import annotations

import re
import threading
import traceback
from typing import Any, Protocol, Sequence

from torchspark.errors import WorkerError
from torchspark.training.comm import SoloCommunicator, ThreadGroup
from torchspark.training.hooks import WorkerHooks
from torchspark.training.worker import EpochSource, WorkerResult, WorkerTask, run_worker

__all__ = ["Runner", "InProcessRunner", "traceback_tail", "is_peer_failure", "root_cause"]

# What a worker sees when a *peer* died or was aborted: secondary failures, never the cause.
_PEER_FAILURE = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|BrokenBarrier|transport/tcp|"
    r"NCCL (?:error|communicator was aborted)|ProcessGroup.*abort|peer (?:left|failed|aborted)|"
    r"rendezvous_timeout_s|barrier\(\) timed out|TaskKilled|was killed|cancelled|aborted|PeerLost",
    re.I,
)


def is_peer_failure(tb: str) -> bool:
    """True when a worker's traceback says a peer went away (the symptom), not what went wrong (the cause)."""
    return bool(_PEER_FAILURE.search(tb))


def root_cause(errors: Sequence[tuple[int, str]]) -> tuple[int, str] | None:
    """The error to show the user: the first that is not a peer's reaction to another worker's failure."""
    if not errors:
        return None
    for rank, tb in errors:
        if not is_peer_failure(tb):
            return rank, tb
    return errors[0]


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
            rank, tb = root_cause([(r, t) for r, _, t in errors])  # type: ignore[misc]
            err = next(e for r, e, _ in errors if r == rank)
            raise WorkerError(f"worker {rank} failed: {err}\n--- worker traceback ---\n{traceback_tail(tb)}") from err
        return [r for r in results if r is not None]
