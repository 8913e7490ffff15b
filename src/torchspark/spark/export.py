"""The ``export`` approach: write the training RDD once as batch files, then train from their names.

How the files are cut (:func:`export_rdd`): each partition on its own grid of ``batch_size`` (for
``repartition="never"`` and ``"spark_default"``), or on the balanced plan's global grid when given the partitions'
``heads`` (:func:`torchspark.training.assignment.grid_heads`).
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, Callable, Iterable, Iterator, Sequence

from torchspark._io import atomic_write_bytes, filesystem, join, make_dirs
from torchspark.data import recut, save_batch
from torchspark.errors import DataError
from torchspark.spark.data import as_batch

__all__ = ["check_export_directory", "export_rdd"]

def check_export_directory(directory: str) -> None:
    """Fail fast, on the driver, when the export directory cannot be created or written."""
    make_dirs(directory, DataError, "export directory")
    probe = join(directory, f".probe-{uuid.uuid4().hex}")
    atomic_write_bytes(probe, b"ok", DataError)
    fs, path = filesystem(probe)
    fs.rm(path)


def export_rdd(rdd: Any, directory: str, batch_size: int,
               heads: Sequence[int] | None = None) -> list[tuple[int, str, int]]:
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


def _export_partition(directory: str, batch_size: int, heads: Sequence[int] | None
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
