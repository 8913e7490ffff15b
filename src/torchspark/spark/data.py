"""Turning Spark data into the workers' minibatches: DataFrames through Arrow, re-batching, export to batch files,
and the balanced assignment of minibatches to workers.

Every route produces one global order of minibatches (input partition order, then order inside the partition),
then assigns minibatch ``p`` of ``L`` to worker ``p * n // L`` after an optional seeded permutation. Export and
Direct use the same order and the same assignment, so they train identically for the same seed.
"""

from __future__ import annotations

import logging
import uuid
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from torchspark._io import atomic_write_bytes, join, make_dirs
from torchspark.data import DataSet, MultiDataSet, dataset_from_bytes, dataset_to_bytes, rebatch, save_batch
from torchspark.errors import ConfigError, DataError
from torchspark.training.assignment import assign_balanced, split_for_workers

__all__ = [
    "dataframe_to_batches",
    "to_batch_rdd",
    "rebatch_partition",
    "export_rdd",
    "worker_rdd_from_paths",
    "worker_rdd_direct",
    "check_export_directory",
]

log = logging.getLogger(__name__)

ARROW_SCHEMA = "batch binary"


# ------------------------------------------------------------------ DataFrame -> serialized DataSets (Arrow)
def _column_to_tensor(col: Any, shape: Sequence[int] | None, integer_labels: bool, name: str) -> torch.Tensor:
    import pyarrow as pa

    n = len(col)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        flat = col.flatten()
        if flat.null_count:
            raise DataError(f"column {name!r} has null values inside its arrays; fill or drop them first")
        values = flat.to_numpy(zero_copy_only=False)
        if n and values.size % n:
            raise DataError(f"column {name!r} has arrays of different lengths; every row needs the same length")
        arr = values.reshape(n, -1) if n else values.reshape(0, 0)
    else:
        if col.null_count:
            raise DataError(f"column {name!r} has {col.null_count} null values; fill or drop them first")
        arr = col.to_numpy(zero_copy_only=False)
    if integer_labels:
        if arr.ndim == 1 and np.issubdtype(arr.dtype, np.floating) and not np.all(np.mod(arr, 1) == 0):
            raise DataError(f"label column {name!r} holds non-integer values but the loss expects class indices")
        return torch.as_tensor(arr.astype(np.int64)) if arr.ndim == 1 else torch.as_tensor(arr.astype(np.float32))
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    t = torch.from_numpy(arr if arr.flags.writeable else arr.copy())  # Arrow buffers are read-only
    if shape:
        try:
            t = t.reshape(n, *shape)
        except RuntimeError as e:
            raise DataError(
                f"cannot reshape column {name!r} rows of {t.shape[1] if t.dim() > 1 else 1} values to "
                f"feature_shape={tuple(shape)}; fix feature_shape"
            ) from e
    return t


def dataframe_to_batches(
    features_col: str, label_col: str | None, feature_shape: Sequence[int] | None, integer_labels: bool
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function: Arrow record batches -> one serialized DataSet per record batch."""
    import pyarrow as pa

    def convert(batches: Iterable[Any]) -> Iterator[Any]:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            x = _column_to_tensor(rb.column(features_col), feature_shape, False, features_col)
            y = None if label_col is None else _column_to_tensor(rb.column(label_col), None, integer_labels,
                                                                   label_col)
            blob = dataset_to_bytes(DataSet(x, y))
            yield pa.RecordBatch.from_arrays([pa.array([blob], type=pa.binary())], names=["batch"])

    return convert


def to_batch_rdd(
    data: Any,
    features_col: str = "features",
    label_col: str | None = "label",
    feature_shape: Sequence[int] | None = None,
    integer_labels: bool = True,
) -> Any:
    """An RDD of DataSet/MultiDataSet (or serialized batches) from an RDD or a DataFrame.

    DataFrames stream through Arrow (``mapInArrow``) on the executors; nothing is collected on the driver.
    ML ``Vector`` columns are converted with ``vector_to_array``.
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if isinstance(data, RDD):
        return data
    if isinstance(data, DataFrame):
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT

        cols = [features_col] + ([label_col] if label_col else [])
        missing = [c for c in cols if c not in data.columns]
        if missing:
            raise DataError(f"DataFrame has no column(s) {missing}; it has {data.columns}. "
                            "Pass features_col= / label_col=")
        df = data.select(*cols)
        for c in cols:
            if isinstance(df.schema[c].dataType, VectorUDT):
                df = df.withColumn(c, vector_to_array(c, "float32"))
        fn = dataframe_to_batches(features_col, label_col, feature_shape, integer_labels)
        return df.mapInArrow(fn, ARROW_SCHEMA).rdd.map(lambda row: bytes(row[0]))
    raise DataError(
        f"training data must be an RDD of DataSet/MultiDataSet or a Spark DataFrame, got {type(data).__name__}"
    )


def _as_batch(item: Any) -> DataSet | MultiDataSet:
    if isinstance(item, (DataSet, MultiDataSet)):
        return item
    if isinstance(item, (bytes, bytearray)):
        return dataset_from_bytes(bytes(item))
    raise DataError(f"the RDD holds a {type(item).__name__}; expected DataSet, MultiDataSet or batch bytes")


def rebatch_partition(batch_size: int) -> Callable[[Iterable[Any]], Iterator[bytes]]:
    """``mapPartitions`` function: re-batch a partition to exactly ``batch_size`` examples, serialized."""

    def fn(items: Iterable[Any]) -> Iterator[bytes]:
        for ds in rebatch((_as_batch(i) for i in items), batch_size):
            yield dataset_to_bytes(ds)

    return fn


# ------------------------------------------------------------------ export
def check_export_directory(directory: str) -> None:
    """Fail fast, on the driver, when the export directory cannot be created or written."""
    make_dirs(directory, DataError, "export directory")
    probe = join(directory, f".probe-{uuid.uuid4().hex}")
    atomic_write_bytes(probe, b"ok", DataError)
    from torchspark._io import filesystem

    fs, path = filesystem(probe)
    fs.rm(path)


def _export_partition(directory: str, batch_size: int) -> Callable[[int, Iterable[Any]], Iterator[tuple[int, int, str]]]:
    def fn(index: int, items: Iterable[Any]) -> Iterator[tuple[int, int, str]]:
        token = uuid.uuid4().hex[:8]
        for i, ds in enumerate(rebatch((_as_batch(x) for x in items), batch_size)):
            path = join(directory, f"part{index:05d}-{token}_{i:06d}.safetensors")
            save_batch(ds, path)
            yield index, i, path

    return fn


def export_rdd(rdd: Any, directory: str, batch_size: int) -> list[tuple[int, str]]:
    """Write every partition as batch files of ``batch_size`` examples; returns ``(partition, path)`` in order."""
    rows = rdd.mapPartitionsWithIndex(_export_partition(directory, batch_size)).collect()
    rows.sort(key=lambda r: (r[0], r[1]))
    return [(part, path) for part, _, path in rows]


# ------------------------------------------------------------------ assignment of minibatches to workers
def worker_rdd_from_paths(sc: Any, groups: list[list[str]]) -> Any:
    """An RDD with one partition per worker holding that worker's batch-file paths, in order."""
    n = len(groups)
    return sc.parallelize(range(n), n).mapPartitionsWithIndex(lambda i, _: iter(groups[i]))


def group_paths(paths: Sequence[tuple[int, str]], num_workers: int, rng_seed: int | None,
                by_partition: bool) -> list[list[str]]:
    """Split exported paths into per-worker lists (balanced, or one input partition per worker)."""
    if by_partition:
        groups: list[list[str]] = [[] for _ in range(num_workers)]
        for part, path in paths:
            groups[part].append(path)
        return groups
    return split_for_workers([p for _, p in paths], num_workers, rng_seed)


def worker_rdd_direct(indexed: Any, total: int, num_workers: int, rng_seed: int | None, storage_level: Any) -> Any:
    """Balanced repartition of serialized minibatches to ``num_workers`` partitions, same plan as export.

    Args:
        indexed: ``rdd_of_batch_bytes.zipWithIndex()``; ``total`` is its ``count()`` (the caller times both).
    """
    plan = assign_balanced(total, num_workers, rng_seed)
    plan_bc = indexed.context.broadcast(plan)
    out = (indexed.map(partial(_slot_key, plan_bc))
           .repartitionAndSortWithinPartitions(num_workers, partitionFunc=partial(_slot_partition, num_workers,
                                                                                    max(total, 1)))
           .values())
    if storage_level is not None:
        out = out.persist(storage_level)
    return out


def _slot_key(plan_bc: Any, pair: tuple[bytes, int]) -> tuple[int, bytes]:
    blob, g = pair
    return int(plan_bc.value[g][1]), blob


def _slot_partition(num_workers: int, total: int, slot: int) -> int:
    return slot * num_workers // total


def storage_level_by_name(name: str) -> Any:
    """``pyspark.StorageLevel`` from its name (``"MEMORY_ONLY"``, ``"MEMORY_AND_DISK"``, ``"DISK_ONLY"`` ...)."""
    from pyspark import StorageLevel

    level = getattr(StorageLevel, name, None)
    if not isinstance(level, StorageLevel):
        raise ConfigError(f"unknown storage_level {name!r}; use a pyspark.StorageLevel name such as 'MEMORY_ONLY'")
    return level
