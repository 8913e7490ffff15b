"""Running one Spark action on the driver and turning a failed task into our error.

A task that raised :class:`~torchspark.errors.DataError` (a bad feature shape, a non-DataSet RDD item, ...) reaches
the driver as a Py4J/PySpark exception whose text holds the executor's Python traceback. :func:`run_job` digs that
traceback out and raises the same torchspark error class with the executor's message first and its traceback
below, so callers catch ``DataError`` whether the data was checked on the driver or on an executor. Any other task
failure becomes a :class:`~torchspark.errors.WorkerError` with the traceback. Every job runs under its own job
group, so Ctrl-C (or an error) on the driver cancels it.
"""

from __future__ import annotations

import re
from typing import Any, Callable, TypeVar

from torchspark import errors
from torchspark.errors import TorchSparkError, WorkerError
from torchspark.training.runner import traceback_tail

__all__ = ["run_job", "task_error"]

_T = TypeVar("_T")
_PY_TRACE = re.compile(r"(Traceback \(most recent call last\):.*?)(?:\n\tat |\n\s*at org\.apache|\Z)", re.S)
_OUR_ERROR = re.compile(r"^torchspark\.errors\.(\w+): (.*)$")


def task_error(error: BaseException, description: str) -> TorchSparkError:
    """Our error for a failed Spark task: the executor's DataError/ConfigError/... class when it raised one."""
    found = _PY_TRACE.findall(str(error))
    tb = found[-1] if found else str(error)
    lines = [ln for ln in tb.strip().splitlines() if ln.strip() and not ln.strip().startswith("SQLSTATE")]
    root = lines[-1].strip() if lines else str(error)
    tail = traceback_tail("\n".join(lines))
    match = _OUR_ERROR.match(root)
    cls = getattr(errors, match.group(1), None) if match else None
    if isinstance(cls, type) and issubclass(cls, TorchSparkError) and cls is not WorkerError:
        return cls(f"{match.group(2)}\n--- executor traceback ({description}) ---\n{tail}")  # type: ignore[union-attr]
    return WorkerError(f"{description} failed on an executor: {root}\n--- executor traceback ---\n{tail}")


def run_job(sc: Any, description: str, job: Callable[[], _T], group_prefix: str = "torchspark-job") -> _T:
    """Run ``job`` (a callable that submits Spark actions) under its own job group: Ctrl-C (or any error) on the
    caller cancels it; a failed task raises our error class (DataError, ...) with the executor traceback.

    Raises:
        TorchSparkError: the error an executor raised (same class when it was one of ours, else WorkerError).
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from torchspark.spark.barrier import run_in_job_group

    try:
        return run_in_job_group(sc, description, job, group_prefix)
    except (PySparkException, Py4JJavaError) as e:
        raise task_error(e, description) from None
