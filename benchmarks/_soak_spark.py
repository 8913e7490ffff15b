"""The Spark route of ``bench_soak.py`` (``--route spark``): the same soak on a ``local[2]`` session, with the
driver's JVM measured beside the driver's Python process.

What a recovery attempt could leave on the driver, and how it is read here: the JVM's resident memory (its pid:
the gateway's process), its heap in use and committed (``Runtime``; after ``System.gc()`` at the end: the JVM grows
its heap lazily and keeps what it committed, so "not released" RSS with a small heap in use is the JVM's choice, not
a leak), the broadcasts PySpark still holds (:func:`~torchspark.spark.broadcasts.driver_broadcast_files`), the
persisted RDDs, and the JVM's RSS again after ``idle_s`` of quiet (Spark's cached block-manager thread pools, which
broadcast and RDD removals start, end after 60 s idle and give their native memory back).
"""

from __future__ import annotations

import os
import time
from typing import Any

from torchspark import Network, datasets
from torchspark.spark import SparkNetwork, local_session
from torchspark.spark.broadcasts import driver_broadcast_files

__all__ = ["SparkRoute", "rss_mib"]


def rss_mib(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MiB (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, IndexError, ValueError):
        return None


class SparkRoute:
    """One ``local[2]`` session for every fit of the soak; its driver JVM measured."""

    def __init__(self) -> None:
        self.spark = local_session(cores=2, app_name="torchspark-soak", rendezvous_timeout_s=60, quiet=True)
        self.sc = self.spark.sparkContext
        self.jvm_pid = int(self.sc._gateway.proc.pid)  # the gateway's process: the driver JVM

    def master_options(self, batch: int) -> dict[str, Any]:
        return {"num_workers": 2, "batch_size_per_worker": batch}

    def fit(self, net: Network, master: Any, epochs: int, listener: Any = None) -> SparkNetwork:
        spark_net = SparkNetwork(self.spark, net, master, progress=False)
        if listener is not None:
            spark_net.add_progress_listener(listener)
        try:
            spark_net.fit(self.sc.parallelize(datasets.digits("train").split(64), 2), epochs=epochs)
        finally:
            spark_net.delete_temp_files()
        return spark_net

    def jvm_rss(self) -> float | None:
        return rss_mib(self.jvm_pid)

    def heap_mib(self, collect: bool = False) -> tuple[float, float]:
        """The JVM heap (in use, committed) in MiB; ``collect``: after a full ``System.gc()``."""
        if collect:
            self.sc._jvm.java.lang.System.gc()
        runtime = self.sc._jvm.java.lang.Runtime.getRuntime()
        total = runtime.totalMemory()
        return (total - runtime.freeMemory()) / 2**20, total / 2**20

    def held(self) -> dict[str, int]:
        """What the driver holds for Spark now: PySpark's live broadcasts, persisted RDDs."""
        return {
            "broadcasts": driver_broadcast_files(self.sc),
            "persisted_rdds": int(self.sc._jsc.getPersistentRDDs().size()),
        }

    def after_run(self, held_before: dict[str, int], idle_s: float) -> dict[str, Any]:
        """The JVM after the disturbed fit: heap after a full GC vs committed, what is still held (minus what was
        held before the fit), its RSS now and after ``idle_s`` of quiet."""
        used, committed = self.heap_mib(collect=True)
        held = {k: v - held_before.get(k, 0) for k, v in self.held().items()}
        rss_now = self.jvm_rss()
        time.sleep(idle_s)  # a benchmark: nothing to wait for but Spark's idle thread pools ending
        return {
            "jvm_heap_used_after_gc_mib": round(used, 1),
            "jvm_heap_committed_mib": round(committed, 1),
            "driver_held_after_fit": held,
            "jvm_rss_end_mib": rss_now,
            "idle_s": idle_s,
            "jvm_rss_after_idle_mib": self.jvm_rss(),
        }

    def stop(self) -> None:
        self.spark.stop()
