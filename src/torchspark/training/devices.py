"""Which device a worker trains on: the GPU Spark assigned to its task, or the CPU.

Spark reports GPU *addresses* (as the discovery script printed them, usually physical indices). When the
executor already restricts visibility with ``CUDA_VISIBLE_DEVICES``, torch numbers the visible GPUs from 0, so
an address must be re-indexed through that list (TorchDistributor does the same).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from torchspark.errors import SetupError

__all__ = ["device_for_task", "backend_for_device", "gpu_addresses", "flush_denormals"]


def device_for_task(
    gpu_addresses: Sequence[str] | None,
    cuda_visible_devices: str | None,
    cuda_available: bool,
) -> str:
    """The torch device string for a task.

    Args:
        gpu_addresses: ``TaskContext.resources()["gpu"].addresses`` (None or empty when no GPU was assigned).
        cuda_visible_devices: the executor's ``CUDA_VISIBLE_DEVICES`` (None when unset).
        cuda_available: ``torch.cuda.is_available()`` in the worker.
    Returns:
        ``"cpu"`` or ``"cuda:<index>"`` (the first assigned GPU, re-indexed through ``CUDA_VISIBLE_DEVICES``).
    Raises:
        SetupError: a GPU was assigned but CUDA is unavailable, or the address is not among the visible devices.
    """
    if not gpu_addresses:
        return "cpu"
    address = str(gpu_addresses[0]).strip()
    if not cuda_available:
        raise SetupError(
            f"Spark assigned GPU {address!r} to this task but torch has no CUDA here; install a CUDA build of "
            "torch on the executors or drop spark.task.resource.gpu.amount"
        )
    if cuda_visible_devices is not None and cuda_visible_devices.strip() != "":
        visible = [v.strip() for v in cuda_visible_devices.split(",")]
        if address not in visible:
            raise SetupError(
                f"Spark assigned GPU {address!r} but CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} hides it; "
                "make the GPU discovery script and CUDA_VISIBLE_DEVICES agree"
            )
        return f"cuda:{visible.index(address)}"
    if not address.isdigit():
        raise SetupError(f"GPU address {address!r} is not an index; set CUDA_VISIBLE_DEVICES on the executors")
    return f"cuda:{int(address)}"


def backend_for_device(device: str) -> str:
    """gloo for CPU workers, nccl for CUDA workers."""
    return "nccl" if device.startswith("cuda") else "gloo"


def gpu_addresses(resources: Mapping[str, object]) -> list[str]:
    """GPU addresses from a ``TaskContext.resources()`` mapping (objects with ``.addresses``)."""
    info = resources.get("gpu")
    if info is None:
        return []
    return [str(a) for a in getattr(info, "addresses", [])]


def flush_denormals(on: bool) -> None:
    """Set flush-to-zero / denormals-are-zero for this thread and the torch CPU threads it starts from now on.

    ``torch.set_flush_denormal`` sets the calling thread's floating-point mode; threads inherit it when they are
    created, so call this before the first parallel torch operation of a worker (torch's intra-op pool is created
    lazily): pool threads that already exist keep their mode. A no-op on CPUs without the feature.
    """
    import torch

    torch.set_flush_denormal(bool(on))
