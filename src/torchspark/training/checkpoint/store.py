"""Checkpoints on storage: the layout, atomic writes, finding the newest complete one, pruning.

Layout (any fsspec URL)::

    <checkpoint_directory>/<run_id>/step-<step:010d>/
        rank-0.safetensors      rank 0: parameters, its updater state, buffers, algorithm state (residual...)
        rank-1.safetensors      every other rank: its own updater state, buffers, algorithm state (no parameters)
        ...
        manifest.json           written last, by rank 0

Each rank writes its own file (temp name + rename), so nothing of one rank's state travels to another: with gradient
sharing every rank has its own residual, threshold and updater state, and gathering them on rank 0 would cost
``world_size`` times the parameter size on every checkpoint. Rank 0 writes the manifest after its own file; a
checkpoint is **complete** when its manifest exists and names a rank file for every rank that exists. Readers ignore
incomplete ones (a rank killed mid-write leaves none of its file, and a peer may still be writing), and pruning
counts only complete ones, so the newest complete checkpoint is never deleted. (So while a peer is still writing,
one checkpoint more than ``keep_checkpoints`` may exist until rank 0's next write or the end of the fit.)
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from torchspark._io import atomic_write_bytes, filesystem, join, make_dirs, read_bytes, read_safetensors_metadata
from torchspark.errors import SerializationError

__all__ = ["FORMAT", "VERSION", "StoredCheckpoint", "run_directory", "step_directory", "write_rank_file",
           "write_manifest", "read_rank_file", "complete_checkpoints", "newest_checkpoint", "prune"]

log = logging.getLogger(__name__)

FORMAT = "torchspark.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
_META_KEY = "torchspark.checkpoint"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class StoredCheckpoint:
    """A complete checkpoint found on storage: its step, directory URL and parsed manifest."""

    step: int
    path: str
    manifest: dict[str, Any]


def run_directory(directory: str, run_id: str) -> str:
    return join(directory, run_id)


def step_directory(directory: str, run_id: str, step: int) -> str:
    return join(run_directory(directory, run_id), f"step-{step:010d}")


def rank_file(path: str, rank: int) -> str:
    return join(path, f"rank-{rank}.safetensors")


def write_rank_file(path: str, rank: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write one rank's state (tensors + a JSON record in the safetensors metadata) atomically into ``path``."""
    make_dirs(path, SerializationError, "checkpoint directory")
    blob = st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, {_META_KEY: json.dumps(meta)})
    atomic_write_bytes(rank_file(path, rank), blob, SerializationError)


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    """Write the manifest last: from this moment the checkpoint counts once every rank file named in it exists."""
    atomic_write_bytes(join(path, MANIFEST), json.dumps({"format": FORMAT, "version": VERSION, **manifest},
                                                        indent=2, sort_keys=True).encode(), SerializationError)


def read_rank_file(path: str, rank: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One rank's tensors and record from the checkpoint at ``path``.

    Raises:
        SerializationError: the file is missing or not a torchspark checkpoint file.
    """
    url = rank_file(path, rank)
    blob = read_bytes(url, SerializationError)
    try:
        meta = json.loads(read_safetensors_metadata(blob)[_META_KEY])
        return dict(st_load(blob)), meta
    except (KeyError, ValueError) as e:
        raise SerializationError(f"{url!r} is not a torchspark checkpoint file: {e}") from e


def _read_manifest(path: str) -> dict[str, Any] | None:
    try:
        manifest = json.loads(read_bytes(join(path, MANIFEST), SerializationError))
    except (SerializationError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    if int(manifest.get("version", 0)) > VERSION:
        raise SerializationError(f"checkpoint {path!r} was written by a newer torchspark (format version "
                                 f"{manifest['version']}); upgrade torchspark or use another run_id")
    return manifest


def _step_dirs(directory: str, run_id: str) -> list[tuple[int, str]]:
    """``(step, url)`` of every step directory of the run, oldest first (complete or not)."""
    run = run_directory(directory, run_id)
    fs, root = filesystem(run)
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        match = _STEP_DIR.match(name)
        if match:
            found.append((int(match.group(1)), join(run, name)))
    return sorted(found)


def _complete(path: str) -> dict[str, Any] | None:
    manifest = _read_manifest(path)
    if manifest is None:
        return None
    fs, root = filesystem(path)
    try:
        names = {str(e).rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root, detail=False)}
    except FileNotFoundError:
        return None
    wanted = [f"rank-{r}.safetensors" for r in range(int(manifest["world_size"]))]
    return manifest if all(n in names for n in wanted) else None


def complete_checkpoints(directory: str, run_id: str) -> list[StoredCheckpoint]:
    """The run's complete checkpoints, oldest first."""
    found = []
    for step, path in _step_dirs(directory, run_id):
        manifest = _complete(path)
        if manifest is not None:
            found.append(StoredCheckpoint(step, path, manifest))
    return found


def newest_checkpoint(directory: str, run_id: str) -> StoredCheckpoint | None:
    """The run's newest complete checkpoint (None: the run has none)."""
    for step, path in reversed(_step_dirs(directory, run_id)):
        manifest = _complete(path)
        if manifest is not None:
            return StoredCheckpoint(step, path, manifest)
    return None


def prune(directory: str, run_id: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints, and incomplete ones older than those kept.

    Incomplete checkpoints newer than the oldest kept one are left alone: a peer may still be writing them.
    Returns the deleted directories. A failed delete is logged, never raised (the checkpoint just written stands).
    """
    dirs = _step_dirs(directory, run_id)
    complete = [step for step, path in dirs if _complete(path) is not None]
    if len(complete) <= keep:
        return []
    oldest_kept = complete[-keep]
    deleted = []
    for step, path in dirs:
        if step < oldest_kept:
            fs, root = filesystem(path)
            try:
                fs.rm(root, recursive=True)
                deleted.append(path)
            except OSError as e:
                log.warning("could not delete the old checkpoint %s: %s", path, e)
    return deleted
