"""Running a query of a Connect session the way `torchspark.spark.jobs` runs a classic job: on a helper
thread, under a tag that Ctrl-C, an error or a watchdog interrupts, with a failed task turned into our error.

A Connect session has no job groups; its operations carry *tags* (``spark.addTag``, per thread) and
``spark.interruptTag(tag)`` stops every operation of a tag on the server. A failed task reaches the client as a
``SparkConnectGrpcException`` whose text is Spark's own (``Job aborted due to stage failure ...``, with the Python
traceback of the task), so `task_error` reads it as on a classic session.

Also here: what the client can learn about the cluster without a SparkContext (`default_parallelism`) and
whether the executors can reach the client (`client_is_local`).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from torchspark.errors import SetupError, TorchSparkError
from torchspark.spark.jobs import task_error
from torchspark.spark.preflight import DYNAMIC_ALLOCATION_REFUSED, too_few_slots
from torchspark.training.waiting import call_on_thread

__all__ = ["run_tagged", "default_parallelism", "client_is_local", "connect_preflight", "WATCH_S"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# what Spark says when a task of the query failed (else the query never ran: its own error passes unchanged)
_TASK_FAILURE = re.compile(
    r"stage failure|Python worker exited|ExecutorLostFailure|PythonException|PYTHON_EXCEPTION", re.I
)

#: how often a running query's watchdog is asked whether the workers are still alive
WATCH_S = 0.5


def run_tagged(
    spark: Any,
    description: str,
    action: Callable[[], _T],
    *,
    reported_errors: Callable[[], list[tuple[int, str]]] | None = None,
    watchdog: Callable[[], BaseException | None] | None = None,
) -> _T:
    """Run ``action`` (which runs queries on ``spark``) on a helper thread under a fresh tag; its value.

    Ctrl-C on the calling thread interrupts the tag's operations; ``watchdog`` (polled every `WATCH_S`)
    returns an error when the query will never finish well, which interrupts them and is raised instead of
    Spark's. A failed task raises `task_error` (``reported_errors`` as there).

    Raises:
        TorchSparkError: the task's own error class, [`WorkerError`][torchspark.errors.WorkerError] or
            [`WorkerLost`][torchspark.errors.WorkerLost]; our errors raised by ``action`` on the client pass unchanged.
    """
    from pyspark.errors import PySparkException

    tag = f"torchspark-{uuid.uuid4().hex[:12]}"
    tripped: list[BaseException] = []
    stop = threading.Event()

    def interrupt() -> None:
        try:
            spark.interruptTag(tag)
        except Exception:  # the server may be gone already; nothing else to stop
            log.debug("interrupting %s failed", tag, exc_info=True)

    def watch() -> None:
        assert watchdog is not None
        while not stop.wait(WATCH_S):
            found = watchdog()
            if found is not None:
                log.warning("interrupting %r: %s", description, found)
                tripped.append(found)
                interrupt()
                return

    def tagged() -> _T:
        spark.addTag(tag)
        try:
            return action()
        finally:
            spark.removeTag(tag)

    if watchdog is not None:
        threading.Thread(target=watch, name="torchspark-connect-watchdog", daemon=True).start()
    try:
        return call_on_thread(tagged, "torchspark-connect-query", on_interrupt=interrupt)
    except TorchSparkError:
        raise
    except PySparkException as e:
        interrupt()  # a failed query may leave sibling operations of the tag running
        if tripped:
            raise tripped[0] from e
        if not _TASK_FAILURE.search(str(e)):
            raise  # the query itself was refused (analysis, a message over the server's cap): Spark's words
        raise task_error(e, description, reported_errors) from e
    finally:
        stop.set()


def default_parallelism(spark: Any) -> int:
    """The cluster's default parallelism as a Connect client can learn it: the partitions of ``spark.range`` without
    a partition count (Spark splits a range into ``defaultParallelism`` slices), read with one tiny query.

    Example: on a ``local[2]`` server -> 2.
    """
    from pyspark.sql import functions as F

    row = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p").alias("m")).collect()
    return int(row[0]["m"]) + 1


def connect_preflight(spark: Any, num_workers: int) -> None:
    """The classic `preflight` as far as a Connect client can see, with the same
    errors: dynamic allocation is off, and the cluster has ``num_workers`` task slots (its default parallelism --
    the cores of its executors -- over ``spark.task.cpus``). Without it a barrier stage of too many tasks waits
    for slots Spark re-checks for ~10 minutes and then fails with SPARK-24819.

    The slot count is skipped when the server sets ``spark.default.parallelism`` (then not its cores).

    Raises:
        SetupError: dynamic allocation is on, or fewer slots than ``num_workers`` (naming both and the fix).
    """
    conf = spark.conf
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        raise SetupError(DYNAMIC_ALLOCATION_REFUSED)
    if conf.get("spark.default.parallelism", None) is not None:
        return
    try:
        cpus = max(1, int(conf.get("spark.task.cpus", "1") or 1))
    except ValueError:
        cpus = 1
    slots = max(1, default_parallelism(spark) // cpus)
    if slots < num_workers:
        raise too_few_slots(num_workers, slots, cpus)


def client_is_local(spark: Any) -> bool:
    """Whether the Connect server runs on this machine (its address is loopback), so the executors can reach a
    port this client opens (the progress channel); a remote server's executors cannot."""
    host = str(getattr(spark.client, "host", "") or "")
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
