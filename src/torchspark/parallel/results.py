"""How a worker's result crosses the process boundary: its tensors as numpy arrays.

Torch shares a tensor put on a multiprocessing queue through a file descriptor of the sending process, which
dangles once that worker exits; numpy arrays are pickled by value. The worker sends `to_numpy`, the parent
reads `to_torch`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from torchspark.training.task import WorkerResult

__all__ = ["to_numpy", "to_torch"]


def _map_tensors(result: WorkerResult, fn: Callable[[Any], Any]) -> WorkerResult:
    return replace(
        result,
        params=None if result.params is None else fn(result.params),
        updater_state=None if result.updater_state is None else fn(result.updater_state),
        scaler_state={k: fn(v) for k, v in result.scaler_state.items()},
        extra_state={k: fn(v) for k, v in result.extra_state.items()},
        buffers=None if result.buffers is None else {k: fn(v) for k, v in result.buffers.items()},
    )


def to_numpy(result: WorkerResult) -> WorkerResult:
    """``result`` with every tensor as a numpy array on the CPU (the worker's side)."""
    return _map_tensors(result, lambda t: t.detach().cpu().numpy())


def to_torch(result: WorkerResult) -> WorkerResult:
    """``result`` with every numpy array back as a tensor (the parent's side of `to_numpy`)."""
    return _map_tensors(result, torch.from_numpy)
