"""Where batch files are: a directory, a glob, a single file or a list, on any fsspec URL, resolved to file paths.

``fit_paths`` and ``evaluate`` (Spark and ParallelWrapper) take any of these, so the "preprocess once, train many
times" route reads the same however the user names the files::

    "hdfs:///data/train"              every batch file in the directory (``*.safetensors``, not hidden temp files)
    "s3://bucket/train/part-*.safetensors"   every file matching the glob
    ["/data/a.safetensors", ...]     the files as listed (not checked here: the workers report a missing one)

With a user ``loader`` (a function ``path -> DataSet``, e.g. decoding PNG files or CSV shards) a directory means
every non-hidden file in it, since the files are not batch files.
"""

from __future__ import annotations

import os
from typing import Any

from torchspark._io import filesystem, join
from torchspark.data.batchfiles import BATCH_SUFFIX
from torchspark.errors import DataError

__all__ = ["resolve_paths", "is_glob"]

_GLOB_CHARS = "*?["


def is_glob(path: str) -> bool:
    """Whether ``path`` is a glob pattern (contains ``*``, ``?`` or ``[``)."""
    return any(c in path for c in _GLOB_CHARS)


def resolve_paths(spec: Any, any_file: bool = False) -> list[str]:
    """File paths/URLs named by ``spec``, sorted by name (a list is kept as given).

    Args:
        spec: a directory, a glob pattern or one file (str or ``os.PathLike``, any fsspec URL), or a non-empty
            list/tuple of file paths.
        any_file: count every non-hidden file of a directory (for a user loader), not only ``*.safetensors``.
    Raises:
        DataError: an empty list, a list item that is not a path, a location that does not exist, or a
            directory/glob that names no files; the message names the location and how to fix it.
    """
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise DataError("the list of paths is empty; pass at least one file, a directory or a glob")
        for i, item in enumerate(spec):
            if not isinstance(item, (str, os.PathLike)):
                raise DataError(f"paths[{i}] is a {type(item).__name__}; a list must hold file paths (str)")
        return [os.fspath(p) for p in spec]
    if not isinstance(spec, (str, os.PathLike)):
        raise DataError(
            f"paths must be a directory, a glob, a file path, a list of paths or an RDD of paths; got "
            f"a {type(spec).__name__}"
        )
    location = os.fspath(spec)
    fs, fs_path = filesystem(location)
    remote = "://" in location

    def shown(p: str) -> str:
        return fs.unstrip_protocol(p) if remote else p

    if is_glob(location):
        found = sorted(p for p in fs.glob(fs_path) if not os.path.basename(p).startswith(".") and fs.isfile(p))
        if not found:
            raise DataError(f"no files match {location!r}; check the pattern (and that the export finished)")
        return [shown(p) for p in found]
    if fs.isdir(fs_path):
        names = sorted(
            os.path.basename(e["name"].rstrip("/")) for e in fs.ls(fs_path, detail=True) if e.get("type") == "file"
        )
        keep = [n for n in names if not n.startswith(".") and (any_file or n.endswith(BATCH_SUFFIX))]
        if not keep:
            what = "files" if any_file else f"batch files (*{BATCH_SUFFIX})"
            raise DataError(
                f"directory {location!r} holds no {what}; export the data first "
                f"(torchspark.spark.export_batches / save_batches) or fix the path"
            )
        return [join(location, n) for n in keep]
    if fs.exists(fs_path):
        return [location]
    raise DataError(
        f"{location!r} does not exist: no such file or directory; check the path, or export the data "
        "first with torchspark.spark.export_batches"
    )
