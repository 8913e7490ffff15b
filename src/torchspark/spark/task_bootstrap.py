"""What every torchspark Spark task does first: take the GPU Spark assigned to it and learn its cores.

One function for every kind of task (the barrier stage's workers, the rounds route's partitions, and the coming
Spark Connect route's ``mapInArrow`` barrier tasks): it takes the task's context object (a ``TaskContext`` or
``BarrierTaskContext``, anything with ``resources()`` and ``cpus()``) as a parameter rather than looking it up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torchspark.training.worker import env as task_env
from torchspark.training.worker.devices import device_for_task, gpu_addresses

__all__ = ["TaskSetup", "set_up_task"]


@dataclass(frozen=True)
class TaskSetup:
    """Where a task trains: its torch device (``"cpu"``, ``"cuda:0"``...) and its CPU cores (``spark.task.cpus``,
    at least 1)."""

    device: str
    cpus: int

    def threads(self, requested: int | None = None) -> int:
        """Torch threads for the task: ``requested`` when set, else one per core of the task."""
        return requested or self.cpus


def set_up_task(ctx: Any | None) -> TaskSetup:
    """Pick the task's device and make it this process's current CUDA device; count its cores.

    The device is the first GPU Spark assigned to the task (``ctx.resources()["gpu"]``), re-indexed through the
    executor's ``CUDA_VISIBLE_DEVICES`` (:func:`~torchspark.training.worker.devices.device_for_task`), else the CPU.
    Without a context (code run outside a Spark task) or a context without ``cpus()`` the task gets the CPU / one core.

    Example: in a barrier task, ``setup = set_up_task(BarrierTaskContext.get())`` -> ``TaskSetup("cuda:0", 4)``.

    Raises:
        SetupError: a GPU was assigned but CUDA is unavailable here, or ``CUDA_VISIBLE_DEVICES`` hides it.
    """
    if ctx is None:
        return TaskSetup("cpu", 1)
    device = device_for_task(gpu_addresses(ctx.resources()), task_env.read(task_env.CUDA_VISIBLE_DEVICES),
                             torch.cuda.is_available())
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    cpus = max(1, int(ctx.cpus())) if callable(getattr(ctx, "cpus", None)) else 1
    return TaskSetup(device, cpus)
