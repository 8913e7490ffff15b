"""Checks made before a training stage is launched, so misconfiguration fails fast with a clear message
instead of hanging a barrier stage."""

from __future__ import annotations

import re
from typing import Any

from torchspark.errors import SetupError
from torchspark.training.driver.failures import last_line
from torchspark.training.waiting import wait_until

__all__ = ["task_slots", "executor_count", "executors_for_workers_per_node", "probe_executors", "preflight"]

#: how often the driver looks again while executors of a fresh cluster register
_REGISTER_POLL_S = 0.5


def _task_cpus(sc: Any) -> int:
    try:
        return max(1, int(sc.getConf().get("spark.task.cpus", "1")))
    except ValueError:
        return 1


def task_slots(sc: Any) -> int:
    """How many tasks can run at once (what a barrier stage needs one of per worker)."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - private API; fall back to the public estimate
        return max(1, sc.defaultParallelism // _task_cpus(sc))


def executor_count(sc: Any) -> int:
    """Executors registered now (1 in local mode, where the driver is the executor)."""
    try:
        hosts = sc._jsc.sc().getExecutorMemoryStatus().size()  # the driver is listed too
        return max(1, int(hosts) - (0 if sc.master.startswith("local[") or sc.master == "local" else 1))
    except Exception:  # noqa: BLE001 - private API; one executor is the safe guess
        return 1


def _expected_executors(sc: Any) -> int:
    """Executors the session asked for: N of ``local-cluster[N,C,M]``, else ``spark.executor.instances``, else the
    ones registered now."""
    match = re.match(r"local-cluster\[\s*(\d+)", sc.master)
    if match:
        return int(match.group(1))
    try:
        return max(1, int(sc.getConf().get("spark.executor.instances", "0")))
    except ValueError:
        return executor_count(sc)


def executors_for_workers_per_node(sc: Any, workers_per_node: int, wait_s: float = 60.0) -> int:
    """``workers_per_node * executors`` for the executors this session really has, after waiting up to ``wait_s``
    for those it asked for to register.

    Spark deals a stage's tasks round-robin over idle executors, so with ``k`` slots free on every executor each
    one runs ``k`` workers.

    Raises:
        SetupError: an executor has fewer than ``workers_per_node`` task slots (``spark.executor.cores /
            spark.task.cpus``): the workers would not fit ``k`` per executor.
    """
    expected = _expected_executors(sc)
    # executors of a fresh cluster register over a few seconds; nothing to hand-shake with
    wait_until(lambda: executor_count(sc) >= expected, wait_s, _REGISTER_POLL_S)
    executors = executor_count(sc)
    per_executor = task_slots(sc) // executors
    if per_executor < workers_per_node:
        raise SetupError(
            f"workers_per_node={workers_per_node} but the session's {executors} executor(s) have {per_executor} task "
            f"slot(s) each (spark.executor.cores / spark.task.cpus={_task_cpus(sc)}); give every executor at least "
            f"{workers_per_node} cores, lower workers_per_node, or set num_workers instead."
        )
    return workers_per_node * executors


def _probe(_: Any) -> tuple[str, str]:
    """Runs on an executor: (which executor, what it imported). Executors are told apart by host and the absolute
    ``SparkFiles`` directory: an executor's working directory (relative ``"."``; one per executor on standalone,
    YARN and Kubernetes, shared by its Python workers), the driver's temporary directory in local mode."""
    import os
    import socket

    import torch
    from pyspark import SparkFiles

    import torchspark

    return (f"{socket.gethostname()}:{os.path.realpath(SparkFiles.getRootDirectory())}",
            f"torch {torch.__version__}, torchspark {torchspark.__version__}")


def probe_executors(sc: Any, attempts: int = 3) -> dict[str, str]:
    """Import torch and torchspark on every executor; returns ``{executor: versions}``.

    Spark gives a job's tasks to free executors round-robin, so one task per executor reaches each of them on an
    idle cluster; tasks that doubled up on a busy executor are retried with twice as many tasks, up to
    ``attempts`` jobs.

    Raises:
        SetupError: an executor cannot import them (the message names the interpreter to fix), or after
            ``attempts`` jobs some executors were never reached (they are busy: run the fit on an idle session).
    """
    expected = executor_count(sc)
    seen: dict[str, str] = {}
    tasks = expected
    for _ in range(attempts):
        try:
            found = sc.parallelize(range(tasks), tasks).map(_probe).collect()
        except Exception as e:  # noqa: BLE001 - py4j wraps the worker's ImportError
            raise _import_error(sc, e) from None
        seen.update(found)
        if len(seen) >= expected:
            return seen
        tasks *= 2
    raise SetupError(f"the import check reached {len(seen)} of {expected} executors in {attempts} jobs; the others "
                     "ran no task (busy with another job?). Train on a session whose executors are idle.")


def _import_error(sc: Any, e: BaseException) -> SetupError:
    from torchspark.spark.jobs import worker_traceback

    tb = worker_traceback(e)
    python = sc.pythonExec if hasattr(sc, "pythonExec") else "the executors' python"
    return SetupError(
        f"Spark executors cannot import torch/torchspark ({last_line(tb)}) with the interpreter {python}: "
        "install torchspark and torch there, or point PYSPARK_PYTHON (spark.pyspark.python on a cluster) "
        "at an environment that has them.\n" + "\n".join(tb.splitlines()[-6:])
    )


def preflight(sc: Any, num_workers: int, wait_s: float = 60.0, check_imports: bool = True) -> None:
    """Fail fast unless a barrier stage of ``num_workers`` tasks can run.

    Checks: dynamic allocation is off (barrier stages cannot use it); the cluster has ``num_workers`` free task
    slots (waiting up to ``wait_s`` for executors that are still registering); executors import torch and
    torchspark, every one of them (:func:`probe_executors`).
    """
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise SetupError(
            "spark.dynamicAllocation.enabled=true, but barrier stages need a fixed set of executors; "
            "start the session with spark.dynamicAllocation.enabled=false"
        )
    local = conf.get("spark.master", "").startswith("local[")  # no executor registers later
    # executors of a fresh cluster register over a few seconds; nothing to hand-shake with
    wait_until(lambda: task_slots(sc) >= num_workers, wait_s, _REGISTER_POLL_S, give_up=lambda: local)
    slots = task_slots(sc)
    if slots < num_workers:
        raise SetupError(
            f"num_workers={num_workers} but the Spark session has only {slots} task slot(s) "
            f"(spark.task.cpus={_task_cpus(sc)}); a barrier stage needs one free slot per worker. "
            "Lower num_workers or add executors/cores."
        )
    if check_imports:
        probe_executors(sc)
