"""Which workers of a fit are alive, as their progress connections tell the driver (heartbeats and closes).

Workers send an ``alive`` message (rank, process id) when they connect and every
`HEARTBEAT_S` seconds; a connection that closes marks its rank
``ended``. The driver's watchdog (`Liveness.stalled`) turns two symptoms into a
[`WorkerLost`][torchspark.errors.WorkerLost] long before Spark's own executor heartbeat timeout (120 s):

1. a rank whose connection is open but silent for ``timeout_s`` (a stopped or wedged worker process);
2. every rank ended (the workers finished) but the runner is still waiting ``timeout_s`` later for the cluster to
   say so (a stopped or lost executor that holds the finished task's result).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from torchspark.errors import WorkerLost

__all__ = ["RankState", "Liveness"]


@dataclass(frozen=True)
class RankState:
    """What the driver last heard from one rank."""

    pid: int | None
    last_seen: float  # time.monotonic() of its last message or close
    ended: bool = False


class Liveness:
    """Thread-safe record of every rank's last message (fed by the progress server's thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks: dict[int, RankState] = {}

    def seen(self, rank: int, pid: int | None = None) -> None:
        with self._lock:
            old = self._ranks.get(rank)
            self._ranks[rank] = RankState(pid if pid is not None else (old.pid if old else None), self._clock())

    def ended(self, rank: int) -> None:
        with self._lock:
            old = self._ranks.get(rank)
            self._ranks[rank] = (
                replace(old, last_seen=self._clock(), ended=True) if old else RankState(None, self._clock(), ended=True)
            )

    def snapshot(self) -> dict[int, RankState]:
        with self._lock:
            return dict(self._ranks)

    def stalled(self, world_size: int, timeout_s: float) -> WorkerLost | None:
        """The watchdog's verdict (rules 1 and 2 of the module docstring), or None while all is well."""
        now = self._clock()
        ranks = self.snapshot()
        for rank, state in sorted(ranks.items()):
            if not state.ended and now - state.last_seen > timeout_s:
                return WorkerLost(
                    f"worker {rank} (pid {state.pid}) sent no heartbeat for {now - state.last_seen:.0f} s "
                    f"(rendezvous_timeout_s={timeout_s:g}): it stopped responding",
                    rank=rank,
                    exit_status="no heartbeat",
                    reason=f"no heartbeat from worker {rank} for {timeout_s:g} s",
                )
        if len(ranks) == world_size and all(s.ended for s in ranks.values()):
            last = max(s.last_seen for s in ranks.values())
            if now - last > timeout_s:
                return WorkerLost(
                    f"all {world_size} workers finished training {now - last:.0f} s ago but the cluster has not "
                    f"delivered their results (rendezvous_timeout_s={timeout_s:g}): an executor stopped "
                    "responding, or a JVM is short of memory for the results (rank 0 returns the network's "
                    "parameters and updater state; for a large network raise spark.driver.memory, and "
                    "spark.executor.memory on a cluster)",
                    exit_status="no heartbeat",
                    reason="workers finished but an executor did not report its task",
                )
        return None
