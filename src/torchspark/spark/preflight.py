"""Checks made before a training stage is launched, so misconfiguration fails fast with a clear message
instead of hanging a barrier stage."""

from __future__ import annotations

import time
from typing import Any

from torchspark.errors import SetupError

__all__ = ["task_slots", "executor_count", "preflight"]


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


def _probe(_: Any) -> str:
    import torch

    import torchspark

    return f"torch {torch.__version__}, torchspark {torchspark.__version__}"


def preflight(sc: Any, num_workers: int, wait_s: float = 60.0, check_imports: bool = True) -> None:
    """Fail fast unless a barrier stage of ``num_workers`` tasks can run.

    Checks: dynamic allocation is off (barrier stages cannot use it); the cluster has ``num_workers`` free task
    slots (waiting up to ``wait_s`` for executors that are still registering); executors import torch and
    torchspark.
    """
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise SetupError(
            "spark.dynamicAllocation.enabled=true, but barrier stages need a fixed set of executors; "
            "start the session with spark.dynamicAllocation.enabled=false"
        )
    deadline = time.monotonic() + wait_s
    slots = task_slots(sc)
    while slots < num_workers and time.monotonic() < deadline and not conf.get("spark.master", "").startswith(
        "local["
    ):
        time.sleep(0.5)  # executors of a fresh cluster register over a few seconds; nothing to hand-shake with
        slots = task_slots(sc)
    if slots < num_workers:
        raise SetupError(
            f"num_workers={num_workers} but the Spark session has only {slots} task slot(s) "
            f"(spark.task.cpus={_task_cpus(sc)}); a barrier stage needs one free slot per worker. "
            "Lower num_workers or add executors/cores."
        )
    if check_imports:
        try:
            sc.parallelize([0], 1).map(_probe).collect()
        except Exception as e:  # noqa: BLE001 - py4j wraps the worker's ImportError
            from torchspark.spark.jobs import worker_traceback

            tb = worker_traceback(e)
            cause = [ln.strip() for ln in tb.splitlines() if ln.strip()][-1:] or ["unknown error"]
            python = sc.pythonExec if hasattr(sc, "pythonExec") else "the executors' python"
            raise SetupError(
                f"Spark executors cannot import torch/torchspark ({cause[0]}) with the interpreter {python}: "
                "install torchspark and torch there, or point PYSPARK_PYTHON (spark.pyspark.python on a cluster) "
                "at an environment that has them.\n" + "\n".join(tb.splitlines()[-6:])
            ) from None
