"""Checks made before a training stage is launched, so misconfiguration fails fast with a clear message
instead of hanging a barrier stage."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torchspark.errors import SetupError
from torchspark.spark.gpus import GpuPlan
from torchspark.spark.task_bootstrap import executor_name
from torchspark.training.driver.failures import last_line
from torchspark.training.waiting import wait_until

__all__ = [
    "task_slots",
    "executor_count",
    "executors_for_workers_per_node",
    "probe_executors",
    "probe_each_executor",
    "ExecutorCuda",
    "cuda_problems",
    "check_executor_cuda",
    "preflight",
    "DYNAMIC_ALLOCATION_REFUSED",
    "too_few_slots",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: how often the driver looks again while executors of a fresh cluster register
_REGISTER_POLL_S = 0.5


def _task_cpus(sc: Any) -> int:
    try:
        return max(1, int(sc.getConf().get("spark.task.cpus", "1")))
    except ValueError:
        return 1


def task_slots(sc: Any, profile: Any = None) -> int:
    """How many tasks can run at once (what a barrier stage needs one of per worker): of the session's default
    resource profile, or of ``profile`` (a registered ``ResourceProfile``: the training stage's GPUs count too)."""
    try:
        jsc = sc._jsc.sc()
        manager = jsc.resourceProfileManager()
        jprofile = (
            manager.defaultResourceProfile() if profile is None else manager.resourceProfileFromId(int(profile.id))
        )
        return int(jsc.maxNumConcurrentTasks(jprofile))
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
    ``SparkFiles`` directory (`executor_name`): an executor's working
    directory (relative ``"."``; one per executor on standalone, YARN and Kubernetes, shared by its Python
    workers), the driver's temporary directory in local mode."""
    import torch

    import torchspark

    return executor_name(), f"torch {torch.__version__}, torchspark {torchspark.__version__}"


def probe_executors(sc: Any, attempts: int = 3) -> dict[str, str]:
    """Import torch and torchspark on every executor; returns ``{executor: versions}``.

    Spark gives a job's tasks to free executors round-robin, so one task per executor reaches each of them on an
    idle cluster; tasks that doubled up on a busy executor are retried with twice as many tasks, up to
    ``attempts`` jobs.

    Raises:
        SetupError: an executor cannot import them (the message names the interpreter to fix), or after
            ``attempts`` jobs some executors were never reached (they are busy: run the fit on an idle session).
    """
    return probe_each_executor(sc, _probe, "the import check", attempts)


def probe_each_executor(sc: Any, probe: Callable[[Any], tuple[str, _T]], what: str, attempts: int = 3) -> dict[str, _T]:
    """Run ``probe`` (module level; returns ``(executor_name(), finding)``) on every executor; ``{executor:
    finding}``. One task per executor reaches each of them on an idle cluster (round-robin); tasks that doubled up
    on a busy executor are retried with twice as many tasks, up to ``attempts`` jobs.

    Raises:
        SetupError: an executor cannot import torch/torchspark, or some were never reached (``what`` names the
            check in the message).
    """
    expected = executor_count(sc)
    seen: dict[str, _T] = {}
    tasks = expected
    for _ in range(attempts):
        try:
            found = sc.parallelize(range(tasks), tasks).map(probe).collect()
        except Exception as e:  # noqa: BLE001 - py4j wraps the worker's ImportError
            raise _import_error(sc, e) from None
        seen.update(found)
        if len(seen) >= expected:
            return seen
        tasks *= 2
    raise SetupError(
        f"{what} reached {len(seen)} of {expected} executors in {attempts} jobs; the others ran no "
        "task (busy with another job?). Train on a session whose executors are idle."
    )


def _import_error(sc: Any, e: BaseException) -> SetupError:
    from torchspark.spark.jobs import worker_traceback

    tb = worker_traceback(e)
    python = sc.pythonExec if hasattr(sc, "pythonExec") else "the executors' python"
    return SetupError(
        f"Spark executors cannot import torch/torchspark ({last_line(tb)}) with the interpreter {python}: "
        "install torchspark and torch there, or point PYSPARK_PYTHON (spark.pyspark.python on a cluster) "
        "at an environment that has them.\n" + "\n".join(tb.splitlines()[-6:])
    )


@dataclass(frozen=True)
class ExecutorCuda:
    """What torch on one executor offers for GPUs: its version, whether CUDA works there, and the CUDA version it
    was built for (``torch.version.cuda``; None for a CPU-only build)."""

    torch_version: str
    cuda_available: bool
    cuda_version: str | None


def _probe_cuda(_: Any) -> tuple[str, ExecutorCuda]:
    """Runs on an executor: (which executor, its torch's CUDA)."""
    import torch

    return executor_name(), ExecutorCuda(torch.__version__, bool(torch.cuda.is_available()), torch.version.cuda)


def cuda_problems(executors: dict[str, ExecutorCuda], driver_cuda: str | None) -> list[str]:
    """One line per executor whose torch cannot train on the GPUs Spark will give its tasks (a pure function).

    Args:
        executors: `ExecutorCuda` by executor name.
        driver_cuda: the driver's ``torch.version.cuda`` (None: the driver has no CUDA build, so any CUDA version
            on the executors will do).
    Returns:
        ``"executor <name>: torch <version> has no CUDA (a CPU-only build)"`` (or ``"... CUDA unavailable"``),
        ``"executor <name>: torch <version> is built for CUDA 12.1, the driver's for CUDA 12.4"``; empty when
        every executor is fine.
    """
    problems = []
    for name, found in sorted(executors.items()):
        if not found.cuda_available:
            why = (
                "a CPU-only build"
                if found.cuda_version is None
                else f"built for CUDA {found.cuda_version}, but no GPU or driver is usable"
            )
            problems.append(f"executor {name}: torch {found.torch_version} has no CUDA ({why})")
        elif driver_cuda is not None and found.cuda_version != driver_cuda:
            problems.append(
                f"executor {name}: torch {found.torch_version} is built for CUDA {found.cuda_version}, "
                f"the driver's for CUDA {driver_cuda}"
            )
    return problems


def check_executor_cuda(sc: Any, gpus: GpuPlan) -> None:
    """When the training tasks get GPUs, check torch on every executor can use them, before any training stage.

    Raises:
        SetupError: naming each executor whose torch has no CUDA (or a CUDA version other than the driver's), and
            what to install.
    """
    if not gpus.requested:
        return
    if gpus.dry_run:
        log.warning("GPU dry run: the executors' CUDA is not checked (%s)", gpus.request.source)
        return
    import torch

    driver_cuda = torch.version.cuda
    problems = cuda_problems(probe_each_executor(sc, _probe_cuda, "the CUDA check"), driver_cuda)
    if problems:
        wheel = f"cu{driver_cuda.replace('.', '')}" if driver_cuda else "cu<the executors' CUDA, e.g. 126>"
        raise SetupError(
            f"{gpus.request.source} gives every training task a GPU, but torch on the executors cannot use it:\n  "
            + "\n  ".join(problems)
            + "\nInstall a CUDA build of torch on every executor"
            + (f" for CUDA {driver_cuda}, as the driver's" if driver_cuda else "")
            + f" (`pip install torch=={torch.__version__.split('+')[0]} --index-url "
            f"https://download.pytorch.org/whl/{wheel}`) and check that `nvidia-smi` works there; or drop the GPU "
            "request (gpus_per_worker / spark.task.resource.gpu.amount) to train on the CPU."
        )


#: why a session with dynamic allocation cannot run the training stage (classic and Connect say the same)
DYNAMIC_ALLOCATION_REFUSED = (
    "spark.dynamicAllocation.enabled=true, but barrier stages need a fixed set of executors; "
    "start the session with spark.dynamicAllocation.enabled=false"
)


def too_few_slots(num_workers: int, slots: int, task_cpus: int, per_task: str = "") -> SetupError:
    """The error of a barrier stage of ``num_workers`` tasks on a cluster of ``slots`` task slots (classic and
    Connect say the same); ``per_task``: the GPU request of a task, when there is one."""
    return SetupError(
        f"num_workers={num_workers} but the Spark session has only {slots} task slot(s) "
        f"(spark.task.cpus={task_cpus}{per_task}); a barrier stage needs one free slot per worker. "
        "Lower num_workers or add executors/cores" + (" / GPUs." if per_task else ".")
    )


def preflight(
    sc: Any,
    num_workers: int,
    wait_s: float = 60.0,
    check_imports: bool = True,
    gpus: GpuPlan | None = None,
    check_cuda: bool = True,
) -> None:
    """Fail fast unless a barrier stage of ``num_workers`` tasks can run.

    Checks: dynamic allocation is off (barrier stages cannot use it); the cluster has ``num_workers`` free task
    slots (of the training stage's resource profile with ``gpus``: a task needs its GPUs free too; waiting up to
    ``wait_s`` for executors that are still registering); executors import torch and torchspark, every one of
    them (`probe_executors`); with GPUs requested and ``check_cuda``, torch on every executor has CUDA, of
    the driver's version when the driver has one
    (`check_executor_cuda`).
    """
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise SetupError(DYNAMIC_ALLOCATION_REFUSED)
    local = conf.get("spark.master", "").startswith("local[")  # no executor registers later
    # executors of a fresh cluster register over a few seconds; nothing to hand-shake with
    profile = gpus.profile if gpus is not None else None
    wait_until(lambda: task_slots(sc, profile) >= num_workers, wait_s, _REGISTER_POLL_S, give_up=lambda: local)
    slots = task_slots(sc, profile)
    if slots < num_workers:
        per_task = f", {gpus.request.source}" if gpus is not None and gpus.requested else ""
        raise too_few_slots(num_workers, slots, _task_cpus(sc), per_task)
    if check_imports:
        probe_executors(sc)
    if gpus is not None and check_cuda:
        check_executor_cuda(sc, gpus)
