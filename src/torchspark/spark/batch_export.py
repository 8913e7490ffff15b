"""``export_batches``: "preprocess once" as a public API (DL4J's ``BatchAndExportDataSetsFunction``).

Turn an RDD of DataSets, an RDD of raw records plus your function, or a DataFrame into safetensors batch files of
exactly ``batch_size`` examples, written by the executors; then train and evaluate many times from the paths
(``SparkNetwork.fit_paths(directory)``, ``evaluate(directory)``). Nothing but file names and counts reaches the
driver, so the data may be far larger than the driver's memory.

Steps: (1) every partition is re-batched on its executor; its full batches are written as
``part{p}-{token}_{i}.safetensors`` and its remainder (fewer than ``batch_size`` examples) as a hidden
``.rest-...`` file; (2) one small task reads the remainders in partition order, merges them into full batches
(the last may be short) written as ``rest-{token}_{i}.safetensors``, and deletes them. Hidden files are never
listed as batch files, so a crash leaves no half-export behind in a listing.

A DataFrame (on a classic or a Spark Connect session) runs both steps as ``mapInArrow`` jobs whose rows are the
written files (step 2 over a one-row DataFrame of the remainders' names), so no RDD is needed; an RDD runs them as
RDD jobs. The files are the same either way.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

from torchspark._io import filesystem, join
from torchspark.data import Columns, DataSet, MultiDataSet, load_batch, rebatch, save_batch
from torchspark.data.batchfiles import refuse_earlier_export
from torchspark.data.columns import FeaturesCol
from torchspark.errors import ConfigError, DataError
from torchspark.spark.data import as_batch
from torchspark.spark.dataframes import to_batch_rdd, training_frame
from torchspark.spark.export import check_export_directory
from torchspark.spark.frames import dataframe_batches, is_dataframe, run_session_job
from torchspark.spark.jobs import run_job
from torchspark.spark.session_kinds import require_classic
from torchspark.validation import check_int

__all__ = ["export_batches"]

_Row = tuple[int, int, str, int]  # (partition, index, path, examples)


def export_batches(
    data: Any,
    directory: str,
    batch_size: int,
    record_fn: Callable[[Any], DataSet | MultiDataSet] | None = None,
    features_col: FeaturesCol = "features",
    label_col: str | Sequence[str] | None = "label",
    feature_shape: Any = None,
    integer_labels: bool = True,
    columns: Columns | None = None,
) -> list[str]:
    """Write ``data`` as batch files of exactly ``batch_size`` examples under ``directory``; returns their paths.

    Args:
        data: an ``RDD[DataSet | MultiDataSet]`` (items of any size), an RDD of raw records with ``record_fn``,
            or a DataFrame (columns as for ``SparkNetwork.fit``; lists of columns give a MultiDataSet).
        directory: any fsspec URL every executor can write and every worker can read (``hdfs://``, ``s3://``, a
            shared mount; a local path only for local masters). Created if missing.
        batch_size: examples per file; use the ``batch_size_per_worker`` you will train with, so each file is one
            minibatch read once per epoch (any size works: ``fit_paths`` re-batches).
        record_fn: ``fn(record) -> DataSet | MultiDataSet`` turning one raw record (a CSV line, an image's bytes)
            into examples; runs on the executors.
        features_col, label_col, feature_shape, integer_labels: DataFrame input only (``integer_labels``: labels
            are class indices; False keeps them as float targets).
        columns: the three column options in one [`Columns`][torchspark.data.Columns] value (giving both is a
            ConfigError).
    Returns:
        The paths/URLs of the batch files, full ones in partition order, then the merged remainders; only the
        last file may hold fewer than ``batch_size`` examples.
    Raises:
        ConfigError: a bad ``batch_size``, a ``record_fn`` that is not callable or comes with a DataFrame, or an
            RDD on a Spark Connect session (pass a DataFrame there).
        DataError: an unwritable directory, a directory that already holds batch files (an earlier export: both
            would be read as one), or data an executor could not turn into batches (the message names
            the record's type or the column; nulls and ragged arrays in a DataFrame too).
    """
    check_int("batch_size", batch_size, 1)
    cols = Columns.of(columns, features_col, label_col, feature_shape, owner="export_batches")
    if record_fn is not None and not callable(record_fn):
        raise ConfigError(f"record_fn must be a function record -> DataSet, got {type(record_fn).__name__}")
    if is_dataframe(data):
        if record_fn is not None:
            raise ConfigError(
                "record_fn turns the raw records of an RDD into DataSets; a DataFrame's features and "
                "label columns are read directly: drop record_fn (or compute the columns first)"
            )
        return _export_dataframe(data, directory, batch_size, cols, integer_labels)
    require_classic(_active_session(), f"export_batches of a {type(data).__name__}", "pass a DataFrame")
    rdd = to_batch_rdd(data, cols, integer_labels)
    if record_fn is not None:
        rdd = rdd.map(partial(_apply_record_fn, record_fn))
    _check_target(directory)
    sc = rdd.context
    token = uuid.uuid4().hex[:8]
    rows: list[_Row] = run_job(  # (1)
        sc,
        f"torchspark: export batches to {directory}",
        rdd.mapPartitionsWithIndex(partial(_export_partition, directory, batch_size, token)).collect,
    )
    rows.sort()
    full = [r for r in rows if r[0] >= 0]
    rests = [r[2] for r in rows if r[0] < 0]
    merged: list[_Row] = []
    if rests:  # (2) a few small files, merged in one task
        merged = run_job(
            sc,
            "torchspark: merge the partitions' remainders",
            sc.parallelize([rests], 1).flatMap(partial(_merge_rests, directory, batch_size, token)).collect,
        )
    return [path for _, _, path, _ in full + sorted(merged)]


def _check_target(directory: str) -> None:
    """The directory is writable and holds no batch files yet: a second export into it would leave both exports
    there, and ``evaluate(directory)`` / ``fit_paths(directory)`` would read both (every example counted twice)."""
    check_export_directory(directory)
    refuse_earlier_export(directory, "export_batches")


def _active_session() -> Any:
    """This process's active session (a Spark Connect one in a Connect client), or None."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def _apply_record_fn(fn: Callable[[Any], Any], record: Any) -> DataSet | MultiDataSet:
    out = fn(record)
    if not isinstance(out, (DataSet, MultiDataSet)):
        raise DataError(
            f"record_fn returned a {type(out).__name__} for a {type(record).__name__} record; it must "
            "return a DataSet or MultiDataSet (e.g. DataSet(features[None], labels[None]) for one "
            "example)"
        )
    return out


def _export_partition(directory: str, batch_size: int, token: str, index: int, items: Iterable[Any]) -> Iterator[_Row]:
    """Full batches as files; the remainder as a hidden rest file, reported with partition ``-1 - index``."""
    for i, ds in enumerate(rebatch((as_batch(x) for x in items), batch_size)):
        if len(ds) == batch_size:
            path = join(directory, f"part{index:05d}-{token}_{i:06d}.safetensors")
            yield index, i, save_batch(ds, path), len(ds)
        else:  # rebatch yields at most one short batch: the last
            path = join(directory, f".rest-part{index:05d}-{token}.safetensors")
            yield -1 - index, 0, save_batch(ds, path), len(ds)


def _merge_rests(directory: str, batch_size: int, token: str, rest_paths: Sequence[str]) -> Iterator[_Row]:
    ordered = sorted(rest_paths)  # partition order (zero-padded names)
    for i, ds in enumerate(rebatch((load_batch(p) for p in ordered), batch_size)):
        path = join(directory, f"rest-{token}_{i:06d}.safetensors")
        yield 1 << 30, i, save_batch(ds, path), len(ds)
    for p in ordered:
        fs, fs_path = filesystem(p)
        fs.rm(fs_path)


# ------------------------------------------------------------------ the DataFrame route (any session)
_ROW_SCHEMA = "part long, idx long, path string, examples long"


def _export_dataframe(
    data: Any,
    directory: str,
    batch_size: int,
    columns: Columns,
    integer_labels: Any,
) -> list[str]:
    """Steps (1) and (2) as ``mapInArrow`` jobs of the DataFrame's own session."""
    frame = training_frame(data, columns)
    to_batches = dataframe_batches(columns, integer_labels)
    _check_target(directory)
    spark = data.sparkSession
    token = uuid.uuid4().hex[:8]
    written = frame.mapInArrow(partial(_write_partition, directory, batch_size, token, to_batches), _ROW_SCHEMA)
    rows = sorted(
        tuple(r) for r in run_session_job(spark, f"torchspark: export batches to {directory}", written.collect)
    )
    full = [r for r in rows if r[0] >= 0]
    rests = [r[2] for r in rows if r[0] < 0]
    merged: list[_Row] = []
    if rests:
        names = spark.createDataFrame([(json.dumps(rests),)], "rests string")
        merging = names.mapInArrow(partial(_merge_rest_rows, directory, batch_size, token), _ROW_SCHEMA)
        merged = sorted(
            tuple(r) for r in run_session_job(spark, "torchspark: merge the partitions' remainders", merging.collect)
        )
    return [path for _, _, path, _ in full + merged]


def _as_record_batch(rows: Iterable[_Row]) -> Iterator[Any]:
    import pyarrow as pa

    for part, idx, path, examples in rows:
        yield pa.RecordBatch.from_pydict(
            {
                "part": pa.array([part], pa.int64()),
                "idx": pa.array([idx], pa.int64()),
                "path": [path],
                "examples": pa.array([examples], pa.int64()),
            }
        )


def _write_partition(
    directory: str,
    batch_size: int,
    token: str,
    to_batches: Callable[[Iterable[Any]], Iterator[DataSet | MultiDataSet]],
    record_batches: Iterable[Any],
) -> Iterator[Any]:
    from pyspark import TaskContext

    index = TaskContext.get().partitionId()
    yield from _as_record_batch(_export_partition(directory, batch_size, token, index, to_batches(record_batches)))


def _merge_rest_rows(directory: str, batch_size: int, token: str, record_batches: Iterable[Any]) -> Iterator[Any]:
    for rb in record_batches:
        for text in rb.column("rests").to_pylist():
            yield from _as_record_batch(_merge_rests(directory, batch_size, token, json.loads(text)))
