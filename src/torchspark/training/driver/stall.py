"""The progress watchdog: a fit whose workers all stop making progress at once fails as a hang, not a wait forever.

The heartbeat watchdog (`torchspark.training.progress.liveness`) notices one silent worker; the rendezvous
timeout notices a worker its peers wait for in a collective. Neither fires when **every** worker hangs in the
model's code at the same time (a deadlock in ``forward``, a loader that never returns, a custom op that spins):
their heartbeats come from a thread and go on, and nobody enters a collective that could time out. The master's
``stall_timeout_s`` bounds that case: [`ProgressStall`][torchspark.training.driver.stall.ProgressStall] fails the attempt when no worker reported a new step
for that long.

1. The clock starts once every rank of the attempt has connected to the driver's progress channel (process start
   and imports are not counted; a worker that never connects is the rendezvous timeout's case).
2. Before any worker's first progress report (the rendezvous, loading the first data, ``torch.compile`` and the
   first ``progress_every`` = 10 optimizer steps) the watchdog allows [`FIRST_REPORT_FACTOR`][torchspark.training.driver.stall.FIRST_REPORT_FACTOR] x
   ``stall_timeout_s``; after it, ``stall_timeout_s`` between two reports of any rank (a report of one rank is
   progress of the fit).
3. It says nothing once every rank has ended (the heartbeat watchdog's rule 2 covers a stage that never reports its
   finished tasks).
4. It names the stalled rank when there is one: when no step was reported for the limit but some live ranks sent
   no heartbeat for [`SILENT_S`][torchspark.training.driver.stall.SILENT_S] while the others' go on, those ranks are stopped (SIGSTOP, a debugger) or
   wedged where their heartbeat thread cannot run, and their peers wait for them in a collective: the verdict
   names the first such rank (``rank``, ``exit_status`` ``"no heartbeat"``), as the heartbeat watchdog would after
   ``rendezvous_timeout_s``. A rank whose heartbeat is late but not yet [`SILENT_S`][torchspark.training.driver.stall.SILENT_S] old defers the verdict
   until it either beats or falls silent (at most [`SILENT_S`][torchspark.training.driver.stall.SILENT_S] more), so one stopped worker is not reported as
   every worker stuck.

The verdict of every worker stuck is a [`WorkerLost`][torchspark.errors.WorkerLost] (``exit_status`` [`NO_PROGRESS`][torchspark.training.driver.stall.NO_PROGRESS],
no ``rank``) naming the step each rank is at; the driver retries it as any lost worker, and two such failures at the same step end the fit
(`repeated_hang`): a deterministic hang is not retried ``max_failures``
times. Every route whose runner polls the driver's watchdog gets it (``ParallelWrapper``'s local processes, the
Spark barrier stage, the Spark Connect stage). The rounds route (``averaging_via="spark"``) has no live progress
(one Spark job per averaging round, progress reported by the driver after each): [`round_watch`][torchspark.spark.rounds.round_watch] fails a round
that runs longer than ``stall_timeout_s`` (its attempt's first round: [`FIRST_REPORT_FACTOR`][torchspark.training.driver.stall.FIRST_REPORT_FACTOR] x) the same way.
The in-process runner does not poll a watchdog.

Example::

    stall = ProgressStall(timeout_s=1800.0)
    stall.check(world_size=2, latest=server.latest(), ranks=server.liveness.snapshot())  # None while all is well
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from torchspark.errors import WorkerLost
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.progress.client import HEARTBEAT_S
from torchspark.training.progress.liveness import RankState

__all__ = ["ProgressStall", "NO_PROGRESS", "FIRST_REPORT_FACTOR", "SILENT_S", "round_watch"]

#: the ``exit_status`` of an attempt failed by the progress watchdog (every worker alive, none progressing)
NO_PROGRESS = "no progress"
#: how many ``stall_timeout_s`` the first progress report of an attempt may take (rendezvous, first data, compile)
FIRST_REPORT_FACTOR = 2.0
#: a live rank whose last heartbeat is older than this is silent (step 4); workers beat every ``HEARTBEAT_S`` = 2 s
SILENT_S = 5 * HEARTBEAT_S
#: a live rank whose last heartbeat is older than this (but not yet silent) defers the verdict (step 4)
_LATE_S = 1.5 * HEARTBEAT_S


class ProgressStall:
    """Watches one attempt's progress reports (polled by the runner's watchdog, from one thread at a time).

    Args:
        timeout_s: the master's ``stall_timeout_s`` (None: never a verdict).
        clock: the monotonic clock (tests pass a fake one).
    """

    def __init__(self, timeout_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._steps: dict[int, tuple[int, int]] = {}
        self._since: float | None = None  # when the steps last changed, or every rank had connected

    def check(
        self, world_size: int, latest: Mapping[int, ProgressUpdate], ranks: Mapping[int, RankState]
    ) -> WorkerLost | None:
        """The verdict of steps 1-3 of the module docstring for the reports heard so far: ``latest`` (each rank's
        last progress update) and ``ranks`` (each rank's liveness), or None while all is well."""
        if self.timeout_s is None or len(ranks) < world_size:
            return None
        now = self._clock()
        steps = {rank: (u.epoch, u.iteration) for rank, u in latest.items()}
        if self._since is None or steps != self._steps:
            self._steps, self._since = steps, now
            return None
        limit = self.timeout_s if steps else FIRST_REPORT_FACTOR * self.timeout_s
        if now - self._since <= limit or all(state.ended for state in ranks.values()):
            return None
        quiet = {rank: now - state.last_seen for rank, state in ranks.items() if not state.ended}
        if now - self._since <= limit + SILENT_S and any(_LATE_S < q <= SILENT_S for q in quiet.values()):
            return None  # step 4: a heartbeat is late; wait (at most SILENT_S) until that rank beats or falls silent
        silent = sorted(rank for rank, q in quiet.items() if q > SILENT_S)
        if silent:
            return _silent(now - self._since, self.timeout_s, silent, len(silent) == len(quiet), steps, ranks, now)
        return _stalled(now - self._since, self.timeout_s, steps, ranks)


def _silent(
    stalled_s: float,
    timeout_s: float,
    silent: list[int],
    every: bool,
    steps: Mapping[int, tuple[int, int]],
    ranks: Mapping[int, RankState],
    now: float,
) -> WorkerLost:
    """Step 4's verdict: the live ranks in ``silent`` sent no heartbeat for [`SILENT_S`][torchspark.training.driver.stall.SILENT_S] (``every``: no live
    rank did)."""
    where = "; ".join(_where(rank, steps.get(rank), ranks[rank]) for rank in sorted(ranks))
    first = silent[0]
    quiet = now - ranks[first].last_seen
    who = ", ".join(f"worker {rank} (pid {ranks[rank].pid})" for rank in silent)
    if every:
        what = (
            f"and no worker has sent a heartbeat for {SILENT_S:g} s either ({who}): every worker process stopped "
            "responding (stopped with SIGSTOP or a debugger, or its machine froze)"
        )
    else:
        what = (
            f"and {who} sent no heartbeat for {quiet:.0f} s while the others' go on: "
            f"{'it is' if len(silent) == 1 else 'they are'} stopped (SIGSTOP, a debugger) or wedged where the "
            "heartbeat thread cannot run (native code holding the GIL), and the other workers wait for "
            f"{'it' if len(silent) == 1 else 'them'} in a collective"
        )
    return WorkerLost(
        f"no worker reported a new step for {stalled_s:.0f} s (stall_timeout_s={timeout_s:g}), {what} [{where}]",
        rank=None if every else first,
        exit_status="no heartbeat",
        reason=(
            "no heartbeat from any worker"
            if every
            else f"no heartbeat from worker {first} for {quiet:.0f} s; the others wait for it"
        ),
    )


def _stalled(
    silent_s: float, timeout_s: float, steps: Mapping[int, tuple[int, int]], ranks: Mapping[int, RankState]
) -> WorkerLost:
    """The error of an attempt whose workers made no progress for ``silent_s``, naming where each rank is."""
    where = "; ".join(_where(rank, steps.get(rank), ranks[rank]) for rank in sorted(ranks))
    since = "since the last progress report" if steps else "and none has reported progress yet"
    return WorkerLost(
        f"no worker reported a new step for {silent_s:.0f} s {since} (stall_timeout_s={timeout_s:g}), while their "
        f"heartbeats go on: every worker is stuck in the model's code or its data (a deadlock or endless loop in "
        f"forward/backward, a loader that never returns) [{where}]. If the steps are merely slow (a first step that "
        "compiles, huge minibatches or accumulate_steps), raise stall_timeout_s on the training master "
        "(None turns this watchdog off)",
        exit_status=NO_PROGRESS,
        reason=f"no worker progressed for {timeout_s:g} s (stall_timeout_s)",
    )


def _where(rank: int, step: tuple[int, int] | None, state: RankState) -> str:
    if state.ended:
        return f"worker {rank}: finished"
    if step is None:
        return f"worker {rank}: before its first progress report"
    return f"worker {rank}: epoch {step[0]}, minibatch {step[1]}"


def round_watch(
    timeout_s: float | None, first: bool, where: str, clock: Callable[[], float] = time.monotonic
) -> Callable[[], WorkerLost | None] | None:
    """The rounds route's watchdog for one averaging round (a Spark job) starting now: it returns a
    [`WorkerLost`][torchspark.errors.WorkerLost] (``exit_status`` [`NO_PROGRESS`][torchspark.training.driver.stall.NO_PROGRESS]) once the round has run longer than ``timeout_s``
    (the master's ``stall_timeout_s``; ``first``, the attempt's first round, which loads the first data and builds
    the network: [`FIRST_REPORT_FACTOR`][torchspark.training.driver.stall.FIRST_REPORT_FACTOR] x), else None; no watchdog (None) when ``timeout_s`` is None.
    ``where`` names the round (``"epoch 1, round 3/8"``)."""
    if timeout_s is None:
        return None
    limit = timeout_s * (FIRST_REPORT_FACTOR if first else 1.0)
    started = clock()

    def check() -> WorkerLost | None:
        running = clock() - started
        if running <= limit:
            return None
        allowance = f" ({FIRST_REPORT_FACTOR:g} x for an attempt's first round)" if first else ""
        return WorkerLost(
            f"the averaging round {where} has run for {running:.0f} s, longer than stall_timeout_s={timeout_s:g}"
            f"{allowance}: its tasks are stuck in the model's code or their data (a deadlock or endless loop in "
            "forward/backward, a loader that never returns). If the rounds are merely slow (huge minibatches, a "
            "large averaging_frequency or accumulate_steps), raise stall_timeout_s on the training master (None "
            "turns this watchdog off)",
            exit_status=NO_PROGRESS,
            reason=f"an averaging round ran longer than {limit:g} s (stall_timeout_s)",
        )

    return check
