"""Which device a worker trains on: the GPU Spark assigned to its task, or the CPU.

Spark reports GPU *addresses* (as the discovery script printed them, usually physical indices). When the
executor already restricts visibility with ``CUDA_VISIBLE_DEVICES``, torch numbers the visible GPUs from 0, so
an address must be re-indexed through that list (TorchDistributor does the same).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping, Sequence

from torchspark.errors import SetupError

__all__ = ["device_for_task", "backend_for_device", "pins_memory", "gpu_addresses", "flush_denormals",
           "denormals_flushed", "task_thread_settings"]


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


def pins_memory(pin_memory: bool | None, device: str) -> bool:
    """Whether a worker on ``device`` loads its minibatches into pinned host memory (the master's ``pin_memory``).

    Pinned (page-locked) memory is what lets ``tensor.to("cuda", non_blocking=True)`` return at once and the copy
    run beside the GPU's compute; from ordinary (pageable) memory the copy waits for the host. Pinning needs CUDA
    and only helps a copy to a CUDA device, so a CPU worker never pins, whatever the option says.

    Args:
        pin_memory: the option: None (auto) or True pin on CUDA, False never pins.
        device: the worker's torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
    Returns:
        True only for a CUDA device with ``pin_memory`` not False.

    Example: ``pins_memory(None, "cuda:0")`` is True; ``pins_memory(True, "cpu")`` is False.
    """
    return pin_memory is not False and str(device).startswith("cuda")


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


def denormals_flushed() -> bool:
    """Whether this thread flushes denormals to zero now (torch has no getter: a denormal that survives one
    multiplication says no; with flush-to-zero or denormals-are-zero it comes out 0)."""
    import torch

    return bool((torch.full((1,), 1e-39, dtype=torch.float32) * 2.0).item() == 0.0)


@contextmanager
def task_thread_settings(num_threads: int | None, flush_denormal: bool) -> Iterator[None]:
    """Run a training task with ``num_threads`` torch intra-op threads (None: leave them) and, when
    ``flush_denormal``, denormals flushed on this thread; put back what was there when the task ends.

    Spark reuses its Python workers (``spark.python.worker.reuse``, on by default): without the restore, the next
    task in the process (an evaluation, or the user's own ``mapPartitions``) would run with this task's thread count
    and floating-point mode. Threads of torch's pool started during the task keep the mode they were born with
    (see :func:`flush_denormals`); the calling thread and the thread count are restored. The thread count is put
    back only if it is still the one set here (a concurrent task in the process may have set its own since).
    """
    import torch

    previous_threads = torch.get_num_threads()
    previous_flush = denormals_flushed() if flush_denormal else False
    threads = max(1, int(num_threads)) if num_threads else None
    if threads is not None:
        torch.set_num_threads(threads)
    if flush_denormal:  # before the task's first torch work: torch's CPU threads inherit the mode when created
        flush_denormals(True)
    try:
        yield
    finally:
        if flush_denormal:
            flush_denormals(previous_flush)
        if threads is not None and torch.get_num_threads() == threads:
            torch.set_num_threads(previous_threads)
