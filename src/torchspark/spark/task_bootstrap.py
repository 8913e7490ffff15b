"""What every torchspark Spark task does first: take the GPU Spark assigned to it and learn its cores.

One function for every kind of task (the barrier stage's workers, the rounds route's partitions, and the coming
Spark Connect route's ``mapInArrow`` barrier tasks): it takes the task's context object (a ``TaskContext`` or
``BarrierTaskContext``, anything with ``resources()`` and ``cpus()``) as a parameter rather than looking it up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchspark.training.worker import env as task_env
from torchspark.training.worker.devices import device_for_task, gpu_addresses

if TYPE_CHECKING:  # the body (and the training loop it imports) loads when a runner builds a WorkerEnv
    from torchspark.training.worker.body import WorkerEnv

__all__ = ["TaskSetup", "set_up_task", "executor_name"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSetup:
    """Where a task trains: its torch device (``"cpu"``, ``"cuda:0"``...), its CPU cores (``spark.task.cpus``, at
    least 1) and the GPU addresses Spark assigned to it (empty: none; what a worker reports as its
    ``gpu_addresses``)."""

    device: str
    cpus: int
    gpu_addresses: tuple[str, ...] = ()

    def worker_env(self, rank: int, **kwargs: Any) -> WorkerEnv:
        """The `WorkerEnv` of this task as rank ``rank``: its device, one torch thread per core, and its placement
        (GPU addresses, executor); ``kwargs`` are the runner's other `WorkerEnv` fields (rendezvous, progress...)."""
        from torchspark.training.worker.body import WorkerEnv

        return WorkerEnv(rank, self.device, self.cpus, placement=(self.gpu_addresses, executor_name()), **kwargs)


def set_up_task(ctx: Any | None, gpu_dry_run: bool = False) -> TaskSetup:
    """Pick the task's device (`worker_main` makes it this process's current CUDA device); count its cores.

    The device is the first GPU Spark assigned to the task (``ctx.resources()["gpu"]``), re-indexed through the
    executor's ``CUDA_VISIBLE_DEVICES`` ([`device_for_task`][torchspark.training.device_for_task]), else the CPU.
    Without a context (code run outside a Spark task) or a context without ``cpus()`` the task gets the CPU / one core.

    Args:
        ctx: the task's ``TaskContext`` / ``BarrierTaskContext`` (None outside Spark).
        gpu_dry_run: a testing aid (`torchspark.spark.gpus.dry_run_requested`): record the assigned GPU
            addresses but train on the CPU, so GPU scheduling can be checked where torch has no CUDA.

    Example: in a barrier task, ``setup = set_up_task(BarrierTaskContext.get())`` ->
    ``TaskSetup("cuda:0", 4, ("0",))``.

    Raises:
        SetupError: a GPU was assigned but CUDA is unavailable here, or ``CUDA_VISIBLE_DEVICES`` hides it.
    """
    if ctx is None:
        return TaskSetup("cpu", 1)
    addresses = tuple(gpu_addresses(ctx.resources()))
    cpus = max(1, int(ctx.cpus())) if callable(getattr(ctx, "cpus", None)) else 1
    if gpu_dry_run and addresses:
        log.warning("GPU dry run: Spark assigned GPU(s) %s to this task; it trains on the CPU", list(addresses))
        return TaskSetup("cpu", cpus, addresses)
    device = device_for_task(addresses, task_env.read(task_env.CUDA_VISIBLE_DEVICES), torch.cuda.is_available())
    return TaskSetup(device, cpus, addresses)


def executor_name() -> str:
    """This executor as the preflight and the fit's summary name it: ``<host>:<working directory>`` (the
    directory's last part is the executor id on standalone: ``.../work/app-2024.../1``; the container on YARN and
    Kubernetes; in local mode the driver's temporary directory). Call it inside a Spark task."""
    import os
    import socket

    from pyspark import SparkFiles

    return f"{socket.gethostname()}:{os.path.realpath(SparkFiles.getRootDirectory())}"
