"""Which device a worker trains on: the GPU Spark assigned to its task, or the CPU.

Spark reports GPU *addresses* (as the discovery script printed them, usually physical indices). When the
executor already restricts visibility with ``CUDA_VISIBLE_DEVICES``, torch numbers the visible GPUs from 0, so
an address must be re-indexed through that list (TorchDistributor does the same).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torchspark.errors import SetupError

__all__ = [
    "device_for_task",
    "backend_for_device",
    "BackendChoice",
    "choose_backend",
    "backend_for_devices",
    "agree_backend",
    "DEVICES_KEY",
    "gpu_identity",
    "pins_memory",
    "gpu_addresses",
    "flush_denormals",
    "denormals_flushed",
    "task_thread_settings",
]

log = logging.getLogger(__name__)


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
    """gloo for a CPU worker, nccl for a CUDA worker (one worker's view; a group decides with
    `choose_backend`)."""
    return "nccl" if device.startswith("cuda") else "gloo"


@dataclass(frozen=True)
class BackendChoice:
    """The process group's backend the workers agreed on, and why (for the log)."""

    backend: str
    reason: str


def choose_backend(devices: Sequence[str], gpus: Sequence[str] | None = None) -> BackendChoice:
    """The backend for a group whose rank ``r`` trains on ``devices[r]``: nccl when every worker has a GPU of its
    own, gloo otherwise.

    nccl moves CUDA tensors only and refuses two ranks on one GPU, so a group with a CPU worker (a mix: some
    executors without GPUs, or tasks Spark gave no GPU) or with a shared GPU (fractional
    ``spark.task.resource.gpu.amount``) runs gloo; gloo sums through host memory, slower but correct. Every rank
    computes this from the same gathered list, so all pick the same backend.

    Args:
        devices: every rank's torch device, in rank order (``"cpu"``, ``"cuda:0"``...).
        gpus: every rank's physical GPU (`gpu_identity`: host and UUID), where device names alone do not say
            which GPU it is (``"cuda:0"`` on two hosts are two GPUs); default: the device names (one host).
    Example: ``choose_backend(["cuda:0", "cpu"]).backend == "gloo"``.
    """
    ids = list(devices if gpus is None else gpus)
    on_cpu = [r for r, d in enumerate(devices) if not d.startswith("cuda")]
    if on_cpu:
        if len(on_cpu) == len(devices):
            return BackendChoice("gloo", "every worker trains on the CPU")
        return BackendChoice(
            "gloo",
            f"worker(s) {on_cpu} train on the CPU and the others on CUDA (a mix of "
            "devices; nccl needs every worker on a GPU)",
        )
    shared = sorted({g for g in ids if ids.count(g) > 1})
    if shared:
        ranks = [r for r, g in enumerate(ids) if g in shared]
        return BackendChoice(
            "gloo",
            f"worker(s) {ranks} share a GPU ({', '.join(shared)}), which nccl refuses "
            "(a fractional spark.task.resource.gpu.amount?)",
        )
    return BackendChoice("nccl", "every worker trains on a GPU of its own")


def backend_for_devices(devices: Sequence[str], gpus: Sequence[str] | None = None) -> str:
    """`choose_backend`'s backend: nccl when every worker has its own GPU; gloo otherwise (CPU, mixed, or a
    GPU shared by several workers, which nccl refuses)."""
    return choose_backend(devices, gpus).backend


#: the store keys under which every rank posts its device (behind the fit's private prefix)
DEVICES_KEY = "torchspark-devices"


def agree_backend(store: Any, rank: int, world: int, device: str, gpu: str | None = None) -> BackendChoice:
    """The group's backend, the same on every rank: each rank posts its device and physical GPU (``gpu``,
    `gpu_identity`; default ``device``) to the rendezvous store and reads everyone's (one set and one
    multi-get each, bounded by the store's timeout), then `choose_backend`. Collective: every rank of the
    group calls it once, before building the process group. Rank 0 logs the decision, as a warning when GPU
    workers are held back to gloo.

    Args:
        store: a ``torch.distributed.Store`` every rank reaches (a fresh, private one per fit: keys are not reused).
    """
    store.set(f"{DEVICES_KEY}/{rank}", f"{device}|{gpu or device}")
    gathered = [v.decode() for v in store.multi_get([f"{DEVICES_KEY}/{r}" for r in range(world)])]
    devices = [g.split("|", 1)[0] for g in gathered]
    choice = choose_backend(devices, [g.split("|", 1)[1] for g in gathered])
    if rank == 0:
        held_back = choice.backend == "gloo" and any(d.startswith("cuda") for d in devices)
        (log.warning if held_back else log.info)("workers talk over %s: %s", choice.backend, choice.reason)
    return choice


def gpu_identity(device: str, host: str) -> str:
    """Which physical GPU ``device`` is, comparable across processes and hosts: ``"<host>/<uuid>"``
    (``"<host>/<device>"`` where torch reports no UUID); ``device`` itself for the CPU.

    Two executors of one host that each see one GPU as ``cuda:0`` (``CUDA_VISIBLE_DEVICES`` per container) hold
    different GPUs; the UUID tells them apart."""
    if not device.startswith("cuda"):
        return device
    import torch

    uuid = getattr(torch.cuda.get_device_properties(torch.device(device)), "uuid", None)
    return f"{host}/{uuid if uuid is not None else device}"


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
    (see `flush_denormals`); the calling thread and the thread count are restored. The thread count is put
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
