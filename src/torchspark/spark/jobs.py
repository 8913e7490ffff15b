"""Running Spark jobs from the driver, and turning a failed task into our error: the one place for both.

Every job torchspark submits (counting, exporting, the training barrier stage, each averaging round, evaluation)
runs through :func:`run_job`: on a helper thread under its own job group, so Ctrl-C (or an error) on the driver
cancels it, and a failed task becomes a torchspark error carrying the end of the executor's Python traceback
(:func:`task_error`). A task that raised one of our errors keeps its class: an executor ``DataError`` (a bad
feature shape, a non-DataSet RDD item, a label out of range found mid-training) is caught by ``except DataError``
whichever job found it. When it happened inside training it is also a
:class:`~torchspark.errors.WorkerError` (:func:`~torchspark.training.runner.worker_error_type`).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any, Callable, Iterable, Iterator, TypeVar

from torchspark.errors import TorchSparkError
from torchspark.training.runner import is_peer_failure, root_cause, traceback_tail, worker_error_type
from torchspark.training.waiting import call_on_thread
from torchspark.training.worker import WorkerResult

__all__ = ["run_job", "run_in_job_group", "run_barrier_stage", "task_error", "worker_traceback"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_PY_TRACE = re.compile(r"(Traceback \(most recent call last\):.*?)(?:\n\tat |\n\s*at org\.apache|\Z)", re.S)
_OUR_ERROR = re.compile(r"^torchspark\.errors\.(\w+): (.*)$")

#: how long a failed stage waits for the progress channel to bring the failing worker's own traceback
ROOT_CAUSE_WAIT_S = 3.0


def worker_traceback(error: BaseException) -> str:
    """The Python traceback of a failed task, dug out of Spark's Java exception text."""
    found = _PY_TRACE.findall(str(error))
    tb = found[-1] if found else str(error)
    return "\n".join(ln for ln in tb.strip().splitlines() if ln.strip() and not ln.strip().startswith("SQLSTATE"))


def _pick_traceback(spark_tb: str, reported_errors: Callable[[], list[tuple[int, str]]] | None,
                    wait_s: float = ROOT_CAUSE_WAIT_S) -> str:
    """Spark's traceback unless it is a peer's symptom and a worker reported the cause over the progress channel."""
    if reported_errors is None or not is_peer_failure(spark_tb):
        return spark_tb
    deadline = time.monotonic() + wait_s
    while True:
        found = root_cause(reported_errors())
        if found is not None and not is_peer_failure(found[1]):
            return found[1]
        if time.monotonic() >= deadline:
            return spark_tb
        time.sleep(0.05)


def task_error(error: BaseException, description: str,
               reported_errors: Callable[[], list[tuple[int, str]]] | None = None) -> TorchSparkError:
    """Our error for a failed Spark task.

    Args:
        error: the Py4J/PySpark exception the action raised.
        description: the job's description (named in the message).
        reported_errors: the progress channel's ``(rank, traceback)`` list: Spark reports whichever task failed
            first, often a peer that merely saw the failing worker's connection drop; a worker's own report of the
            cause wins over such a symptom.
    Returns:
        The executor's own class when it raised one of ours (as a WorkerError as well), else a WorkerError.
    """
    tb = _pick_traceback(worker_traceback(error), reported_errors)
    lines = [ln.strip() for ln in tb.splitlines() if ln.strip()]
    root = lines[-1] if lines else str(error)
    tail = traceback_tail(tb)
    cls = worker_error_type(tb)
    match = _OUR_ERROR.match(root)
    if match and cls.__name__ != "WorkerError":
        return cls(f"{match.group(2)}\n--- executor traceback ({description}) ---\n{tail}")
    return cls(f"{description} failed on an executor: {root}\n--- executor traceback ---\n{tail}")


def run_in_job_group(sc: Any, description: str, action: Callable[[], _T], thread_name: str = "torchspark-job") -> _T:
    """Run ``action`` (which submits Spark jobs) on a helper thread under a fresh job group and return its value.

    Ctrl-C (or any exception) on the calling thread cancels the group and waits up to 60 s for the thread; an
    exception raised by ``action`` cancels the group and is re-raised unchanged on the calling thread.
    """
    group = f"torchspark-{uuid.uuid4().hex[:12]}"

    def in_group() -> _T:
        sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            return action()
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)

    try:
        return call_on_thread(in_group, thread_name, on_interrupt=lambda: sc.cancelJobGroup(group))
    except BaseException:
        sc.cancelJobGroup(group)  # a failed action may leave sibling jobs of the group running
        raise


def run_job(sc: Any, description: str, job: Callable[[], _T], thread_name: str = "torchspark-job",
            reported_errors: Callable[[], list[tuple[int, str]]] | None = None) -> _T:
    """Run ``job`` (a callable that submits Spark actions) under its own job group: Ctrl-C (or any error) on the
    caller cancels it; a failed task raises :func:`task_error`.

    Raises:
        TorchSparkError: what :func:`task_error` makes of a failed task; our own errors raised by ``job`` on the
            driver pass unchanged.
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        return run_in_job_group(sc, description, job, thread_name)
    except TorchSparkError:
        raise
    except (PySparkException, Py4JJavaError) as e:
        raise task_error(e, description, reported_errors) from None


def run_barrier_stage(sc: Any, rdd: Any, fn: Callable[[Iterable[Any]], Iterator[WorkerResult]],
                      description: str,
                      reported_errors: Callable[[], list[tuple[int, str]]] | None = None) -> list[WorkerResult]:
    """Run ``fn`` as a barrier stage over ``rdd`` (:func:`run_job`); the workers' results by rank."""
    results: list[WorkerResult] = run_job(sc, description, lambda: rdd.barrier().mapPartitions(fn).collect(),
                                          "torchspark-barrier-stage", reported_errors)
    return sorted(results, key=lambda r: r.rank)
