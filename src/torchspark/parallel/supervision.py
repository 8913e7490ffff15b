"""Watching the worker processes of one local run: results, errors, deaths, hangs, and the shutdown.

1. a worker that raises sends its traceback; the supervisor waits briefly for the other workers' errors and raises
   [`WorkerError`][torchspark.errors.WorkerError] with the root cause (not a peer's "Connection reset"):
   `wait_for_root_cause`;
2. a worker that dies without a word (killed, out of memory, native crash) is noticed by polling and raises
   [`WorkerLost`][torchspark.errors.WorkerLost] (name, pid, signal or exit code), as does a worker that stops responding:
   its peers time out after ``rendezvous_timeout_s`` and report only that symptom, or (with a driver context) its
   heartbeats stop, or no worker reports a new step for the master's ``stall_timeout_s`` (every worker hung at once:
   [`stall`][torchspark.training.driver.stall]); the driver's recovery then relaunches the workers;
3. on any failure, or Ctrl-C in the parent, every worker is terminated and joined (`Supervisor.shutdown`, in
   the runner's ``finally``) before the error propagates, so no process is left behind;
4. SIGTERM of the driver during a run is handled as Ctrl-C is (`sigterm_as_exit`): it raises
   ``SystemExit(143)``, so step 3 runs and then the interpreter's exit handlers, which remove multiprocessing's
   ``pymp-*`` temporary directory (the default action of SIGTERM kills the driver at once and leaves it behind).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from torchspark.errors import WorkerLost
from torchspark.parallel.results import to_torch
from torchspark.training.driver.failures import is_peer_failure, last_line, wait_for_root_cause, worker_failure
from torchspark.training.driver.runner import NULL_CONTEXT, RunContext
from torchspark.training.task import WorkerResult
from torchspark.training.waiting import join_within

__all__ = ["Supervisor", "exit_status", "rank_of", "sigterm_as_exit"]

log = logging.getLogger(__name__)

#: how often the supervisor looks at the results queue, the processes and the driver's watchdog
POLL_S = 0.2


class Supervisor:
    """The parent's watch over one run's worker processes.

    Args:
        timeout_s: the workers' ``rendezvous_timeout_s`` (named in the "stopped responding" error, and the
            watchdog's limit for silent heartbeats).
        exit_timeout_s: how long finished workers get to exit before they are terminated.
        context: the driver's context (its ``stalled`` watchdog: silent heartbeats, and no progress for the
            master's ``stall_timeout_s``).
    """

    def __init__(self, timeout_s: float, exit_timeout_s: float = 30.0, context: RunContext = NULL_CONTEXT) -> None:
        self.timeout_s = timeout_s
        self.exit_timeout_s = exit_timeout_s
        self.context = context
        #: the started worker processes, by rank (`shutdown` joins every one of them)
        self.children: list[Any] = []

    def collect(self, results_q: Any, n: int, feeder_errors: Sequence[BaseException]) -> list[WorkerResult]:
        """The ``n`` workers' results by rank, read from ``results_q``; raises the first failure instead (a
        feeder's error, a worker's error, a dead or silent worker)."""
        results: dict[int, WorkerResult] = {}
        while len(results) < n:
            if feeder_errors:
                raise feeder_errors[0]
            try:
                kind, rank, payload = results_q.get(timeout=POLL_S)
            except queue.Empty:
                if self.dead_children():
                    self.raise_worker_error(results_q, [])
                stalled = self.context.stalled(n, self.timeout_s)
                if stalled is not None:
                    raise stalled from None
                continue
            if kind == "error":
                self.raise_worker_error(results_q, [(rank, payload)])
            results[rank] = to_torch(payload)
        return [results[r] for r in range(n)]

    def dead_children(self) -> list[Any]:
        """Workers that ended abnormally (a worker that raised still exits with 0 after reporting)."""
        return [p for p in self.children if not p.is_alive() and p.exitcode not in (0, None)]

    def raise_worker_error(self, results_q: Any, errors: list[tuple[int, str]], wait_s: float = 3.0) -> None:
        """Gather the other workers' errors for up to ``wait_s``, then raise the root cause: a worker's own error,
        else a worker's death (its peers' "connection closed" is only the symptom of either). Returns only when
        nothing failed after all."""

        def receive(timeout: float) -> bool:
            try:
                kind, rank, payload = results_q.get(timeout=timeout)
            except queue.Empty:
                # a worker died without a word: the queue is drained, nothing more will explain it
                return not self.dead_children()
            if kind == "error":
                errors.append((rank, payload))
            return True

        found = wait_for_root_cause(lambda: errors, wait_s, receive, poll_s=POLL_S)
        dead = self.dead_children()
        if dead and (found is None or is_peer_failure(found[1])):
            raise self._died(dead[0], found)
        if found is None:
            return
        rank, tb = found
        if is_peer_failure(tb):  # every report is a peer's symptom: whoever did not report stopped responding
            silent = [r for r in range(len(self.children)) if r not in {e[0] for e in errors}]
            who = silent[0] if silent else None
            proc = self.children[who] if who is not None else None
            raise WorkerLost(
                f"worker {who if who is not None else '?'} stopped responding: its peers gave up waiting for it "
                f"(rendezvous_timeout_s={self.timeout_s:g}); worker {rank} reported: {last_line(tb)}",
                rank=who,
                executor=f"{proc.name} (pid {proc.pid})" if proc is not None else None,
                exit_status="no response",
                reason=f"peers timed out: {last_line(tb)}",
            )
        raise worker_failure(rank, tb)

    @staticmethod
    def _died(proc: Any, found: tuple[int, str] | None) -> WorkerLost:
        symptom = f"; then worker {found[0]} failed: {last_line(found[1])}" if found else ""
        status = exit_status(proc.exitcode)
        return WorkerLost(
            f"worker process {proc.name} (pid {proc.pid}) died with {status}: killed, out of memory, "
            "crashed in native code, or failed to start (a script that calls fit at top level needs "
            "`if __name__ == '__main__':`, since workers start in fresh processes that import it)"
            f"{symptom}",
            rank=rank_of(proc),
            executor=f"{proc.name} (pid {proc.pid})",
            exit_status=status,
            reason=f"worker process died with {status}",
        )

    def shutdown(self, graceful: bool) -> None:
        """Join every worker; after a failure or Ctrl-C terminate them at once (then kill the stubborn)."""
        if graceful:
            join_within(self.children, self.exit_timeout_s)
        for p in self.children:
            if p.is_alive():
                p.terminate()
                with contextlib.suppress(OSError):  # a stopped (SIGSTOP) worker acts on SIGTERM only once resumed
                    os.kill(p.pid, signal.SIGCONT)
        for p in self.children:
            p.join(timeout=10.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
            if p.is_alive():
                log.error("worker process %s (pid %s) survived SIGKILL", p.name, p.pid)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Step 4: within the block, SIGTERM raises ``SystemExit(128 + SIGTERM)`` in the main thread (exit code 143, as
    a shell reports a terminated process). Nothing changes off the main thread or when the program installed a
    SIGTERM handler of its own."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def exit_status(code: int) -> str:
    """A process's exit code in words: ``"signal SIGKILL"`` for -9, ``"exit code 1"`` for 1."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def rank_of(proc: Any) -> int | None:
    """The rank in a worker process's name (``torchspark-worker-3`` -> 3)."""
    tail = str(proc.name).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None
