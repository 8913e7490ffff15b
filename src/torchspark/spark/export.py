"""The ``export`` approach: write the training RDD once as batch files, then train from their names.

Where the files go (`export_base`): ``export_directory`` when set, which must be storage every executor can
read (``hdfs://``, ``s3://``, a mount shared by all hosts); its exports stay until ``delete_temp_files()``/``close()``.
Each holds an owner record (`mark_export`), so that the next export to the same ``export_directory`` removes
those a killed driver left (`remove_dead_exports`: this host's drivers that no longer run, nothing else).
Without it only local masters (``local``, ``local[N]``, ``local-cluster[...]``) work: all executors share one host,
so a private directory under Spark's local directory (``spark.local.dir``, else the temp directory) is readable by
all of them (see `torchspark.spark.private_dirs`: 0700, a fresh ``mkdtemp`` name, removed on close, garbage
collection and interpreter exit, and by the next run if the driver was killed). Any other master fails before the
first job instead of handing workers paths that exist only on another host.

How the files are cut (`export_rdd`): each partition on its own grid of ``batch_size`` (for
``repartition="never"`` and ``"spark_default"``), or on the balanced plan's global grid when given the partitions'
``heads`` (`torchspark.training.assignment.grid_heads`).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torchspark._io import atomic_write_bytes, filesystem, join, make_dirs
from torchspark.data import recut, save_batch
from torchspark.errors import ConfigError, DataError
from torchspark.spark.data import as_batch
from torchspark.spark.private_dirs import OWNER_FILE, owner_gone, owner_record

__all__ = [
    "is_local_master",
    "export_base",
    "check_export_directory",
    "export_name",
    "mark_export",
    "remove_dead_exports",
    "export_rdd",
]

log = logging.getLogger(__name__)

_EXPORT_NAME = re.compile(r"[0-9a-f]{12}-rdd[0-9]+")


def is_local_master(master: str) -> bool:
    """Whether every executor of ``master`` runs on the driver's host (``local``, ``local[4]``,
    ``local-cluster[2,1,1024]``)."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def export_base(export_directory: str | None, master: str, spark_local_dir: str | None, temp_dir: str) -> str:
    """The directory exports go under (a pure decision, so it is testable without a cluster): ``export_directory``,
    or for local masters the local directory in which a private ``torchspark-export-*`` directory is created.

    Args:
        export_directory: the master's ``export_directory``; used as it is when set.
        master: the Spark master URL (``sc.master``).
        spark_local_dir: the ``spark.local.dir`` setting (comma-separated directories; the first is used) or None.
        temp_dir: the temp directory to fall back on (``tempfile.gettempdir()``).
    Raises:
        ConfigError: no ``export_directory`` and a master whose executors may run on other hosts.
    """
    if export_directory:
        return export_directory
    if not is_local_master(master):
        raise ConfigError(
            f"export_directory is not set and the Spark master {master!r} is not local: executors on other hosts "
            "would write batch files to their own disks, where workers elsewhere cannot read them. Set "
            "export_directory to storage every executor can read (an hdfs:// or s3:// URL, or a directory mounted "
            "on all hosts), or use rdd_training_approach='direct'"
        )
    local_dirs = [d.strip() for d in (spark_local_dir or "").split(",") if d.strip()]
    return local_dirs[0] if local_dirs else temp_dir


def check_export_directory(directory: str) -> None:
    """Fail fast, on the driver, when the export directory cannot be created or written."""
    make_dirs(directory, DataError, "export directory")
    probe = join(directory, f".probe-{uuid.uuid4().hex}")
    atomic_write_bytes(probe, b"ok", DataError)
    fs, path = filesystem(probe)
    fs.rm(path)


def export_name(rdd_id: int) -> str:
    """A fresh name for one export of RDD ``rdd_id`` (``<12 hex>-rdd<id>``)."""
    return f"{uuid.uuid4().hex[:12]}-rdd{rdd_id}"


def mark_export(directory: str) -> None:
    """Record this driver process as the owner of the export ``directory`` (the private directories' record)."""
    atomic_write_bytes(join(directory, OWNER_FILE), json.dumps(owner_record()).encode(), DataError)


def remove_dead_exports(base: str) -> list[str]:
    """Remove the exports under ``base`` (an ``export_directory``) whose owner record names a driver of this host
    that no longer runs (killed, out of memory: nothing could call ``close()``). Exports without a record (other
    versions, or another writer), other hosts' and live drivers' are left alone. Never raises; returns the
    removed URLs."""
    fs, root = filesystem(base)
    try:
        entries = fs.ls(root, detail=True)
    except (OSError, ValueError):
        return []
    removed = []
    for entry in entries:
        path = str(entry.get("name", "")).rstrip("/")
        name = path.rsplit("/", 1)[-1]
        if entry.get("type") != "directory" or entry.get("islink") or not _EXPORT_NAME.fullmatch(name):
            continue
        url = join(base, name)
        try:
            with fs.open(join(path, OWNER_FILE), "rb") as f:
                owner = json.loads(f.read(4096))
        except (OSError, ValueError):
            continue  # no record: not ours to judge
        if not isinstance(owner, dict) or not owner_gone(owner):
            continue
        try:
            fs.rm(path, recursive=True)
        except (OSError, ValueError) as e:
            log.warning(
                "could not remove %s, an export of driver process %s that is gone: %s", url, owner.get("pid"), e
            )
            continue
        log.info("removed %s, an export of driver process %s that is gone", url, owner.get("pid"))
        removed.append(url)
    return removed


def export_rdd(
    rdd: Any, directory: str, batch_size: int, heads: Sequence[int] | None = None
) -> list[tuple[int, str, int]]:
    """Write every partition as batch files of ``batch_size`` examples; ``(partition, path, examples)`` in order.

    Only the file names and counts reach the driver.

    Args:
        heads: per partition, the size of its first file (then ``batch_size`` each; 0 = start with a full one),
            so the files follow the balanced plan's global grid. None: every partition on its own grid (the last
            file of each may be short).
    """
    rows = rdd.mapPartitionsWithIndex(_export_partition(directory, batch_size, heads)).collect()
    rows.sort(key=lambda r: (r[0], r[1]))
    return [(part, path, examples) for part, _, path, examples in rows]


def _export_partition(
    directory: str, batch_size: int, heads: Sequence[int] | None
) -> Callable[[int, Iterable[Any]], Iterator[tuple[int, int, str, int]]]:
    def fn(index: int, items: Iterable[Any]) -> Iterator[tuple[int, int, str, int]]:
        token = uuid.uuid4().hex[:8]
        head = heads[index] if heads else 0
        sizes = itertools.chain([head] if head else [], itertools.repeat(batch_size))
        for i, ds in enumerate(recut((as_batch(x) for x in items), sizes)):
            path = join(directory, f"part{index:05d}-{token}_{i:06d}.safetensors")
            save_batch(ds, path)
            yield index, i, path, len(ds)

    return fn
