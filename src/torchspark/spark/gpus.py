"""GPUs for the training stage: what the session and the master ask for, and the stage-level resource profile.

Spark hands GPUs to tasks, not to processes: an executor owns the GPUs its discovery script reported
(``spark.executor.resource.gpu.amount``), and a task gets ``spark.task.resource.gpu.amount`` of them, by address
(``TaskContext.resources()["gpu"].addresses``); Spark never gives one address to two tasks at once unless the
amount is a fraction. A worker trains on the GPU of its task (`torchspark.spark.task_bootstrap`).

Two ways to ask:

* the session's defaults (``spark.task.resource.gpu.amount``): every task of the session holds a GPU, also the
  data preparation and evaluation ones;
* the master's ``gpus_per_worker`` (defaults CPU-only): only the training stage runs under a stage-level task
  ``ResourceProfile`` (`plan_gpus`) asking that many GPUs per task, so other stages leave the GPUs free. Spark
  supports such task profiles without dynamic allocation on standalone (and ``local-cluster``), YARN and
  Kubernetes, not in local mode; the executors must already own GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchspark.errors import ConfigError, SetupError
from torchspark.training.worker import env as task_env

__all__ = [
    "GpuPlan",
    "GpuRequest",
    "gpu_request",
    "plan_gpus",
    "dry_run_requested",
    "with_training_resources",
    "TASK_GPUS",
    "EXECUTOR_GPUS",
]

log = logging.getLogger(__name__)

#: the session's GPUs per task (every stage's tasks)
TASK_GPUS = "spark.task.resource.gpu.amount"
#: GPUs every executor owns (found by ``spark.executor.resource.gpu.discoveryScript``)
EXECUTOR_GPUS = "spark.executor.resource.gpu.amount"


@dataclass(frozen=True)
class GpuRequest:
    """What the training stage's tasks ask: ``per_task`` GPUs each (0: none), through a stage-level profile when
    ``stage_level`` (else the session's defaults give them), and who asked (``source``, for messages)."""

    per_task: float = 0.0
    stage_level: bool = False
    source: str = ""


@dataclass(frozen=True)
class GpuPlan:
    """The training stage's GPUs, as the runners apply them.

    Args:
        request: what the tasks ask (`gpu_request`).
        profile: the ``pyspark.resource.ResourceProfile`` attached to the training stage (None: the session's
            defaults apply).
        dry_run: a testing aid (`dry_run_requested`): tasks record the GPU addresses Spark assigned and train
            on the CPU; the preflight's CUDA check is skipped.
    """

    request: GpuRequest = GpuRequest()
    profile: Any = None
    dry_run: bool = False

    @property
    def requested(self) -> bool:
        """Whether the training tasks get GPUs."""
        return self.request.per_task > 0


def _amount(conf: Mapping[str, str], key: str) -> float:
    try:
        return float(conf.get(key) or 0)
    except ValueError:
        raise ConfigError(f"{key}={conf.get(key)!r} is not a number; set it to a GPU amount such as 1") from None


def gpu_request(conf: Mapping[str, str], master_url: str, gpus_per_worker: float | None) -> GpuRequest:
    """Decide how the training stage gets GPUs (a pure function of the session's settings and the option).

    Args:
        conf: the session's Spark settings (``dict(sc.getConf().getAll())``).
        master_url: the session's master (``sc.master``).
        gpus_per_worker: the training master's ``gpus_per_worker`` (None: the session's defaults).
    Returns:
        the session's ``spark.task.resource.gpu.amount`` when ``gpus_per_worker`` is None or the same amount;
        else ``gpus_per_worker`` through a stage-level profile.
    Raises:
        ConfigError: a stage-level profile is needed where it cannot work: local mode (no stage-level scheduling),
            executors without GPUs, or more GPUs per task than an executor owns.

    Example: ``gpu_request({"spark.executor.resource.gpu.amount": "2"}, "spark://h:7077", 1)`` ->
    ``GpuRequest(1, stage_level=True, source="gpus_per_worker=1")``.
    """
    session = _amount(conf, TASK_GPUS)
    if gpus_per_worker is None or gpus_per_worker == session:
        return GpuRequest(session, False, f"{TASK_GPUS}={conf.get(TASK_GPUS)}" if session else "")
    asked = f"gpus_per_worker={gpus_per_worker}"
    if master_url == "local" or master_url.startswith("local["):
        raise ConfigError(
            f"{asked} needs stage-level scheduling, which Spark does not offer in local mode (master "
            f"{master_url!r}); run on a cluster manager (spark://, YARN, Kubernetes, local-cluster), "
            f"or leave gpus_per_worker unset and give the session {TASK_GPUS}"
        )
    executor = _amount(conf, EXECUTOR_GPUS)
    if executor <= 0:
        raise ConfigError(
            f"{asked} asks GPUs for the training tasks, but the session's executors own none: set "
            f"{EXECUTOR_GPUS} and spark.executor.resource.gpu.discoveryScript (on standalone also "
            "spark.worker.resource.gpu.amount and its discoveryScript), or leave gpus_per_worker unset"
        )
    if gpus_per_worker > executor:
        raise ConfigError(
            f"{asked} but every executor owns {EXECUTOR_GPUS}={conf.get(EXECUTOR_GPUS)}: a task "
            "cannot get more GPUs than its executor has; lower gpus_per_worker or give executors more"
        )
    return GpuRequest(float(gpus_per_worker), True, asked)


def dry_run_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``TORCHSPARK_GPU_DRY_RUN=1`` is set in the driver's environment (``env``: default this process's).

    A testing aid, not for training: GPU scheduling can then be checked on machines without CUDA, with a discovery
    script that reports fake addresses (as Spark's own tests do). The tasks Spark gives a GPU record its address
    (``WorkerResult.gpu_addresses``, the stats summary's ``gpu_addresses``) and train on the CPU, instead of failing
    for want of CUDA; the preflight's CUDA check is skipped (with a warning).
    """
    return task_env.read(task_env.GPU_DRY_RUN, env) in ("1", "true", "yes")


def plan_gpus(sc: Any, gpus_per_worker: float | None, dry_run: bool = False) -> GpuPlan:
    """The training stage's `GpuPlan` on session ``sc``; builds (and registers with Spark, so that its task
    slots can be counted) the stage-level profile when `gpu_request` says so.

    Raises:
        ConfigError: as `gpu_request`.
        SetupError: Spark refused the profile (its reason is quoted).
    """
    request = gpu_request(dict(sc.getConf().getAll()), sc.master, gpus_per_worker)
    if dry_run and request.per_task > 0:
        log.warning(
            "%s=1: tasks record the GPUs Spark assigns but train on the CPU (a testing aid)", task_env.GPU_DRY_RUN
        )
    if not request.stage_level:
        return GpuPlan(request, None, dry_run)
    from py4j.protocol import Py4JJavaError
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    profile = (
        ResourceProfileBuilder().require(TaskResourceRequests().cpus(cpus).resource("gpu", request.per_task)).build
    )
    try:
        sc.emptyRDD().withResources(profile)  # registers it; Spark checks here that the cluster supports it
    except Py4JJavaError as e:
        reason = str(e.java_exception.getMessage()) if e.java_exception is not None else str(e)
        raise SetupError(
            f"{request.source}: Spark refused the training stage's resource profile: {reason}. Leave "
            f"gpus_per_worker unset and give the session {TASK_GPUS} instead"
        ) from None
    log.info(
        "the training stage asks %s GPU(s) and %d core(s) per task (stage-level resource profile %d)",
        request.per_task,
        cpus,
        profile.id,
    )
    return GpuPlan(request, profile, dry_run)


def with_training_resources(rdd: Any, plan: GpuPlan | None) -> Any:
    """``rdd`` under the plan's stage-level profile (the stage that computes it asks its GPUs), or ``rdd``."""
    if plan is None or plan.profile is None:
        return rdd
    return rdd.withResources(plan.profile)
