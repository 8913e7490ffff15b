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

The workers commit a checkpoint together (`CheckpointWriter`): every
rank writes its file, all meet, rank 0 writes the manifest, all meet again; so no worker trains on (and none can
fail) before the checkpoint is complete, and a fault after it always finds it whole. Directories are created 0700
and files 0600 on local storage. What the resume trusts of a checkpoint is `trust`'s to check
(`load_checkpoint`). Each rank file carries the SHA-256 of its record and tensor data in its safetensors
metadata (`rank_checksum`), verified before a resume uses it.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from torchspark._bounded import load_json
from torchspark._io import atomic_write_bytes, filesystem, join, make_dirs, read_bytes, read_safetensors_metadata
from torchspark.errors import SerializationError
from torchspark.training.checkpoint.trust import (
    CHECKSUM_KEY,
    FIX,
    RECORD_KEY,
    CheckpointDamaged,
    check_manifest,
    check_owner,
    check_rank_blob,
    check_rank_data,
    check_rank_header,
    make_private,
    rank_checksum,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "StoredCheckpoint",
    "run_directory",
    "step_directory",
    "write_rank_file",
    "write_manifest",
    "read_rank_file",
    "complete_checkpoints",
    "newest_checkpoint",
    "prune",
    "step_directories",
    "read_manifest",
    "load_checkpoint",
]

log = logging.getLogger(__name__)

FORMAT = "torchspark.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
_META_KEY = RECORD_KEY
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class StoredCheckpoint:
    """A complete checkpoint found on storage: its step, directory URL and parsed manifest."""

    step: int
    path: str
    manifest: dict[str, Any]


def run_directory(directory: str, run_id: str) -> str:
    """Where run ``run_id``'s checkpoints live."""
    return join(directory, run_id)


def step_directory(directory: str, run_id: str, step: int) -> str:
    """The directory of checkpoint ``step`` of run ``run_id``."""
    return join(run_directory(directory, run_id), f"step-{step:010d}")


def rank_file(path: str, rank: int) -> str:
    """Rank ``rank``'s file in the checkpoint at ``path``."""
    return join(path, f"rank-{rank}.safetensors")


def write_rank_file(
    path: str, rank: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any], checksum: bool = True
) -> None:
    """Write one rank's state (tensors + a JSON record in the safetensors metadata) atomically into ``path``, with
    the checksum of its record and tensor data in the metadata (``checksum=False``: without, as a torchspark before
    checksums wrote it; for tests and the overhead benchmark)."""
    make_dirs(path, SerializationError, "checkpoint directory")
    make_private(path.rstrip("/").rsplit("/", 1)[0], directory=True)  # the run's directory
    make_private(path, directory=True)
    record = json.dumps(meta)
    blob = st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, {_META_KEY: record})
    chunks = _with_checksum(blob, record) if checksum else [blob]
    make_private(atomic_write_bytes(rank_file(path, rank), chunks, SerializationError), directory=False)


def _with_checksum(blob: bytes, record: str) -> list[bytes | memoryview]:
    """``blob`` (safetensors bytes) with the checksum of ``record`` and its tensor data added to its metadata, as
    the chunks to write: a new header, then the data unchanged (its offsets are relative to the header's end)."""
    (n,) = struct.unpack("<Q", blob[:8])
    data = memoryview(blob)[8 + n :]
    header = json.loads(blob[8 : 8 + n])
    header["__metadata__"][CHECKSUM_KEY] = rank_checksum(record, [data])
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors pads its header with spaces to keep the data 8-byte aligned
    return [struct.pack("<Q", len(head)), head, data]


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    """Write the manifest last: from this moment the checkpoint counts once every rank file named in it exists."""
    make_private(
        atomic_write_bytes(
            join(path, MANIFEST),
            json.dumps({"format": FORMAT, "version": VERSION, **manifest}, indent=2, sort_keys=True).encode(),
            SerializationError,
        ),
        directory=False,
    )


def read_rank_file(path: str, rank: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One rank's tensors and record from the checkpoint at ``path``.

    Raises:
        CheckpointDamaged: the file is missing, damaged or not a torchspark checkpoint file (the message names it).
    """
    url = rank_file(path, rank)
    blob = read_bytes(url, CheckpointDamaged)
    try:
        metadata = read_safetensors_metadata(blob)
        meta = load_json(metadata[_META_KEY], "its record", ValueError)
        if not isinstance(meta, dict):
            raise ValueError("its record is not a JSON object")
        check_rank_blob(url, blob, metadata)
        return dict(st_load(blob)), meta
    except CheckpointDamaged:
        raise
    except Exception as e:  # safetensors raises its own error types (SafetensorError) for damaged files
        raise CheckpointDamaged(
            f"{url!r} is not a readable torchspark checkpoint file ({type(e).__name__}: {e}); {FIX}"
        ) from e


def read_manifest(path: str, step: int) -> dict[str, Any] | None:
    """The checked manifest of the step directory ``path`` (None: it has none yet, the checkpoint is incomplete).

    Raises:
        CheckpointDamaged: the manifest exists but is damaged (not JSON, not ours, a count out of bounds).
        SerializationError: it was written by a newer torchspark.
    """
    url = join(path, MANIFEST)
    fs, local = filesystem(url)
    if not fs.exists(local):
        return None
    try:
        manifest = load_json(read_bytes(url, CheckpointDamaged), repr(url), ValueError)
    except CheckpointDamaged:
        raise
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too deep or too long a number
        if str(e).startswith(repr(url)):
            raise CheckpointDamaged(f"{e}; {FIX}") from None
        raise CheckpointDamaged(f"{url!r} is not valid JSON ({type(e).__name__}: {e}); {FIX}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointDamaged(f"{url!r} is not a torchspark checkpoint manifest (no format marker); {FIX}")
    version = manifest.get("version", 0)
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise SerializationError(
            f"checkpoint {path!r} was written by a newer torchspark (format version "
            f"{version}); upgrade torchspark or use another run_id"
        )
    return check_manifest(manifest, path, step)


def load_checkpoint(step: int, path: str, verify: bool = True) -> StoredCheckpoint | None:
    """The checkpoint in step directory ``path`` when it is complete and checked: its manifest, every rank file's
    header, (local storage) that they are this user's alone, and (``verify``) every rank file's checksum, each file
    streamed through SHA-256 once. None: incomplete (no manifest yet, or a rank file missing: a writer was stopped).

    A checkpoint written before checksums has none: it is returned, with a warning that it was not verified.

    Args:
        verify: check the checksums (False: headers only, no tensor data read; for listing and pruning).
    Raises:
        CheckpointDamaged: a damaged or untrusted part (the message names it).
    """
    check_owner(path)
    manifest = read_manifest(path, step)
    if manifest is None or not _has_rank_files(path, manifest):
        return None
    for rank in range(manifest["world_size"]):
        check_owner(rank_file(path, rank))
        check_rank_header(path, rank, manifest)
    if verify:
        unverified = [rank for rank in range(manifest["world_size"]) if not check_rank_data(path, rank)]
        if unverified:
            log.warning(
                "checkpoint %s: rank file(s) %s carry no checksum (written by an older torchspark); resuming from "
                "them unverified",
                path,
                ", ".join(f"rank-{r}.safetensors" for r in unverified),
            )
    return StoredCheckpoint(step, path, manifest)


def _has_rank_files(path: str, manifest: dict[str, Any]) -> bool:
    fs, root = filesystem(path)
    try:
        names = {str(e).rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(root, detail=False)}
    except FileNotFoundError:
        return False
    return all(f"rank-{r}.safetensors" in names for r in range(manifest["world_size"]))


def step_directories(directory: str, run_id: str) -> list[tuple[int, str]]:
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


def _complete(step: int, path: str) -> dict[str, Any] | None:
    """The manifest of a complete, undamaged checkpoint (listing and pruning: a damaged one never counts)."""
    try:
        found = load_checkpoint(step, path, verify=False)  # every write prunes: headers only, no tensor data read
    except CheckpointDamaged as e:
        log.debug("ignoring a damaged checkpoint: %s", e)
        return None
    return None if found is None else found.manifest


def complete_checkpoints(directory: str, run_id: str) -> list[StoredCheckpoint]:
    """The run's complete checkpoints, oldest first."""
    found = []
    for step, path in step_directories(directory, run_id):
        manifest = _complete(step, path)
        if manifest is not None:
            found.append(StoredCheckpoint(step, path, manifest))
    return found


def newest_checkpoint(directory: str, run_id: str) -> StoredCheckpoint | None:
    """The run's newest complete checkpoint (None: the run has none)."""
    for step, path in reversed(step_directories(directory, run_id)):
        manifest = _complete(step, path)
        if manifest is not None:
            return StoredCheckpoint(step, path, manifest)
    return None


def prune(directory: str, run_id: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints, and incomplete ones older than those kept.

    Incomplete checkpoints newer than the oldest kept one are left alone: a peer may still be writing them.
    Returns the deleted directories. A failed delete is logged, never raised (the checkpoint just written stands).
    """
    dirs = step_directories(directory, run_id)
    complete = [step for step, path in dirs if _complete(step, path) is not None]
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
