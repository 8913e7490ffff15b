"""What distributed evaluation and inference read: the data's items, and the checks of their options.

Both run over an RDD whose items an executor turns into batches: `batch_items` makes that RDD from what the
user passed (an RDD, a DataFrame, batch files, or paths with a ``loader``), and `load_evaluation_item` /
`load_batch_item` turn one item into a batch on the executor. `peek_nonempty` lets an empty partition
return before it builds a network.

Example::

    rdd = batch_items(sc, "s3://bucket/batches/", loader=None)    # an RDD of batch-file paths
    rdd.mapPartitions(lambda items: (load_evaluation_item(i).num_examples() for i in items))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

from torchspark.data import Columns, DataSet, MultiDataSet, resolve_paths
from torchspark.data.columns import DEFAULT_COLUMNS
from torchspark.errors import ConfigError, DataError
from torchspark.spark.dataframes import to_batch_rdd
from torchspark.training.assignment import check_loader, load_with

__all__ = [
    "load_batch_item",
    "load_evaluation_item",
    "batch_items",
    "peek_nonempty",
]


def load_batch_item(item: Any) -> DataSet | MultiDataSet:
    """A batch from an RDD item: a DataSet/MultiDataSet, serialized batch bytes or a batch-file path."""
    from torchspark.training.worker.loop import load_item

    try:
        return load_item(item)
    except TypeError:
        raise DataError(
            f"the data holds a {type(item).__name__}; expected DataSet, MultiDataSet, batch bytes or a batch-file path"
        ) from None


def load_evaluation_item(item: Any, loader: Callable[[str], Any] | None = None) -> DataSet | MultiDataSet:
    """`load_batch_item`, or with a user ``loader`` the batch it makes of the file path ``item``.

    Raises:
        DataError: with ``loader``, an item that is not a path (the data must then be paths), or a loader that
            returns something other than a DataSet/MultiDataSet.
    """
    if loader is None:
        return load_batch_item(item)
    if not isinstance(item, (str, os.PathLike)):
        raise DataError(
            f"with loader= the data must be file paths, but it holds a {type(item).__name__}; drop "
            "loader= for RDDs of DataSets, batch bytes or batch files"
        )
    return load_with(loader, os.fspath(item))


def batch_items(
    sc: Any,
    data: Any,
    columns: Columns = DEFAULT_COLUMNS,
    integer_labels: bool | Sequence[bool] = True,
    loader: Callable[[str], Any] | None = None,
) -> Any:
    """An RDD whose items `load_evaluation_item` (with the same ``loader``) turns into batches.

    Args:
        data: an RDD of DataSet/MultiDataSet (or batch bytes, or batch-file paths), a DataFrame (its ``columns``
            read), or batch files (``export_batches`` / ``save_batches`` output): a directory, a glob, one file
            or a list of paths/URLs.
        loader: ``fn(path) -> DataSet`` for files that are not batch files (as in ``fit_paths``); ``data`` must
            then be paths (a directory then means every non-hidden file in it) or an RDD of paths.
    Raises:
        ConfigError: a ``loader`` that is not a function, or one given with a DataFrame.
        DataError: an empty path list, a missing location, a directory or glob without batch files, a DataFrame
            without the named columns, or another type.
    """
    check_loader(loader)
    if isinstance(data, (str, os.PathLike, list, tuple)):  # a directory, a glob, one file or a list of files
        paths = resolve_paths(data, any_file=loader is not None)
        return sc.parallelize(paths, max(1, min(len(paths), sc.defaultParallelism)))
    if loader is not None:
        from pyspark import RDD

        if not isinstance(data, RDD):
            raise ConfigError(
                f"loader= reads files: pass paths (a directory, a glob, a file, a list or an RDD of "
                f"paths), not a {type(data).__name__}; drop loader= to evaluate it"
            )
        return data
    return to_batch_rdd(data, columns, integer_labels)


def peek_nonempty(items: Iterable[Any]) -> Iterator[Any] | None:
    """``items`` as an iterator, or None when it is empty (so empty partitions never build a network)."""
    it = iter(items)
    first = next(it, _EMPTY)
    return None if first is _EMPTY else chain([first], it)


_EMPTY = object()
