"""The checkpoints a training function reports (``report(metrics, checkpoint=...)``): a state dict of tensors or a
directory, written through the masters' checkpoint store (`torchspark.training.checkpoint.store`: a temp name then
a rename, a SHA-256 of every file checked before a resume trusts it, a manifest written last), never as pickle.

Layout: ``<checkpoint_dir>/<run_id>/step-<n>/rank-0.safetensors`` + ``manifest.json`` (the store's layout with a
world of one: rank 0's checkpoint is the run's, as in Ray Train and TorchDistributor scripts that save on rank 0).
A state dict is stored tensor by tensor; a directory as one ``uint8`` tensor per file (its relative path is the
tensor's name), restored into a fresh local directory by `load_newest`.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import torch

from torchspark.errors import ConfigError
from torchspark.training.checkpoint import store

__all__ = ["MODE", "check_checkpoint", "save_checkpoint", "load_newest", "newest_step"]

#: the "algorithm" the manifest names (the store refuses a resume with another one)
MODE = "run"
_FILE = "file:"
_KEEP = 2


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def check_checkpoint(obj: Any) -> str:
    """``"state_dict"`` or ``"directory"``: what ``obj`` is as a checkpoint.

    Raises:
        ConfigError: ``obj`` is neither a flat mapping of ``str`` to tensors nor an existing directory (names its
            type and the fix).
    """
    if _is_state_dict(obj):
        return "state_dict"
    if isinstance(obj, (str, os.PathLike)) and os.path.isdir(obj):
        return "directory"
    if isinstance(obj, Mapping):
        bad = next(((k, v) for k, v in obj.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))), None)
        what = f"a mapping whose entry {bad[0]!r} is a {type(bad[1]).__name__}" if bad else "a mapping"
    elif isinstance(obj, (str, os.PathLike)):
        what = f"the path {os.fspath(obj)!r}, which is not an existing directory"
    else:
        what = f"a {type(obj).__name__}"
    raise ConfigError(
        f"report(checkpoint=...) got {what}; a checkpoint is a state dict of tensors (model.state_dict(), or "
        "{name: tensor}; nested optimizer states: save them into a directory) or the path of a directory your "
        "function wrote (torch.save/safetensors files); pass one of those"
    )


def newest_step(directory: str, run_id: str) -> int:
    """The step of the run's newest complete checkpoint (-1: none)."""
    found = store.newest_checkpoint(directory, run_id)
    return -1 if found is None else found.step


def _directory_tensors(root: str) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for here, _, files in os.walk(root):
        for name in sorted(files):
            full = os.path.join(here, name)
            with open(full, "rb") as f:
                data = f.read()
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            tensors[_FILE + rel] = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
            )
    return tensors


def save_checkpoint(
    directory: str, run_id: str, step: int, checkpoint: Any, metrics: Mapping[str, Any], iteration: int
) -> str:
    """Write ``checkpoint`` as step ``step`` of run ``run_id`` under ``directory`` (rank file, then the manifest),
    prune all but the newest two; returns the step's directory.

    Raises:
        ConfigError: ``checkpoint`` is not a state dict or directory (`check_checkpoint`).
    """
    kind = check_checkpoint(checkpoint)
    tensors = dict(checkpoint) if kind == "state_dict" else _directory_tensors(os.fspath(checkpoint))
    epoch = metrics.get("epoch", 0)
    epoch = int(epoch) if isinstance(epoch, (int, float)) and math.isfinite(epoch) and epoch >= 0 else 0
    numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    path = store.step_directory(directory, run_id, step)
    record = {
        "rank": 0,
        "step": step,
        "fit_epoch": epoch,
        "done": 0,
        "iteration": iteration,
        "epoch": epoch,
        "examples": 0,
        "iterations": iteration,
        "kind": kind,
        "metrics": numeric,
    }
    store.write_rank_file(path, 0, tensors, record)
    store.write_manifest(
        path,
        {
            "run_id": run_id,
            "step": step,
            "fit_epoch": epoch,
            "world_size": 1,
            "iteration": iteration,
            "epoch": epoch,
            "mode": MODE,
            "settings": {"kind": kind},
            "written_at": time.time(),
            "files": ["rank-0.safetensors"],
        },
    )
    store.prune(directory, run_id, _KEEP)
    return path


def load_newest(directory: str, run_id: str) -> tuple[Any, dict[str, Any]] | None:
    """The run's newest complete checkpoint, verified: ``(state dict, record)``, or for a directory checkpoint
    ``(path of a fresh local directory holding its files, record)``; None when the run has none.

    Raises:
        CheckpointDamaged: its files fail their checksum (the message names the file).
    """
    found = store.newest_checkpoint(directory, run_id)
    if found is None:
        return None
    checked = store.load_checkpoint(found.step, found.path, verify=True)
    if checked is None:
        return None
    tensors, record = store.read_rank_file(checked.path, 0)
    if record.get("kind") != "directory":
        return tensors, record
    out = tempfile.mkdtemp(prefix=f"torchspark-checkpoint-{found.step}-")
    for key, tensor in tensors.items():
        rel = key[len(_FILE) :]
        target = os.path.normpath(os.path.join(out, rel))
        if not target.startswith(out + os.sep):  # a name that climbs out: never written
            raise ConfigError(f"checkpoint {found.path!r} names the file {rel!r} outside its directory")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(tensor.numpy().tobytes())
    return out, record
