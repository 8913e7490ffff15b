"""DataFrames as training data: each Arrow record batch becomes one serialized minibatch on the executors
(``mapInArrow``), nothing collected on the driver.

`to_batch_rdd` takes an RDD of DataSets as it is and turns a DataFrame's features and label columns into
batches; `network_batches` does so with one label flag per output of a network (class indices for a
classification loss, floats for a regression loss), as training, evaluation and inference read a DataFrame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchspark.data import Columns, DataSet, MultiDataSet, dataset_to_bytes
from torchspark.data.columns import DEFAULT_COLUMNS
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network

__all__ = [
    "ARROW_SCHEMA",
    "dataframe_to_batches",
    "arrow_to_batch",
    "training_frame",
    "check_columns_present",
    "check_column_type",
    "to_batch_rdd",
    "classification_outputs",
    "network_batches",
]

ARROW_SCHEMA = "batch binary"


# ------------------------------------------------------------------ DataFrame -> serialized DataSets (Arrow)
def _column_to_tensor(
    col: Any, shape: Sequence[int] | None, integer_labels: bool, name: str, keep_dtype: bool = False
) -> torch.Tensor:
    """One column of a record batch as a tensor: class indices (``integer_labels``), else float32 values, or with
    ``keep_dtype`` (keyword features) int64 for integer and boolean columns, float32 for the others."""
    import pyarrow as pa

    n = len(col)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        if col.null_count:
            raise DataError(
                f"column {name!r} has {col.null_count} null row(s) (the whole array is null); drop "
                f"them first: df.dropna(subset=[{name!r}])"
            )
        flat = col.flatten()
        if flat.null_count:
            raise DataError(f"column {name!r} has null values inside its arrays; fill or drop them first")
        values = flat.to_numpy(zero_copy_only=False)
        lengths = pa.compute.list_value_length(col).to_numpy(zero_copy_only=False) if n else np.zeros(0)
        if n and lengths.min() != lengths.max():  # equal totals (3 x 6 + 2 = 4 x 5) must not pass as a reshape
            row = int(np.flatnonzero(lengths != lengths[0])[0])
            raise DataError(
                f"column {name!r} has arrays of different lengths ({int(lengths[0])} in its first row "
                f"of this batch, {int(lengths[row])} in row {row}); every row needs the same length: "
                "fix or drop the odd rows"
            )
        arr = values.reshape(n, -1) if n else values.reshape(0, 0)
    else:
        if col.null_count:
            raise DataError(f"column {name!r} has {col.null_count} null values; fill or drop them first")
        arr = col.to_numpy(zero_copy_only=False)
    if integer_labels:
        if arr.ndim == 1 and np.issubdtype(arr.dtype, np.floating) and not np.all(np.mod(arr, 1) == 0):
            bad = float(arr[np.flatnonzero(np.mod(arr, 1) != 0)[0]])
            raise DataError(
                f"label column {name!r} holds non-integer values (e.g. {bad:g}) but the loss expects class "
                "indices; cast the column to integers, or train a regression loss (loss='mse')"
            )
        return torch.as_tensor(arr.astype(np.int64)) if arr.ndim == 1 else torch.as_tensor(arr.astype(np.float32))
    integer = keep_dtype and (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_)
    arr = np.ascontiguousarray(arr, dtype=np.int64 if integer else np.float32)
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
    columns: Columns, integer_labels: bool | Sequence[bool]
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function: Arrow record batches -> one serialized batch per record batch.

    One features column and at most one label column (given as plain names) give a DataSet; lists of columns
    give a MultiDataSet with one features array per features column (one network input each) and one labels
    array per label column (one output each).
    """
    import pyarrow as pa

    to_batch = arrow_to_batch(columns, integer_labels)

    def convert(batches: Iterable[Any]) -> Iterator[Any]:
        for rb in batches:
            if rb.num_rows == 0:
                continue
            blob = dataset_to_bytes(to_batch(rb))
            yield pa.RecordBatch.from_arrays([pa.array([blob], type=pa.binary())], names=["batch"])

    return convert


def arrow_to_batch(columns: Columns, integer_labels: bool | Sequence[bool]) -> Callable[[Any], DataSet | MultiDataSet]:
    """A function turning one Arrow record batch (or table) of a DataFrame's rows into one DataSet or MultiDataSet
    (the conversion `dataframe_to_batches` applies to every record batch; the Spark Connect route applies it
    to each minibatch's rows).

    One features column and at most one label column (given as plain names) give a DataSet; lists of columns give
    a MultiDataSet; a mapping of keyword inputs to columns gives a MultiDataSet whose features carry those names
    (``module(**features)``), integer columns as int64 tensors. ``integer_labels``: one flag per label column (class indices, else float targets), or one for
    all. Raises DataError (from the returned function) on nulls, ragged arrays or a shape that does not fit.

    Example: ``arrow_to_batch(Columns(feature_shape=(1, 8, 8)), True)(record_batch)`` -> a DataSet.
    """
    fcols, lcols, shapes, multi = columns.feature_names, columns.label_names, columns.shapes, columns.several
    keywords = columns.keywords
    # one flag per label column (a network's losses differ per output); a single flag applies to every column
    flags = list(integer_labels) if isinstance(integer_labels, (list, tuple)) else [integer_labels]
    ints = [bool(flags[k] if k < len(flags) else flags[-1]) for k in range(len(lcols))]

    def to_batch(rb: Any) -> DataSet | MultiDataSet:
        keep = keywords is not None
        xs = [_column_to_tensor(_array(rb.column(c)), shape, False, c, keep) for c, shape in zip(fcols, shapes)]
        ys = [_column_to_tensor(_array(rb.column(c)), None, ints[k], c) for k, c in enumerate(lcols)]
        if keywords is not None:
            return MultiDataSet(dict(zip(keywords, xs)), ys or None)
        return MultiDataSet(xs, ys or None) if multi else DataSet(xs[0], ys[0] if ys else None)

    return to_batch


def _array(col: Any) -> Any:
    """One Arrow array from a column of a record batch or a table (whose columns are chunked)."""
    import pyarrow as pa

    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def to_batch_rdd(data: Any, columns: Columns = DEFAULT_COLUMNS, integer_labels: bool | Sequence[bool] = True) -> Any:
    """An RDD of DataSet/MultiDataSet (or serialized batches) from an RDD or a DataFrame.

    DataFrames stream through Arrow (``mapInArrow``) on the executors; nothing is collected on the driver.
    ML ``Vector`` columns are converted with ``vector_to_array``. Lists of feature/label columns give
    MultiDataSets (one network input per features column, one output per label column).
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if isinstance(data, RDD):
        return data
    if isinstance(data, DataFrame):
        df = training_frame(data, columns)
        fn = dataframe_to_batches(columns, integer_labels)
        return df.mapInArrow(fn, ARROW_SCHEMA).rdd.map(lambda row: bytes(row[0]))
    raise DataError(
        f"training data must be an RDD of DataSet/MultiDataSet or a Spark DataFrame, got {type(data).__name__}"
    )


def training_frame(data: Any, columns: Columns = DEFAULT_COLUMNS) -> Any:
    """The DataFrame's features and label columns, checked (they exist, hold numbers, arrays of numbers or ML
    Vectors) and with ML Vectors turned into float32 arrays:
    what every DataFrame route (classic and Spark Connect) reads, before any job runs.

    Raises:
        DataError: a missing column or a column of another type.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    cols = columns.names
    check_columns_present(columns, cols, data.columns)
    df = data.select(*cols)
    schema = df.schema
    for c in cols:
        check_column_type(c, schema[c].dataType)
        if isinstance(schema[c].dataType, VectorUDT):
            df = df.withColumn(c, vector_to_array(c, "float32"))
    return df


def check_columns_present(columns: Columns, wanted: Sequence[str], available: Sequence[str]) -> None:
    """Every column of ``wanted`` (read through ``columns``) is among the DataFrame's ``available`` columns.

    Raises:
        ConfigError: a features mapping (``features_col={"input_ids": "ids"}``) naming a missing column, with its
            keyword and the DataFrame's columns.
        DataError: another missing column.
    """
    missing = [c for c in wanted if c not in available]
    if not missing:
        return
    keywords = columns.keywords
    if keywords is not None:
        named = [f"{k}={c!r}" for k, c in zip(keywords, columns.feature_names) if c in missing]
        if named:
            raise ConfigError(
                f"features_col maps {', '.join(named)} but the DataFrame has no column(s) "
                f"{[c for c in missing if c in columns.feature_names]}; it has {list(available)}. Map each "
                "keyword input to one of those columns"
            )
    raise DataError(f"DataFrame has no column(s) {missing}; it has {list(available)}. Pass features_col= / label_col=")


def check_column_type(name: str, data_type: Any) -> None:
    """Features and labels must be numbers, arrays of numbers or ML Vectors: say which column is not, before any
    job runs."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, BooleanType, NumericType

    element = data_type
    while isinstance(element, ArrayType):
        element = element.elementType
    if isinstance(data_type, VectorUDT) or isinstance(element, (NumericType, BooleanType)):
        return
    raise DataError(
        f"DataFrame column {name!r} has type {data_type.simpleString()}; features and labels must be "
        "numbers, arrays of numbers or ML Vectors. Convert it first (e.g. F.col(...).cast('double'), "
        "StringIndexer for class names, VectorAssembler for several numeric columns)"
    )


def classification_outputs(network: Network) -> list[bool]:
    """One flag per output of ``network``: whether its labels are class indices (its loss is a classification)."""
    return [loss.classification for loss in network.losses]


def network_batches(network: Network, data: Any, columns: Columns = DEFAULT_COLUMNS) -> Any:
    """`to_batch_rdd` with each label column read as its output's loss wants it
    (`classification_outputs`).

    Example: for a network with a ``cross_entropy`` and an ``mse`` output, ``Columns(label=["cls", "reg"])`` gives
    integer class indices for ``cls`` and float targets for ``reg``.
    """
    return to_batch_rdd(data, columns, classification_outputs(network))
