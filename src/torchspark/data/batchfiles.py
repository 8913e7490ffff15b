"""Batch files: one safetensors file per minibatch, in any fsspec directory (local path, ``file://``,
``memory://``, object stores with the matching fsspec plugin).

A file holds the tensors under the names ``features``, ``labels``, ``features_mask``, ``labels_mask`` (DataSet)
or ``features.0``, ``labels.0``, ``features_mask.0``, ... (MultiDataSet), and the safetensors metadata
``{"format": "torchspark.batch", "version": "1", "kind": "DataSet" | "MultiDataSet", "num_examples": "N"}``.
No pickle: a batch file can be loaded from an untrusted source without running code.

Writes are atomic: the bytes go to ``.{name}.tmp-{uuid}`` in the same directory and are then renamed, so a
reader never sees half a file, and the temp file is removed if anything fails.
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from collections.abc import Iterable
from typing import Any

import fsspec
import safetensors.torch
import torch
from safetensors import SafetensorError

from torchspark._io import filesystem
from torchspark.data.dataset import DataSet, MultiDataSet
from torchspark.errors import DataError

__all__ = [
    "BATCH_FORMAT",
    "BATCH_FORMAT_VERSION",
    "BATCH_SUFFIX",
    "dataset_to_bytes",
    "dataset_from_bytes",
    "save_batch",
    "save_batches",
    "load_batch",
    "batch_num_examples",
    "list_batches",
    "refuse_earlier_export",
]

logger = logging.getLogger(__name__)

BATCH_FORMAT = "torchspark.batch"
BATCH_FORMAT_VERSION = "1"
BATCH_SUFFIX = ".safetensors"
_KINDS: dict[str, type[DataSet] | type[MultiDataSet]] = {"DataSet": DataSet, "MultiDataSet": MultiDataSet}


def dataset_to_bytes(ds: DataSet | MultiDataSet) -> bytes:
    """Serialize a DataSet or MultiDataSet to safetensors bytes (tensors are moved to CPU, made contiguous).

    Raises:
        DataError: ``ds`` is not a DataSet/MultiDataSet, or a tensor cannot be stored (e.g. sparse).
    """
    if not isinstance(ds, (DataSet, MultiDataSet)):
        raise DataError(f"can only save a DataSet or MultiDataSet, got {type(ds).__name__}")
    tensors: dict[str, torch.Tensor] = {}
    seen_storage: set[tuple[str, int]] = set()
    for name, tensor in ds._named().items():
        if tensor.layout != torch.strided:
            raise DataError(f"{name} is a {tensor.layout} tensor, which batch files cannot hold; call .to_dense()")
        tensor = tensor.detach().cpu().contiguous()
        key = (str(tensor.device), tensor.untyped_storage().data_ptr())
        if key in seen_storage and tensor.numel() > 0:
            tensor = tensor.clone()  # safetensors refuses tensors that share memory
        seen_storage.add(key)
        tensors[name] = tensor
    metadata = {
        "format": BATCH_FORMAT,
        "version": BATCH_FORMAT_VERSION,
        "kind": type(ds).__name__,
        "num_examples": str(len(ds)),
    }
    try:
        return safetensors.torch.save(tensors, metadata=metadata)
    except (SafetensorError, ValueError, RuntimeError, TypeError, KeyError) as exc:
        raise DataError(f"cannot serialize {type(ds).__name__} to a batch file: {exc}") from exc


def _read_header(data: bytes, source: str) -> dict[str, Any]:
    """Parse the safetensors header: an 8-byte little-endian length, then that many bytes of JSON."""
    if len(data) < 8:
        raise DataError(
            f"{source} is empty or truncated ({len(data)} bytes); it is not a batch file, "
            f"re-export it with save_batches"
        )
    header_len = int.from_bytes(data[:8], "little")
    if header_len > len(data) - 8:
        raise DataError(
            f"{source} is truncated or not a safetensors file: its header claims {header_len} bytes "
            f"but only {len(data) - 8} follow; re-export it with save_batches"
        )
    try:
        header = json.loads(data[8 : 8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{source} is not a safetensors file (unreadable header: {exc})") from exc
    if not isinstance(header, dict):
        raise DataError(f"{source} is not a safetensors file (header is not a JSON object)")
    data_len = len(data) - 8 - header_len
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2
    ]
    if ends and max(ends) > data_len:
        raise DataError(
            f"{source} is truncated: tensors need {max(ends)} data bytes but the file has {data_len}; "
            f"re-export it with save_batches"
        )
    return header


def dataset_from_bytes(data: bytes, source: str = "<bytes>") -> DataSet | MultiDataSet:
    """Deserialize bytes written by [`dataset_to_bytes`][torchspark.data.dataset_to_bytes].

    Args:
        data: the file's bytes.
        source: what to call the bytes in error messages (the file path).

    Raises:
        DataError: empty, truncated or foreign bytes (not safetensors, or safetensors without the torchspark
            batch metadata, or an unknown version); the message names ``source``.
    """
    data = bytes(data)
    metadata = _read_header(data, source).get("__metadata__") or {}
    if not isinstance(metadata, dict) or metadata.get("format") != BATCH_FORMAT:
        raise DataError(
            f"{source} is a safetensors file but not a torchspark batch file (no format marker "
            f"{BATCH_FORMAT!r} in its metadata); write batches with save_batch/save_batches"
        )
    if metadata.get("version") != BATCH_FORMAT_VERSION:
        raise DataError(
            f"{source} has batch format version {metadata.get('version')!r}, this torchspark reads "
            f"version {BATCH_FORMAT_VERSION!r}; re-export the data with this version"
        )
    cls = _KINDS.get(str(metadata.get("kind")))
    if cls is None:
        raise DataError(f"{source} holds an unknown kind {metadata.get('kind')!r}; expected one of {sorted(_KINDS)}")
    try:
        tensors = safetensors.torch.load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise DataError(f"{source} is corrupt ({exc}); re-export it with save_batches") from exc
    try:
        ds = cls._from_named(tensors)
    except DataError as exc:
        raise DataError(f"{source}: {exc}") from exc
    if metadata.get("num_examples") not in (None, str(len(ds))):
        raise DataError(f"{source} claims {metadata['num_examples']} examples but holds {len(ds)}; it is corrupt")
    return ds


def _join(directory: str, name: str) -> str:
    return directory + name if directory.endswith("/") else f"{directory}/{name}"


def _makedirs(fs: fsspec.AbstractFileSystem, fs_path: str, display: str) -> None:
    try:
        fs.makedirs(fs_path, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create batch directory {display} ({exc}); choose a writable directory") from exc


def _remove_quietly(fs: fsspec.AbstractFileSystem, path: str) -> None:
    try:
        if fs.exists(path):
            fs.rm(path)
    except OSError as exc:  # cleanup must not hide the original error
        logger.warning("could not remove temporary batch file %s: %s", path, exc)


def save_batch(ds: DataSet | MultiDataSet, path: str) -> str:
    """Write one batch file atomically (temp file in the same directory, then rename); creates the directory.

    Returns:
        ``path`` as given.

    Raises:
        DataError: ``ds`` cannot be serialized; the directory cannot be created or written (named in the
            message); ``path`` is an existing directory.
    """
    data = dataset_to_bytes(ds)
    fs, fs_path = filesystem(path)
    directory_display = posixpath.dirname(path.rstrip("/")) or "."
    parent = fs._parent(fs_path)
    _makedirs(fs, parent, directory_display)
    if fs.isdir(fs_path):
        raise DataError(f"cannot write batch file {path}: a directory has that name; choose another path")
    tmp = posixpath.join(parent, f".{posixpath.basename(fs_path)}.tmp-{uuid.uuid4().hex}")
    try:
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, fs_path)
    except BaseException as exc:
        _remove_quietly(fs, tmp)
        if isinstance(exc, OSError):
            raise DataError(
                f"cannot write batch file {path} in directory {directory_display} ({exc}); "
                f"check that the directory is writable and has free space"
            ) from exc
        raise
    return path


def save_batches(datasets: Iterable[DataSet | MultiDataSet], directory: str, prefix: str = "batch") -> list[str]:
    """Write each dataset of ``datasets`` (any iterable, consumed lazily) as ``{prefix}_{i:06d}.safetensors``.

    Args:
        datasets: the batches, e.g. ``rebatch(stream, batch_size)``; one file each, in order.
        directory: local path or fsspec URL; created if missing. It must hold no batch files yet: an earlier
            export there would be read together with this one (``fit_paths(directory)`` trains on both), so it is
            refused, as [`export_batches`][torchspark.spark.export_batches] refuses it.
        prefix: file name prefix (``part-00003_000000.safetensors``). Several writers filling one directory
            write their files with [`save_batch`][torchspark.data.save_batch] under distinct names, as ``export_batches`` does.

    Returns:
        The paths/URLs written, in order (``directory`` joined with the file name).

    Raises:
        DataError: bad ``prefix``, a directory that already holds batch files, an item that is not a
            DataSet/MultiDataSet, or an unwritable directory.
    """
    if not isinstance(prefix, str) or not prefix or "/" in prefix or prefix.startswith("."):
        raise DataError(f"prefix must be a non-empty file name part without '/' or a leading '.', got {prefix!r}")
    fs, fs_path = filesystem(directory)
    refuse_earlier_export(directory, "save_batches")
    _makedirs(fs, fs_path, directory)
    paths = []
    for i, ds in enumerate(datasets):
        if not isinstance(ds, (DataSet, MultiDataSet)):
            raise DataError(f"save_batches: item {i} is a {type(ds).__name__}, expected a DataSet or MultiDataSet")
        paths.append(save_batch(ds, _join(directory, f"{prefix}_{i:06d}{BATCH_SUFFIX}")))
    logger.debug("wrote %d batch files to %s", len(paths), directory)
    return paths


def refuse_earlier_export(directory: str, caller: str) -> None:
    """Refuse a ``directory`` that already holds batch files (``*.safetensors``, not hidden temp files).

    A second export into it would leave both exports there, and ``fit_paths(directory)`` /
    ``evaluate(directory)`` would read both (every example counted twice, stale batches trained on). A directory
    that does not exist yet, or holds other files only, passes.

    Args:
        directory: local path or fsspec URL.
        caller: the function named in the message (``save_batches``, ``export_batches``).

    Raises:
        DataError: naming the directory, how many batch files it holds and one of them, and the fix.
    """
    fs, fs_path = filesystem(directory)
    if not fs.isdir(fs_path):
        return
    names = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(fs_path, detail=False))
    existing = [n for n in names if n.endswith(BATCH_SUFFIX) and not n.startswith(".")]
    if existing:
        raise DataError(
            f"{caller}: {directory!r} already holds {len(existing)} batch file(s) (e.g. {existing[0]!r}), from an "
            "earlier export: a second export there would be read together with it. Export into an empty (or new) "
            "directory, or delete the old files first"
        )


def load_batch(path: str) -> DataSet | MultiDataSet:
    """Read one batch file written by [`save_batch`][torchspark.data.save_batch].

    Raises:
        DataError: the file is missing, unreadable, empty, truncated or foreign; the message names ``path``.
    """
    fs, fs_path = filesystem(path)
    try:
        with fs.open(fs_path, "rb") as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise DataError(f"batch file not found: {path}; check the path or re-export the data") from exc
    except OSError as exc:
        raise DataError(f"cannot read batch file {path} ({exc})") from exc
    return dataset_from_bytes(data, source=path)


def batch_num_examples(path: str) -> int:
    """The number of examples in a batch file, read from its header only (the tensors are not read).

    Raises:
        DataError: the file is missing, unreadable or not a torchspark batch file; the message names ``path``.
    """
    fs, fs_path = filesystem(path)
    try:
        with fs.open(fs_path, "rb") as f:
            head = f.read(8)
            header_len = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 <= header_len <= 100_000_000:
                raise DataError(f"{path} is empty or not a safetensors file; re-export it with save_batches")
            header_bytes = f.read(header_len)
    except FileNotFoundError as exc:
        raise DataError(f"batch file not found: {path}; check the path or re-export the data") from exc
    except OSError as exc:
        raise DataError(f"cannot read batch file {path} ({exc})") from exc
    try:
        metadata = json.loads(header_bytes.decode("utf-8")).get("__metadata__") or {}
        if metadata.get("format") == BATCH_FORMAT and metadata.get("num_examples") is not None:
            return int(metadata["num_examples"])
    except (UnicodeDecodeError, ValueError, AttributeError):
        pass
    return len(load_batch(path))  # no count in the header: read the file (which also reports what is wrong)


def list_batches(directory: str) -> list[str]:
    """The batch files (``*.safetensors``, not hidden temp files) in ``directory``, sorted by name.

    Raises:
        DataError: ``directory`` does not exist or is not a directory.
    """
    fs, fs_path = filesystem(directory)
    if not fs.isdir(fs_path):
        raise DataError(f"batch directory not found: {directory}; export the data first or fix the path")
    names = (posixpath.basename(p.rstrip("/")) for p in fs.ls(fs_path, detail=False))
    return [_join(directory, n) for n in sorted(names) if n.endswith(BATCH_SUFFIX) and not n.startswith(".")]
