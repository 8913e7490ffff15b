"""Automatic recovery: what a failed attempt was, and whether the driver starts another one.

The driver (`torchspark.training.driver.fit.run_fit`) runs the workers as *attempts*: attempt 0 first; when the
runner raises [`WorkerLost`][torchspark.errors.WorkerLost] (a worker, its process or its executor lost, or a peer that
stopped responding), it records a `FailureRecord` and, while `decide` says so, starts the next attempt
(new processes / a new barrier stage, a new progress token and rendezvous keys) from the newest state it holds.

Errors that are the user's (a ``DataError`` or ``ConfigError`` a worker raised, a diverged loss, an exception in
the user's module) are never retried: running the same code on the same data again would fail the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from torchspark.errors import WorkerError, WorkerLost
from torchspark.training.driver.stall import NO_PROGRESS

__all__ = [
    "FailureRecord",
    "Decision",
    "SILENT_END",
    "decide",
    "record_failure",
    "exhausted_error",
    "repeated_hang",
    "hang_error",
]


@dataclass(frozen=True)
class FailureRecord:
    """One failed attempt, as ``summary()["failures"]`` lists it (JSON-able through `to_dict`).

    Args:
        attempt: the attempt that failed (0 = the first launch).
        rank: the lost worker's rank (None when unknown).
        executor: Spark's executor id, or the worker process's name on one machine.
        pid: the lost worker's process id, as its progress connection reported it (None when unknown).
        exit_status: ``"signal SIGKILL"`` / ``"exit code 137"`` / ``"no heartbeat"`` (None when unknown).
        reason: Spark's or the runner's own words.
        time: wall-clock time (``time.time()``, the driver's clock) when the driver saw the failure.
        started: wall-clock time the failed attempt started (the lost interval on the timeline is
            ``[restart point, time]``).
        reached_epoch, reached_iteration: how far the failed attempt got (epoch of the fit and minibatch within
            it, the furthest worker's last progress report); the work from the attempt's restart point to here is
            lost and trained again (None when no progress was heard).
    """

    attempt: int
    rank: int | None
    executor: str | None
    exit_status: str | None
    reason: str
    time: float
    started: float
    reached_epoch: int | None = None
    reached_iteration: int | None = None
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.exit_status == NO_PROGRESS:  # every worker alive but stuck: none was lost
            return f"attempt {self.attempt}: every worker stuck ({NO_PROGRESS}): {self.reason}"
        who = "a worker" if self.rank is None else f"worker {self.rank}"
        where = f" on executor {self.executor}" if self.executor else ""
        where += f" (pid {self.pid})" if self.pid is not None and f"pid {self.pid}" not in where else ""
        status = f" ({self.exit_status})" if self.exit_status else ""
        return f"attempt {self.attempt}: {who}{where} lost{status}: {self.reason}"


class Decision(Enum):
    """What the driver does after a failed attempt."""

    RETRY = "retry"  # start the next attempt
    RAISE = "raise"  # the user's error: re-raise it unchanged
    EXHAUSTED = "exhausted"  # lost workers, but max_failures attempts failed already


def decide(error: BaseException, failures_so_far: int, max_failures: int) -> Decision:
    """Retry a lost worker while fewer than ``max_failures`` failures happened (``failures_so_far`` counts the
    one just seen); never retry the user's errors."""
    if not isinstance(error, WorkerLost):
        return Decision.RAISE
    return Decision.RETRY if failures_so_far <= max_failures else Decision.EXHAUSTED


#: the exit status of a rank the driver found lost by its progress connection closing without an error: no exit
#: code or signal reaches the driver from another process (SIGKILL, the OOM killer and a segfault read the same)
SILENT_END = "ended without a word (its progress connection closed; no exit code reaches the driver)"


def record_failure(
    error: WorkerLost,
    attempt: int,
    started: float,
    reached: tuple[int, int] | None,
    pids: dict[int, int | None] | None = None,
    suspect: int | None = None,
) -> FailureRecord:
    """The `FailureRecord` of ``error``, seen now; ``reached`` is the attempt's furthest
    ``(epoch, iteration)``, ``pids`` each rank's process id, ``suspect`` the rank the driver believes lost when
    the error names none (the first whose progress connection closed without an error)."""
    reason = error.reason or (str(error).splitlines() or ["unknown"])[0]
    if error.exit_status == NO_PROGRESS:
        suspect = None  # every rank stalled: a rank that ended first is not the culprit
    rank = error.rank if error.rank is not None else suspect
    status = error.exit_status
    if status is None and error.rank is None and suspect is not None:
        status = SILENT_END  # the driver inferred the rank: its process ended without reporting an error
    return FailureRecord(
        attempt=attempt,
        rank=rank,
        executor=error.executor,
        exit_status=status,
        reason=reason,
        time=time.time(),
        started=started,
        reached_epoch=reached[0] if reached else None,
        reached_iteration=reached[1] if reached else None,
        pid=(pids or {}).get(rank) if rank is not None else None,
    )


def exhausted_error(failures: Sequence[FailureRecord], max_failures: int, last: WorkerLost) -> WorkerError:
    """The error a fit ends with after ``max_failures`` recovered failures and one more."""
    listed = "\n".join(f"  {f.describe()}" for f in failures)
    final = failures[-1]
    error = WorkerLost(
        f"{final.describe()}\nthe fit lost workers {len(failures)} time(s), more than max_failures={max_failures} "
        f"allows; raise max_failures on the training master if such faults are expected, else fix their cause:\n"
        f"{listed}\n--- the last failure ---\n{last}",
        rank=final.rank,
        executor=final.executor,
        exit_status=final.exit_status,
        reason=final.reason,
    )
    return error


#: exit statuses of a worker found silent by the watchdog (alive, but stuck), and words of a wait that ran out
_SILENT = ("no heartbeat", "no response", NO_PROGRESS)
_WAIT_WORDS = ("WaitTimeout", "timed out waiting", "did not arrive within")


def _timed_out(failure: FailureRecord) -> bool:
    """A stuck worker (the watchdog's verdict, or a peer's wait that ran out), not a process or machine that died
    (a peer that saw its neighbour leave says ``PeerLost``; Spark's lost executor says "Executor heartbeat timed
    out" and names no wait of ours)."""
    if failure.exit_status in _SILENT:
        return True
    return "PeerLost" not in failure.reason and any(word in failure.reason for word in _WAIT_WORDS)


def repeated_hang(failures: Sequence[FailureRecord]) -> bool:
    """Whether the last two failed attempts both timed out with the furthest worker at the same step.

    A lost machine fails an attempt wherever it happens to be; a hang in the model's code or data (a deadlock in
    ``forward``, a loader that never returns, a batch that makes a custom op spin) stops every attempt at the same
    minibatch. Retrying that costs ``max_failures`` x ``rendezvous_timeout_s`` and ends in the same place, so the
    driver stops after the second identical hang (`hang_error`). Two attempts that the progress watchdog
    stopped before any worker's first report (``exit_status`` ``"no progress"``: every rank had connected) stopped at
    the same place too.
    """
    if len(failures) < 2:
        return False
    last, before = failures[-1], failures[-2]
    point = (last.reached_epoch, last.reached_iteration)
    known = point[0] is not None or last.exit_status == before.exit_status == NO_PROGRESS
    same = point == (before.reached_epoch, before.reached_iteration) and known
    return same and _timed_out(last) and _timed_out(before)


def hang_error(failures: Sequence[FailureRecord], last: WorkerLost) -> WorkerError:
    """The (not retried) error of a fit whose attempts hang at the same step: names the step and what to look at."""
    final = failures[-1]
    listed = "\n".join(f"  {f.describe()}" for f in failures)
    where = (
        f"at epoch {final.reached_epoch}, minibatch {final.reached_iteration} (the furthest progress reported)"
        if final.reached_epoch is not None
        else "before any worker's first progress report"
    )
    knob = "stall_timeout_s" if final.exit_status == NO_PROGRESS else "rendezvous_timeout_s"
    return WorkerError(
        f"attempts {failures[-2].attempt} and {final.attempt} both stopped {where} and timed out: a hang at or just "
        "after that step in the model or the data (a "
        "deadlock or endless loop in forward/backward, a loader or transform that never returns), not a lost "
        "machine, so it is not retried again. Train that step on one machine (Network.fit on the same minibatch) "
        f"to find it; if the step is merely slower than the timeout, raise {knob}.\n"
        f"{listed}\n--- the last failure ---\n{last}"
    )
