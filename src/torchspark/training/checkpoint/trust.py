"""How far a checkpoint found on storage is trusted before a fit resumes from it.

Everything read from disk is bounded before it is used: a damaged or planted file must cost a clear error or a fall
back to the previous checkpoint, never memory in proportion to a number it claims, a hang or a silently wrong
resume. Four checks, each raising `CheckpointDamaged` (a [`SerializationError`][torchspark.errors.SerializationError]
naming the file and the fix), which the driver's resume turns into a fall back to the previous complete checkpoint:

1. `check_manifest`: every count in ``manifest.json`` is an integer within bounds (``world_size`` at most
   `MAX_WORLD_SIZE`, counters and epochs >= 0), its step matches its directory, its ``files`` are the ranks';
2. `check_rank_header`: each rank file's safetensors header (read alone, at most `MAX_HEADER` bytes)
   is well formed, its record belongs to this rank, step and epoch, and the file is as long as the header says;
3. `check_owner` (local storage only): the step directory and its files belong to this user and nobody else
   may write them, so another user's ``step-9999999999`` planted in a shared (1777) ``checkpoint_directory`` is
   never resumed from. Checkpoints are written private (files 0600, directories 0700), as exports are;
4. `check_rank_data`: each rank file's SHA-256 (`rank_checksum`, over its record and all its tensor
   data, written into its safetensors metadata as ``torchspark.sha256``) matches, so a flipped bit in a weight or
   in an updater's moments is a fall back, not a silently different resume. The driver streams every rank file
   through it before it resumes (`load_checkpoint`), and each rank
   checks its own file again when it reads it (`check_rank_blob`). A file written before checksums has none:
   it is resumed with a warning that it was not verified.

Example::

    manifest = check_manifest(raw, path, step)      # CheckpointDamaged: "world_size must be an integer ..."
    for rank in range(manifest["world_size"]):
        check_rank_header(path, rank, manifest)
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from collections.abc import Iterable
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from torchspark._bounded import load_json
from torchspark._io import check_regular_file, filesystem, join
from torchspark.errors import ConfigError, SerializationError

__all__ = [
    "CheckpointDamaged",
    "FIX",
    "problem",
    "MAX_WORLD_SIZE",
    "MAX_COUNT",
    "MAX_HEADER",
    "check_manifest",
    "check_rank_header",
    "CHECKSUM_KEY",
    "rank_checksum",
    "check_rank_data",
    "check_rank_blob",
    "check_owner",
    "check_run_directory",
    "make_private",
]

#: the most workers a manifest may claim (a bound, so a damaged number never sizes an allocation)
MAX_WORLD_SIZE = 1 << 16
#: the largest counter (steps, iterations, epochs, examples, minibatches done) a checkpoint may record
MAX_COUNT = 1 << 53
#: the largest safetensors header of a rank file read (the header is JSON: names, shapes, the rank's record)
MAX_HEADER = 64 << 20

#: the safetensors metadata key of a rank file's checksum (`rank_checksum`)
CHECKSUM_KEY = "torchspark.sha256"
#: the metadata key of a rank file's record (JSON)
RECORD_KEY = "torchspark.checkpoint"
#: bytes read at a time when the driver verifies a rank file (memory stays bounded for any checkpoint size)
_CHUNK = 8 << 20

#: the advice every `CheckpointDamaged` message ends with
FIX = "delete that step directory (the fit then resumes from the one before) or use a new run_id"


class CheckpointDamaged(SerializationError):
    """A checkpoint on storage is damaged, incomplete in a way no writer leaves, or not ours: the resume falls back
    to the previous complete checkpoint (and refuses with this error when none is left)."""


def problem(error: CheckpointDamaged) -> str:
    """``error``'s message without the advice (`FIX`), for a list of several damaged checkpoints."""
    return re.sub(r"[:;] " + re.escape(FIX) + "$", "", str(error))


def _count(record: dict[str, Any], key: str, where: str, low: int = 0, high: int = MAX_COUNT) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointDamaged(
            f"{where}: {key} must be an integer in [{low}, {high}], got {value!r}; the file is "
            f"damaged or was not written by torchspark: {FIX}"
        )
    return value


def check_manifest(manifest: Any, path: str, step: int) -> dict[str, Any]:
    """``manifest`` (parsed ``manifest.json`` of step directory ``path``) if every field a resume uses is sane.

    Raises:
        CheckpointDamaged: naming the manifest, the field and the value.
    """
    where = repr(join(path, "manifest.json"))
    if not isinstance(manifest, dict):
        raise CheckpointDamaged(f"{where} is not a JSON object: {FIX}")
    world = _count(manifest, "world_size", where, 1, MAX_WORLD_SIZE)
    if _count(manifest, "step", where) != step:
        raise CheckpointDamaged(f"{where} says step {manifest['step']} but lies in the directory of step {step}: {FIX}")
    for key in ("fit_epoch", "iteration", "epoch", "fit_start_iteration", "fit_start_epoch"):
        if key in manifest or key in ("fit_epoch", "iteration", "epoch"):
            _count(manifest, key, where)
    if not isinstance(manifest.get("mode"), str) or not isinstance(manifest.get("settings"), dict):
        raise CheckpointDamaged(
            f"{where} has no algorithm (mode {manifest.get('mode')!r}, settings of type "
            f"{type(manifest.get('settings')).__name__}): {FIX}"
        )
    files = manifest.get("files")
    if files is not None and files != [f"rank-{r}.safetensors" for r in range(world)]:
        raise CheckpointDamaged(
            f"{where} names the files {str(files)[:200]}, not one rank file for each of its {world} workers: {FIX}"
        )
    return manifest


def _read_header(url: str) -> tuple[dict[str, Any], int, int]:
    """The safetensors header of ``url`` (read alone), the bytes of tensor data the file holds after it, and where
    that data starts."""
    fs, local = filesystem(url)
    if isinstance(fs, LocalFileSystem):  # a FIFO would block the read below, a device never end
        check_regular_file(local, CheckpointDamaged, "checkpoint file", FIX)
    try:
        size = int(fs.size(local))
        with fs.open(local, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointDamaged(f"{url!r} is {len(head)} bytes long, too short for a safetensors file: {FIX}")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise CheckpointDamaged(
                    f"{url!r} claims a {n}-byte header in a {size}-byte file (at most "
                    f"{MAX_HEADER}): the file is truncated or damaged: {FIX}"
                )
            header = load_json(f.read(n), "the header", ValueError)
    except (OSError, ValueError) as e:
        raise CheckpointDamaged(f"cannot read the header of {url!r} ({type(e).__name__}: {e}): {FIX}") from e
    if not isinstance(header, dict):
        raise CheckpointDamaged(f"{url!r} has a header that is not a JSON object: {FIX}")
    return header, size - 8 - n, 8 + n


def check_rank_header(path: str, rank: int, manifest: dict[str, Any]) -> dict[str, Any]:
    """The record of rank ``rank``'s file in checkpoint ``path``, read from its header alone and checked against the
    manifest (its rank, step and epoch) and the file's length.

    Raises:
        CheckpointDamaged: naming the file and what is wrong.
    """
    url = join(path, f"rank-{rank}.safetensors")
    header, data_bytes, _ = _read_header(url)
    try:
        record = load_json((header.get("__metadata__") or {})[RECORD_KEY], f"the record in {url!r}", ValueError)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CheckpointDamaged(f"{url!r} is not a torchspark checkpoint file ({type(e).__name__}: {e}): {FIX}") from e
    if not isinstance(record, dict):
        raise CheckpointDamaged(f"{url!r} holds a record that is not a JSON object: {FIX}")
    if data_bytes != max(ends, default=0):
        raise CheckpointDamaged(
            f"{url!r} holds {data_bytes} bytes of tensor data but its header places tensors up "
            f"to byte {max(ends, default=0)}: the file is truncated or damaged: {FIX}"
        )
    _count(record, "rank", repr(url), rank, rank)
    _count(record, "step", repr(url), manifest["step"], manifest["step"])
    _count(record, "fit_epoch", repr(url), manifest["fit_epoch"], manifest["fit_epoch"])
    for key in ("done", "iteration", "epoch", "examples", "iterations"):
        _count(record, key, repr(url))
    return record


def rank_checksum(record: str, data: Iterable[bytes | memoryview]) -> str:
    """The checksum of a rank file: SHA-256 (hex) of its record (the JSON string in its metadata) and then its
    tensor data (everything after the safetensors header), fed as ``data``'s chunks.

    SHA-256 rather than BLAKE2b: OpenSSL runs it on the CPU's SHA extensions where they exist."""
    h = hashlib.sha256(record.encode("utf-8"))
    for chunk in data:
        h.update(chunk)
    return h.hexdigest()


def _compare(url: str, expected: Any, actual: str) -> None:
    if expected != actual:
        raise CheckpointDamaged(
            f"{url!r} does not match the checksum written with it (sha256 {str(expected)[:16]}..., its data now "
            f"hashes to {actual[:16]}...): the file is damaged: {FIX}"
        )


def check_rank_data(path: str, rank: int) -> bool:
    """Verify rank ``rank``'s file of checkpoint ``path`` against its checksum, streaming it (bounded memory).

    Returns:
        True when verified; False when the file has no checksum (written by a torchspark before checksums).
    Raises:
        CheckpointDamaged: the data or record does not match the checksum, or the file cannot be read.
    """
    url = join(path, f"rank-{rank}.safetensors")
    header, _, start = _read_header(url)
    metadata = header.get("__metadata__") or {}
    expected = metadata.get(CHECKSUM_KEY)
    if expected is None:
        return False
    record = metadata.get(RECORD_KEY)
    if not isinstance(record, str):
        raise CheckpointDamaged(f"{url!r} has a checksum but no record: the file is damaged: {FIX}")
    fs, local = filesystem(url)
    try:
        with fs.open(local, "rb") as f:
            f.seek(start)
            actual = rank_checksum(record, iter(lambda: f.read(_CHUNK), b""))
    except OSError as e:
        raise CheckpointDamaged(f"cannot read {url!r} ({type(e).__name__}: {e}): {FIX}") from e
    _compare(url, expected, actual)
    return True


def check_rank_blob(url: str, blob: bytes, metadata: dict[str, str]) -> bool:
    """`check_rank_data` for a rank file already read whole (``blob``, its safetensors ``metadata``).

    Returns:
        True when verified; False when the file has no checksum.
    Raises:
        CheckpointDamaged: the file does not match its checksum.
    """
    expected = metadata.get(CHECKSUM_KEY)
    if expected is None:
        return False
    (n,) = struct.unpack("<Q", blob[:8])
    _compare(url, expected, rank_checksum(metadata.get(RECORD_KEY, ""), [memoryview(blob)[8 + n :]]))
    return True


def _local(url: str) -> str | None:
    fs, local = filesystem(url)
    return local if isinstance(fs, LocalFileSystem) else None


def check_owner(url: str) -> None:
    """On local storage: ``url`` must belong to this user and be writable by nobody else (elsewhere: no check;
    object stores and HDFS enforce their own permissions).

    Raises:
        CheckpointDamaged: naming the path, its owner and mode.
    """
    local = _local(url)
    if local is None or not hasattr(os, "geteuid"):
        return
    try:
        st = os.lstat(local)
    except OSError as e:
        raise CheckpointDamaged(f"cannot inspect {url!r}: {e}: {FIX}") from e
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or stat.S_ISLNK(st.st_mode):
        raise CheckpointDamaged(
            f"{url!r} belongs to uid {st.st_uid} with mode {stat.filemode(st.st_mode)}; a "
            f"checkpoint is trusted only when it is yours (uid {os.geteuid()}) and nobody else can "
            f"write it (another user may have planted it): {FIX}"
        )


def check_run_directory(url: str) -> None:
    """At fit start: the run's directory, when it exists on local storage, must be this user's and private to it.

    Raises:
        ConfigError: naming the directory, its owner and what to do.
    """
    try:
        check_owner(url)
    except CheckpointDamaged as e:
        local = _local(url)
        if local is not None and not os.path.lexists(local):
            return
        raise ConfigError(
            f"checkpoint run directory {url!r} is not trusted: {str(e).split(': ' + FIX)[0]}; use a "
            "checkpoint_directory only you can write (not a shared /tmp) or another run_id"
        ) from e


def make_private(url: str, directory: bool) -> None:
    """Restrict a checkpoint directory (0700) or file (0600) on local storage to its owner (elsewhere: no-op)."""
    local = _local(url)
    if local is not None:
        os.chmod(local, 0o700 if directory else 0o600)
