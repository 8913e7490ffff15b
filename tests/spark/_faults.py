"""Faults injected from the outside into a running fit (real signals to real processes; used by the fault tests).

:class:`Fault` is a progress listener: workers report their process id with every progress update, so the test
knows which process trains as rank 1 without reaching into Spark.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def executor_jvm(pid: int) -> int | None:
    """The Java process above a Spark Python worker (worker -> pyspark daemon -> executor JVM)."""
    current: int | None = pid
    for _ in range(4):
        current = parent_pid(current) if current else None
        if current is None:
            return None
        try:
            with open(f"/proc/{current}/comm") as f:
                if f.read().strip() == "java":
                    return current
        except OSError:
            return None
    return None


class Fault:
    """Send ``sig`` to ``target(pid)`` of rank ``rank``'s worker once it reports from epoch ``epoch`` on, for the
    first ``times`` distinct worker processes of that rank (default target: the worker process itself)."""

    def __init__(
        self,
        sig: int,
        epoch: int = 1,
        times: int = 1,
        rank: int = 1,
        target: Callable[[int], int | None] = lambda pid: pid,
    ) -> None:
        self.sig, self.epoch, self.times, self.rank, self.target = sig, epoch, times, rank, target
        self.hit: list[int] = []  # the processes signalled
        self.workers: list[int] = []  # rank ``rank``'s worker processes hit
        self.seen: set[int] = set()  # every rank-``rank`` worker process that reported
        self.all_pids: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, update) -> None:
        with self._lock:
            if update.pid is None:
                return
            self.all_pids.add(update.pid)
            if update.rank != self.rank:
                return
            self.seen.add(update.pid)
            if update.epoch >= self.epoch and len(self.workers) < self.times and update.pid not in self.workers:
                victim = self.target(update.pid)
                if victim is None or victim == os.getpid():
                    raise AssertionError(f"no process to signal above worker {update.pid}")
                self.workers.append(update.pid)
                self.hit.append(victim)
                os.kill(victim, self.sig)
