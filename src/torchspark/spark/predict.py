"""A prediction column: ``predict(spark, network, df)`` adds the network's outputs to every row of a DataFrame.

MLlib's ``predict`` for torchspark, and what ``TorchModel.transform`` and keyed inference on DataFrames use. A
batched Arrow (pandas iterator) UDF runs the network on whole Arrow batches; the network reaches it as
`torchspark.spark.shipped` decides for the DataFrame's session (a broadcast on a classic session, the closure
or a session artifact on Spark Connect), and each Python worker builds it once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from torchspark.data import Columns
from torchspark.data.columns import DEFAULT_COLUMNS
from torchspark.errors import ConfigError, DataError, SetupError
from torchspark.nn import Network
from torchspark.nn.inference import check_non_finite, non_finite_message, non_finite_rows
from torchspark.nn.outputs import check_output_index
from torchspark.spark.dataframes import check_column_type, check_columns_present
from torchspark.spark.frames import is_dataframe
from torchspark.spark.shipped import DEFAULT_EVAL_WORKERS, Shipped, ship_to_session
from torchspark.validation import check_int

__all__ = ["predict", "PREDICT_OUTPUTS", "predictions", "read_parquet", "read_table", "column_range", "write_parquet"]

#: what `predict` writes: ``"probabilities"`` -> ``array<float>``, ``"class"`` -> ``bigint``
PREDICT_OUTPUTS = ("probabilities", "class")


def _series_to_tensor(
    series: Any, feature_shape: Sequence[int] | None, dtype: torch.dtype, keep_dtype: bool = False
) -> torch.Tensor:
    """One features column of an Arrow batch as a tensor of the network's ``dtype``, or with ``keep_dtype``
    (keyword features) int64 for an integer or boolean column."""
    n = len(series)
    if series.isna().any():
        raise DataError(f"predict: the features column has {int(series.isna().sum())} null rows; fill or drop them")
    values = series.to_numpy()
    arr = np.stack(values) if values.dtype == object and n else values
    integer = keep_dtype and (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_)
    arr = arr.astype(np.int64 if integer else np.float32)
    x = torch.from_numpy(np.ascontiguousarray(arr.reshape(n, -1)))
    if feature_shape:
        try:
            x = x.reshape(n, *feature_shape)
        except RuntimeError as e:
            raise DataError(
                f"predict: cannot reshape rows of {x.shape[1]} values to feature_shape="
                f"{tuple(feature_shape)}; fix feature_shape"
            ) from e
    return x if integer else x.to(dtype)


def _to_classes(probs: torch.Tensor) -> np.ndarray:
    """Argmax class of each row; a single sigmoid column is thresholded at 0.5."""
    flat = probs.reshape(probs.shape[0], -1)
    if flat.shape[1] == 1:
        return (flat[:, 0] >= 0.5).to(torch.int64).numpy()
    return flat.argmax(dim=1).numpy()


def predictions(
    net: Network,
    feats: list[torch.Tensor],
    columns: Sequence[str],
    batch_size: int,
    output: str,
    output_index: int,
    non_finite: str,
    keywords: Sequence[str] | None = None,
) -> Any:
    """One Arrow batch's prediction Series: ``output`` of network output ``output_index`` for the features
    ``feats`` (one tensor per features column, named ``columns``; passed as the keyword inputs ``keywords`` when
    given).

    A row whose features hold NaN or inf, or whose output does (a network with non-finite parameters, or an
    overflow), never gets a class or probabilities silently: ``non_finite="error"`` raises DataError naming the
    column and the row, ``"null"`` gives that row a null (the other rows are what they would be without it).
    """
    import pandas as pd

    bad = non_finite_rows(feats)
    if non_finite == "error" and bool(bad.any()):
        named = columns[0] if len(columns) == 1 else list(columns)
        raise DataError(
            non_finite_message(
                f"predict (features column {named!r})", feats, bad, lambda i: f"row {i} of its Arrow batch"
            )
            + "; find them with F.exists(col, lambda v: F.isnan(v) | (F.abs(v) == float('inf')))"
        )
    inputs: Any = dict(zip(keywords, feats)) if keywords is not None else feats if len(feats) > 1 else feats[0]
    out = net.output(inputs, batch_size=batch_size, non_finite="null")
    outs = out if isinstance(out, tuple) else (out,)
    if output_index >= len(outs):
        raise DataError(f"predict: output_index={output_index} but the network gives {len(outs)} output(s)")
    probs = outs[output_index]
    nulls = non_finite_rows([probs])
    if non_finite == "error" and bool(nulls.any()):
        first = int(torch.nonzero(nulls).flatten()[0])
        raise DataError(
            f"predict: the network's output is NaN or inf for {int(nulls.sum())} of {len(nulls)} rows whose "
            f"features are finite (the first: row {first} of its Arrow batch); its parameters are not finite or "
            "its forward overflows: check torch.isfinite(net.params()).all() and retrain, or pass "
            "non_finite='null' to get null predictions for those rows"
        )
    if output == "class":
        classes = pd.Series(_to_classes(probs), dtype="Int64")
        return classes.mask(pd.Series(nulls.numpy()), pd.NA) if bool(nulls.any()) else classes
    rows = list(probs.reshape(probs.shape[0], -1).float().numpy())
    return pd.Series([None if null else row for row, null in zip(rows, nulls.tolist())] if bool(nulls.any()) else rows)


def _predict_udf(
    shipped: Shipped,
    shapes: Sequence[Sequence[int] | None],
    batch_size: int,
    output: str,
    output_index: int,
    columns: Sequence[str],
    non_finite: str,
    keywords: Sequence[str] | None = None,
) -> Any:
    from collections.abc import Iterator as TypingIterator

    import pandas as pd
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType, LongType

    several = len(shapes) > 1

    def predict_batches(batches: Any) -> Any:
        with shipped.lease(DEFAULT_EVAL_WORKERS) as net:
            dtype = net.params_view().dtype
            for batch in batches:
                series = list(batch) if several else [batch]
                keep = keywords is not None
                feats = [_series_to_tensor(c, shape, dtype, keep) for c, shape in zip(series, shapes)]
                yield predictions(net, feats, columns, batch_size, output, output_index, non_finite, keywords)

    # real objects, not strings: Spark reads these hints to pick the iterator-of-Series UDF type
    arg = TypingIterator[tuple[(pd.Series,) * len(shapes)]] if several else TypingIterator[pd.Series]
    predict_batches.__annotations__ = {"batches": arg, "return": TypingIterator[pd.Series]}
    return_type = LongType() if output == "class" else ArrayType(FloatType(), containsNull=False)
    return pandas_udf(predict_batches, returnType=return_type)  # type: ignore[call-overload]


def predict(
    spark: Any,
    network: Network,
    dataframe: Any,
    columns: Columns = DEFAULT_COLUMNS,
    output_col: str = "prediction",
    batch_size: int = 1024,
    output: str = "probabilities",
    output_index: int = 0,
    non_finite: str = "error",
) -> Any:
    """``dataframe`` with a prediction column, computed by a batched Arrow (pandas iterator) UDF.

    Each Python worker builds the network once and runs it on whole Arrow batches
    (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, split into ``batch_size`` forward passes).

    Args:
        spark: the session (classic or Spark Connect) or a SparkContext; the DataFrame's own session runs the UDF
            and decides how the network ships.
        network: the network to run; output ``output_index`` is used.
        dataframe: a Spark DataFrame; every column is kept.
        columns: the features columns (``array<float>``/``array<double>``, ML ``Vector`` or numeric; one per
            network input, or a mapping of keyword inputs to columns, whose integer columns stay int64) and their
            shapes; the label is not read.
        output_col: the new column's name (replaces a column of that name).
        output_index: which output of a several-output network fills the column (call once per output for
            several columns).
        batch_size: examples per forward pass; 1024 suits small networks, lower it for large ones.
        output: ``"probabilities"`` -> ``array<float>`` of the output activations (softmax probabilities for
            classifiers; take the argmax with ``F.array_position(col, F.array_max(col)) - 1``), or ``"class"`` ->
            ``bigint`` class index (argmax; a single sigmoid output is thresholded at 0.5).
        non_finite: a row whose features hold NaN or inf (after the cast to the network's dtype), or whose output
            does: ``"error"`` (default) fails the action with DataError naming the column and the row; ``"null"``
            writes a null prediction for it (class and probabilities alike), the other rows unchanged.
    Returns:
        a new DataFrame (lazy).
    Raises:
        ConfigError: bad ``output``, ``batch_size`` or ``non_finite``; a features mapping naming a missing
        column. DataError: no such column; a keyword features column that is not numeric; bad rows surface when an
        action runs.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.functions import col

    check_int("batch_size", batch_size, 1)
    if output not in PREDICT_OUTPUTS:
        raise ConfigError(f"output must be one of {PREDICT_OUTPUTS}, got {output!r}")
    check_non_finite("predict", non_finite)
    if not is_dataframe(dataframe):
        raise DataError(f"predict needs a Spark DataFrame, got {type(dataframe).__name__}")
    check_output_index(network, output_index)
    cols, shapes = columns.feature_names, columns.shapes
    check_columns_present(columns, cols, dataframe.columns)
    if columns.keywords is not None:
        for c in dict.fromkeys(cols):
            check_column_type(c, dataframe.schema[c].dataType)
    shipped = ship_to_session(dataframe.sparkSession, network)
    features = [
        vector_to_array(col(c), "float32") if isinstance(dataframe.schema[c].dataType, VectorUDT) else col(c)
        for c in cols
    ]
    udf = _predict_udf(shipped, shapes, batch_size, output, output_index, cols, non_finite, columns.keywords)
    return dataframe.withColumn(output_col, udf(*features))


#: a torchspark error raised in a Python worker, as Spark's error text quotes it
_WORKER_ERROR = re.compile(r"torchspark\.errors\.(DataError|ConfigError): (.+)")


def _first_line(error: BaseException) -> str:
    """The first non-empty line of Spark's error (the JVM's stack trace and the Python worker's traceback left
    out)."""
    for line in str(error).splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__


def _spark_errors() -> tuple[type[BaseException], ...]:
    from pyspark.errors import PySparkException

    try:
        from py4j.protocol import Py4JError
    except ImportError:  # a Spark Connect client (pyspark-client, torchspark[connect-client]) has no py4j
        return (PySparkException,)
    return (PySparkException, Py4JError)


def read_parquet(spark: Any, path: str, option: str = "--data") -> Any:
    """``spark.read.parquet(path)``, with Spark's error (a missing path, a file that is not Parquet) as one line.

    Raises:
        DataError: naming ``option``, the path and Spark's first line.
    """
    try:
        return spark.read.parquet(path)
    except _spark_errors() as e:
        raise DataError(
            f"{option} {path!r} cannot be read as Parquet ({_first_line(e)}); pass a Parquet file or a directory "
            "of Parquet files"
        ) from None


def read_table(spark: Any, name: str, option: str = "--data") -> Any:
    """``spark.read.table(name)``: a table or view of the session's catalog (Hive metastore, Unity Catalog's
    ``catalog.schema.table``), with Spark's error as one line.

    Raises:
        DataError: naming ``option``, the table and Spark's first line.
    """
    try:
        return spark.read.table(name)
    except _spark_errors() as e:
        raise DataError(
            f"{option} table:{name}: the session's catalog has no such table ({_first_line(e)}); check the name "
            "(catalog.schema.table where the catalog has three levels) or pass a Parquet path"
        ) from None


def column_range(frame: Any, column: str) -> tuple[Any, Any]:
    """The smallest and largest value of ``column`` (one aggregation job; ``(None, None)`` when it has no values)."""
    from pyspark.sql import functions as F

    row = frame.agg(F.min(column).alias("lo"), F.max(column).alias("hi")).head()
    return row["lo"], row["hi"]


def write_parquet(dataframe: Any, path: str, mode: str = "errorifexists", option: str = "--output") -> None:
    """``dataframe.write.mode(mode).parquet(path)``, with Spark's error as one line.

    Raises:
        DataError: a row the network cannot take (a null or misshapen features value: the worker's message).
        ConfigError: ``path`` exists and ``mode`` is ``"errorifexists"``.
        SetupError: any other failure of the write (Spark's first line).
    """
    try:
        dataframe.write.mode(mode).parquet(path)
    except _spark_errors() as e:
        text = str(e)
        found = _WORKER_ERROR.search(text)
        if found is not None:
            raise DataError(found.group(2).strip()) from None
        if "PATH_ALREADY_EXISTS" in text or "already exists" in text:
            raise ConfigError(
                f"{option} {path!r} already exists; pass --overwrite to replace it, or choose a new directory"
            ) from None
        raise SetupError(f"{option} {path!r}: Spark could not write the predictions ({_first_line(e)})") from None
