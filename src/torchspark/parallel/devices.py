"""Which device each ``ParallelWrapper`` worker trains on: the ``devices`` option parsed and dealt round-robin.

[`plan_devices`][torchspark.parallel.plan_devices] is a pure function of the machine's counts (testable anywhere); `default_devices` asks
torch and the OS for them. Example: ``plan_devices(3, None, gpu_count=2, cpu_count=8)`` is
``["cuda:0", "cuda:1", "cuda:0"]``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from torchspark.errors import ConfigError

__all__ = ["plan_devices", "default_devices", "default_threads"]


def _parse_device(value: Any, gpu_count: int, index: int) -> str:
    text = str(value).strip() if isinstance(value, (str, torch.device)) else None
    if text == "cpu":
        return "cpu"
    if text is not None and (text == "cuda" or text.startswith("cuda:")):
        gpu = text.partition(":")[2] or "0"
        if not gpu.isdigit():
            raise ConfigError(f"devices[{index}]={value!r} is not a device; use 'cuda:<index>', e.g. 'cuda:0'")
        if int(gpu) >= gpu_count:
            fix = f"use cuda:0..cuda:{gpu_count - 1}" if gpu_count else "use devices=['cpu']"
            raise ConfigError(f"devices[{index}]={value!r} but torch sees {gpu_count} CUDA GPU(s) here; {fix}")
        return f"cuda:{int(gpu)}"
    raise ConfigError(
        f"devices[{index}]={value!r} is not a device ParallelWrapper can train on; use 'cpu' or 'cuda:<index>'"
    )


def plan_devices(num_workers: int | None, devices: Sequence[Any] | None, gpu_count: int, cpu_count: int) -> list[str]:
    """One device per worker (a pure function of the machine's counts, so it is testable anywhere).

    Args:
        num_workers: worker count; None = one per listed device, else one per GPU, else one per CPU core.
        devices: devices to deal round-robin (``"cpu"``, ``"cuda"``, ``"cuda:1"``); None = every GPU, else CPU.
        gpu_count, cpu_count: what this machine has.
    Returns:
        ``num_workers`` device strings, e.g. ``["cuda:0", "cuda:1", "cuda:0"]`` for 3 workers on 2 GPUs.
    Raises:
        ConfigError: an unknown device name, a GPU index this machine lacks, or an empty ``devices`` list.
    """
    if devices is not None:
        if isinstance(devices, (str, torch.device)) or len(devices) == 0:
            raise ConfigError(
                f"devices must be a non-empty list such as ['cpu'] or ['cuda:0', 'cuda:1'], got {devices!r}"
            )
        pool = [_parse_device(d, gpu_count, i) for i, d in enumerate(devices)]
    else:
        pool = [f"cuda:{i}" for i in range(gpu_count)] or ["cpu"]
    n = num_workers
    if n is None:
        n = len(pool) if devices is not None or gpu_count else max(1, cpu_count)
    return [pool[i % len(pool)] for i in range(n)]


def default_devices(num_workers: int | None, devices: Sequence[Any] | None = None) -> list[str]:
    """[`plan_devices`][torchspark.parallel.plan_devices] on this machine: the GPUs torch sees and the CPU cores the OS reports."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return plan_devices(num_workers, devices, gpus, os.cpu_count() or 1)


def default_threads(workers: int) -> int:
    """Torch threads per worker when nobody set ``threads_per_worker``: this machine's cores shared among
    ``workers`` worker processes (at least 1)."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))
