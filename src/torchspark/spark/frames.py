"""Evaluation and inference data as a DataFrame the executors read: the route that needs no RDD, so it runs on a
Spark Connect session (and serves DataFrames on a classic one too).

`frame_data` turns the user's data into a `FrameData`: a DataFrame plus the function that turns its
Arrow record batches into batches on an executor.

* a DataFrame -> its features and label columns (`training_frame`), each Arrow
  record batch one batch (`arrow_to_batch`);
* batch files (a directory, a glob, one file, a list of paths) -> a DataFrame with one ``path`` row per file
  (``spark.createDataFrame``: Spark spreads the rows over ``min(files, default parallelism)`` partitions), each
  file read by an executor (``load_batch``, or the user's ``loader``). The client lists a directory or a glob, as a
  classic driver does, so it must see the location (a shared mount or an object store URL).

A job then runs one function over the frame's partitions with ``mapInArrow`` (not a barrier stage: partitions run
whenever slots free up) and returns small rows: partial evaluations as JSON, loss sums, written file names. The
network reaches the function as `torchspark.spark.shipped` decides (a broadcast on a classic session, the
closure or a session artifact under Connect).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from torchspark.data import Columns, DataSet, MultiDataSet, load_batch, resolve_paths
from torchspark.data.columns import DEFAULT_COLUMNS
from torchspark.errors import ConfigError, DataError
from torchspark.spark.connect.jobs import run_tagged
from torchspark.spark.dataframes import arrow_to_batch, training_frame
from torchspark.spark.jobs import run_job
from torchspark.spark.session import spark_context
from torchspark.spark.session_kinds import is_connect_session, require_classic
from torchspark.training.assignment import check_loader, load_with

__all__ = [
    "PATH_COLUMN",
    "FrameData",
    "frame_data",
    "dataframe_batches",
    "is_dataframe",
    "collect_rows",
    "run_session_job",
    "DATAFRAME_ROUTE",
]

#: the column of a DataFrame of batch-file paths
PATH_COLUMN = "path"

#: what works on a Spark Connect session, for the messages refusing the rest
DATAFRAME_ROUTE = (
    "pass a DataFrame (features_col=, label_col=, feature_shape= or columns=) or batch files (a directory, a glob, "
    "a file or a list of paths, e.g. export_batches' output)"
)

Batch = DataSet | MultiDataSet


@dataclass(frozen=True)
class FrameData:
    """Data the executors read through a DataFrame.

    Attributes:
        frame: the DataFrame whose partitions the job maps over (its columns as ``to_batches`` reads them).
        to_batches: on an executor, one partition's Arrow record batches -> its batches (picklable).
        what: how messages name the data (``"the DataFrame"``, ``"3 batch files"``).
    """

    frame: Any
    to_batches: Callable[[Iterable[Any]], Iterator[Batch]]
    what: str


def is_dataframe(data: Any) -> bool:
    """Whether ``data`` is a Spark DataFrame of either session kind."""
    from pyspark.sql import DataFrame

    return isinstance(data, DataFrame)


def frame_data(
    spark: Any,
    data: Any,
    columns: Columns = DEFAULT_COLUMNS,
    integer_labels: bool | Sequence[bool] = True,
    loader: Callable[[str], Any] | None = None,
) -> FrameData:
    """``data`` as a `FrameData` of ``spark`` (a DataFrame keeps its own session).

    Args:
        data: a DataFrame (its ``columns`` read), or batch files: a directory, a glob, one file or a list of
            paths/URLs the executors can read.
        integer_labels: per label column, whether labels are class indices (see ``network_batches``).
        loader: ``fn(path) -> DataSet`` for files that are not batch files (``data`` must then be paths).
    Raises:
        ConfigError: an RDD or a list of in-memory batches on a Spark Connect session (the message names the
            DataFrame route), or a ``loader`` with a DataFrame.
        DataError: missing columns or a column of the wrong type, an empty path list, a missing location.
    """
    check_loader(loader)
    if is_dataframe(data):
        if loader is not None:
            raise ConfigError(
                "loader= reads files: pass paths (a directory, a glob, a file or a list of paths), not "
                "a DataFrame; drop loader= to evaluate the DataFrame's columns"
            )
        df = training_frame(data, columns)
        return FrameData(df, dataframe_batches(columns, integer_labels), "the DataFrame")
    if _is_paths(data):
        paths = resolve_paths(data, any_file=loader is not None)
        frame = spark.createDataFrame([(p,) for p in paths], f"{PATH_COLUMN} string")
        return FrameData(frame, partial(_files_to_batches, loader), f"{len(paths)} file(s)")
    require_classic(spark, f"a {type(data).__name__} input", DATAFRAME_ROUTE)
    raise DataError(f"expected a DataFrame or batch-file paths, got a {type(data).__name__}; {DATAFRAME_ROUTE}")


def dataframe_batches(
    columns: Columns, integer_labels: bool | Sequence[bool]
) -> Callable[[Iterable[Any]], Iterator[Batch]]:
    """On an executor: the Arrow record batches of `training_frame`'s columns
    -> one batch per non-empty record batch (a null or a ragged array raises ``DataError`` naming the column)."""
    return partial(_record_batches_to_batches, arrow_to_batch(columns, integer_labels))


def _record_batches_to_batches(to_batch: Callable[[Any], Batch], record_batches: Iterable[Any]) -> Iterator[Batch]:
    for rb in record_batches:
        if rb.num_rows:
            yield to_batch(rb)


def _is_paths(data: Any) -> bool:
    if isinstance(data, (str, os.PathLike)):
        return True
    return isinstance(data, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in data)


def _files_to_batches(loader: Callable[[str], Any] | None, record_batches: Iterable[Any]) -> Iterator[Batch]:
    """On an executor: the ``path`` rows of one partition -> their files' batches, in row order."""
    for rb in record_batches:
        for path in rb.column(PATH_COLUMN).to_pylist():
            yield load_batch(path) if loader is None else load_with(loader, path)


def run_session_job(
    spark: Any, description: str, action: Callable[[], Any], thread_name: str = "torchspark-job"
) -> Any:
    """Run ``action`` (DataFrame actions of ``spark``, a session of either kind) so that Ctrl-C cancels it and a
    failed task raises `task_error` (an executor's ``DataError`` as a ``DataError``):
    under a job group on a classic session, under an operation tag on Spark Connect
    (`run_tagged`).

    Example: ``rows = run_session_job(df.sparkSession, "torchspark evaluate", df.mapInArrow(fn, schema).collect)``.
    """
    if is_connect_session(spark):
        return run_tagged(spark, description, action)
    return run_job(spark_context(spark), description, action, thread_name)


def collect_rows(
    data: FrameData, fn: Callable[[Iterable[Any]], Iterator[Any]], schema: str, description: str
) -> list[Any]:
    """Run ``fn`` (record batches -> record batches of ``schema``) over every partition of ``data`` with
    ``mapInArrow`` and collect its rows on the client (`run_session_job`: Ctrl-C cancels it, an executor's
    ``DataError`` is raised here)."""
    frame = data.frame.mapInArrow(fn, schema)
    return run_session_job(data.frame.sparkSession, description, frame.collect, "torchspark-eval-job")
