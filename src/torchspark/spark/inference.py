"""Distributed inference and scoring: outputs by key, per-example losses, total score, and a prediction column.

DL4J's ``feedForwardWithKey``, ``scoreExamples``, ``calculateScore`` and MLlib ``predict`` in Python. Every
function ships the network once as a broadcast blueprint; each executor Python process builds one copy and
reuses it for every partition it runs (see :class:`~torchspark.spark.evaluation.NetworkCache`), so the network
is deserialised once per Python worker, never once per row.

The RDD-returning functions are lazy, like any Spark transformation: nothing runs (and no data error shows)
until an action such as ``collect`` or ``saveAsTextFile``. Keys exist because Spark does not keep row order
through shuffles; join the output back on them.
"""

from __future__ import annotations

import logging
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from torchspark.data import DataSet, MultiDataSet, rebatch
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network
from torchspark.nn.outputs import check_output_index
from torchspark.spark.dataframes import classification_outputs, feature_shapes
from torchspark.spark.evaluation import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_EVAL_WORKERS,
    ShippedNetwork,
    batch_items,
    check_positive,
    load_batch_item,
    peek_nonempty,
    ship_network,
)
from torchspark.spark.jobs import run_job
from torchspark.spark.session import spark_context

__all__ = [
    "feed_forward_with_key",
    "score_examples",
    "score_examples_with_key",
    "calculate_score",
    "predict",
    "regularization_score",
    "PREDICT_OUTPUTS",
]

log = logging.getLogger(__name__)

#: what :func:`predict` writes: ``"probabilities"`` -> ``array<float>``, ``"class"`` -> ``bigint``
PREDICT_OUTPUTS = ("probabilities", "class")


def regularization_score(network: Network) -> float:
    """The penalty ``0.5 * weight_decay * ||params||^2 + l1 * sum(|params|)`` (0 when both are 0).

    This is DL4J's ``includeRegularization`` term: the loss the updater effectively minimises is the data loss
    plus this. It covers every parameter (biases too), because ``Network`` applies ``weight_decay`` and ``l1``
    to all parameters.
    """
    if network.weight_decay == 0 and network.l1 == 0:
        return 0.0
    flat = network.params_view().detach().double()
    return 0.5 * network.weight_decay * float(flat.dot(flat)) + network.l1 * float(flat.abs().sum())


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


# ------------------------------------------------------------------ feed forward with key
def _stack(values: Sequence[Any], keys: Sequence[Any], dtype: torch.dtype) -> list[torch.Tensor]:
    """Per-example feature values -> one batch tensor per network input, ``(N, *example_shape)``."""
    multi = isinstance(values[0], (list, tuple))
    columns = list(zip(*values)) if multi else [values]
    if multi and any(len(v) != len(values[0]) for v in values):
        raise DataError(f"feed_forward_with_key: every value must hold {len(values[0])} input arrays, as the one "
                        f"for key {keys[0]!r} does")
    stacked = []
    for col in columns:
        tensors = [torch.as_tensor(v) for v in col]
        shape = tensors[0].shape
        for key, t in zip(keys, tensors):
            if t.shape != shape:
                raise DataError(
                    f"feed_forward_with_key: features for key {key!r} have shape {tuple(t.shape)} but key "
                    f"{keys[0]!r} has {tuple(shape)}; each value is one example without a batch dimension"
                )
        batch = torch.stack(tensors)
        stacked.append(batch.to(dtype) if batch.is_floating_point() else batch)
    return stacked


def _feed_forward_partition(shipped: ShippedNetwork, batch_size: int
                            ) -> Callable[[Iterable[tuple[Any, Any]]], Iterator[tuple[Any, Any]]]:
    def run(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
        stream = peek_nonempty(pairs)
        if stream is None:
            return
        with shipped.lease(DEFAULT_EVAL_WORKERS) as net:
            dtype = net.params_view().dtype
            for chunk in _chunks(stream, batch_size):
                keys = [k for k, _ in chunk]
                feats = _stack([v for _, v in chunk], keys, dtype)
                out = net.output(feats if len(feats) > 1 else feats[0])
                outs = out if isinstance(out, tuple) else (out,)
                for i, key in enumerate(keys):
                    # clone: a row view would pickle the whole batch's storage
                    rows = tuple(o[i].clone() for o in outs)
                    yield key, rows[0] if len(rows) == 1 else rows

    return run


def feed_forward_with_key(sc: Any, network: Network, rdd: Any, batch_size: int = DEFAULT_BATCH_SIZE) -> Any:
    """Network outputs for keyed examples: ``RDD[(key, features)] -> RDD[(key, output)]``.

    Args:
        sc: SparkContext or SparkSession.
        network: the network to run (eval mode, output activation applied as in ``Network.output``).
        rdd: pairs ``(key, features)``; ``features`` is ONE example without a batch dimension (a tensor or
            numpy array of the network's input shape), or a tuple of them for a multi-input network.
        batch_size: examples stacked per forward pass; 64 is DL4J's suggestion, raise it for small networks.
    Returns:
        a lazy ``RDD[(key, output)]`` with every key once; ``output`` is that example's CPU tensor (no batch
        dimension), or a tuple of tensors for a multi-output network.
    Raises:
        ConfigError: bad ``batch_size``. Data errors (mismatched shapes) surface when an action runs.
    """
    check_positive(batch_size=batch_size)
    sc = spark_context(sc)
    shipped = ship_network(sc, network)
    return rdd.mapPartitions(_feed_forward_partition(shipped, batch_size), preservesPartitioning=True)


# ------------------------------------------------------------------ scoring
def _score_partition(shipped: ShippedNetwork, batch_size: int, include_regularization: bool
                     ) -> Callable[[Iterable[Any]], Iterator[float]]:
    def run(items: Iterable[Any]) -> Iterator[float]:
        stream = peek_nonempty(items)
        if stream is None:
            return
        with shipped.lease(DEFAULT_EVAL_WORKERS) as net:
            reg = regularization_score(net) if include_regularization else 0.0
            for batch in rebatch((load_batch_item(i) for i in stream), batch_size):
                for value in net.score_examples(batch, batch_size=batch_size).tolist():
                    yield value + reg

    return run


def score_examples(
    sc: Any,
    network: Network,
    data: Any,
    include_regularization: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    features_col: str = "features",
    label_col: str | None = "label",
    feature_shape: Sequence[int] | None = None,
) -> Any:
    """The loss of every example: ``RDD[float]``, in the data's order within each partition.

    Args:
        data: an RDD of DataSet/MultiDataSet (or batch bytes / batch-file paths), a DataFrame (columns as for
            ``fit``) or a list of batch-file paths.
        include_regularization: add :func:`regularization_score` (the L2 and L1 penalties) to each
            example's loss, as DL4J does; False gives the pure data loss (summed over outputs).
        batch_size: examples per forward pass.
    Returns:
        a lazy RDD of floats (use ``.zipWithIndex()`` or :func:`score_examples_with_key` to tell examples apart).
    """
    check_positive(batch_size=batch_size)
    sc = spark_context(sc)
    rdd = batch_items(sc, data, features_col, label_col, feature_shape,
                      classification_outputs(network))
    shipped = ship_network(sc, network)
    return rdd.mapPartitions(_score_partition(shipped, batch_size, include_regularization))


def _score_keyed_partition(shipped: ShippedNetwork, batch_size: int, include_regularization: bool
                           ) -> Callable[[Iterable[tuple[Any, Any]]], Iterator[tuple[Any, float]]]:
    def run(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, float]]:
        stream = peek_nonempty(pairs)
        if stream is None:
            return
        with shipped.lease(DEFAULT_EVAL_WORKERS) as net:
            reg = regularization_score(net) if include_regularization else 0.0
            for chunk in _chunks(stream, batch_size):
                keys, batches = [k for k, _ in chunk], [load_batch_item(v) for _, v in chunk]
                for key, b in zip(keys, batches):
                    if len(b) != 1:
                        raise DataError(f"score_examples_with_key: the DataSet for key {key!r} holds {len(b)} "
                                        "examples; give each key exactly one example (DataSet.split(1))")
                merged = type(batches[0]).merge(batches)  # type: ignore[arg-type]
                scores = net.score_examples(merged, batch_size=len(batches)).tolist()
                for key, value in zip(keys, scores):
                    yield key, value + reg

    return run


def score_examples_with_key(
    sc: Any,
    network: Network,
    rdd: Any,
    include_regularization: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Any:
    """Per-example loss by key: ``RDD[(key, DataSet)] -> RDD[(key, float)]``.

    Args:
        rdd: pairs ``(key, DataSet | MultiDataSet)`` each holding exactly ONE example (as in DL4J); batch bytes
            or a batch-file path work in place of the DataSet.
        include_regularization: as for :func:`score_examples`.
        batch_size: examples merged per forward pass.
    Returns:
        a lazy ``RDD[(key, float)]``.
    Raises:
        DataError (when an action runs): a value with more or fewer than one example, naming its key.
    """
    check_positive(batch_size=batch_size)
    sc = spark_context(sc)
    shipped = ship_network(sc, network)
    return rdd.mapPartitions(_score_keyed_partition(shipped, batch_size, include_regularization),
                             preservesPartitioning=True)


def _loss_sums(net: Network, batch: DataSet | MultiDataSet) -> tuple[float, float]:
    """(sum of per-example losses, number of unmasked examples) of one batch, as ``Network.score`` counts."""
    per, weight = net.batch_losses(batch)
    return float(per.sum()), float(weight.sum())


def _sum_partition(shipped: ShippedNetwork, batch_size: int
                   ) -> Callable[[Iterable[Any]], Iterator[tuple[float, float]]]:
    def run(items: Iterable[Any]) -> Iterator[tuple[float, float]]:
        stream = peek_nonempty(items)
        if stream is None:
            return
        total, count = 0.0, 0.0
        with shipped.lease(DEFAULT_EVAL_WORKERS) as net, torch.no_grad():
            net.module.eval()
            for batch in rebatch((load_batch_item(i) for i in stream), batch_size):
                s, c = _loss_sums(net, batch)
                total, count = total + s, count + c
        yield total, count

    return run


def _add(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def calculate_score(
    sc: Any,
    network: Network,
    data: Any,
    average: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    features_col: str = "features",
    label_col: str | None = "label",
    feature_shape: Sequence[int] | None = None,
) -> float:
    """The loss over all of ``data``: the mean per example (``average=True``, as ``Network.score``) or the sum.

    Label-masked examples count as ``Network.score`` counts them (excluded from the mean). No regularization
    term is added (see :func:`regularization_score`).

    Raises:
        DataError: empty data, missing DataFrame columns, or bad data on an executor.
    """
    check_positive(batch_size=batch_size)
    sc = spark_context(sc)
    rdd = batch_items(sc, data, features_col, label_col, feature_shape,
                      classification_outputs(network))
    shipped = ship_network(sc, network)
    try:
        total, count = run_job(sc, "torchspark calculate_score",
                               lambda: rdd.mapPartitions(_sum_partition(shipped, batch_size))
                               .treeAggregate((0.0, 0.0), _add, _add), "torchspark-eval-job")
    finally:
        shipped.release()
    if count == 0:
        raise DataError("calculate_score got no data: the RDD, DataFrame or path list holds no labelled examples")
    return total / count if average else total


# ------------------------------------------------------------------ DataFrame prediction column
def _series_to_tensor(series: Any, feature_shape: Sequence[int] | None, dtype: torch.dtype) -> torch.Tensor:
    n = len(series)
    if series.isna().any():
        raise DataError(f"predict: the features column has {int(series.isna().sum())} null rows; fill or drop them")
    values = series.to_numpy()
    arr = np.stack(values).astype(np.float32) if values.dtype == object else values.astype(np.float32)
    x = torch.from_numpy(np.ascontiguousarray(arr.reshape(n, -1)))
    if feature_shape:
        try:
            x = x.reshape(n, *feature_shape)
        except RuntimeError as e:
            raise DataError(f"predict: cannot reshape rows of {x.shape[1]} values to feature_shape="
                            f"{tuple(feature_shape)}; fix feature_shape") from e
    return x.to(dtype)


def _to_classes(probs: torch.Tensor) -> np.ndarray:
    """Argmax class of each row; a single sigmoid column is thresholded at 0.5."""
    flat = probs.reshape(probs.shape[0], -1)
    if flat.shape[1] == 1:
        return (flat[:, 0] >= 0.5).to(torch.int64).numpy()
    return flat.argmax(dim=1).numpy()


def _predict_udf(shipped: ShippedNetwork, shapes: Sequence[Sequence[int] | None], batch_size: int,
                 output: str, output_index: int = 0) -> Any:
    from typing import Iterator as TypingIterator
    from typing import Tuple

    import pandas as pd
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType, LongType

    several = len(shapes) > 1

    def predict_batches(batches: Any) -> Any:
        with shipped.lease(DEFAULT_EVAL_WORKERS) as net:
            dtype = net.params_view().dtype
            for batch in batches:
                columns = list(batch) if several else [batch]
                feats = [_series_to_tensor(c, shape, dtype) for c, shape in zip(columns, shapes)]
                out = net.output(feats if several else feats[0], batch_size=batch_size)
                outs = out if isinstance(out, tuple) else (out,)
                if output_index >= len(outs):
                    raise DataError(f"predict: output_index={output_index} but the network gives {len(outs)} "
                                    "output(s)")
                probs = outs[output_index]
                if output == "class":
                    yield pd.Series(_to_classes(probs))
                else:
                    yield pd.Series(list(probs.reshape(probs.shape[0], -1).float().numpy()))

    # real objects, not strings: Spark reads these hints to pick the iterator-of-Series UDF type
    arg = TypingIterator[Tuple[(pd.Series,) * len(shapes)]] if several else TypingIterator[pd.Series]
    predict_batches.__annotations__ = {"batches": arg, "return": TypingIterator[pd.Series]}
    return_type = LongType() if output == "class" else ArrayType(FloatType(), containsNull=False)
    return pandas_udf(predict_batches, returnType=return_type)  # type: ignore[call-overload]


def predict(
    spark: Any,
    network: Network,
    dataframe: Any,
    features_col: str | Sequence[str] = "features",
    output_col: str = "prediction",
    feature_shape: Any = None,
    batch_size: int = 1024,
    output: str = "probabilities",
    output_index: int = 0,
) -> Any:
    """``dataframe`` with a prediction column, computed by a batched Arrow (pandas iterator) UDF.

    Each Python worker builds the network once and runs it on whole Arrow batches
    (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, split into ``batch_size`` forward passes).

    Args:
        spark: SparkSession or SparkContext (unused beyond validation; the DataFrame's session runs the UDF).
        network: the network to run; output ``output_index`` is used.
        dataframe: a Spark DataFrame; every column is kept.
        features_col: an ``array<float>``/``array<double>``, ML ``Vector`` or numeric column; a list of them for
            a network with several inputs (one column per input, in order).
        output_col: the new column's name (replaces a column of that name).
        feature_shape: reshape each row's values, e.g. ``(1, 28, 28)`` for a CNN; with several features columns,
            a list with one shape (or None) per column.
        output_index: which output of a several-output network fills the column (call once per output for
            several columns).
        batch_size: examples per forward pass; 1024 suits small networks, lower it for large ones.
        output: ``"probabilities"`` -> ``array<float>`` of the output activations (softmax probabilities for
            classifiers; take the argmax with ``F.array_position(col, F.array_max(col)) - 1``), or ``"class"`` ->
            ``bigint`` class index (argmax; a single sigmoid output is thresholded at 0.5).
    Returns:
        a new DataFrame (lazy).
    Raises:
        ConfigError: bad ``output`` or ``batch_size``. DataError: no such column; bad rows surface when an action
        runs.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import DataFrame
    from pyspark.sql.functions import col

    check_positive(batch_size=batch_size)
    if output not in PREDICT_OUTPUTS:
        raise ConfigError(f"output must be one of {PREDICT_OUTPUTS}, got {output!r}")
    if not isinstance(dataframe, DataFrame):
        raise DataError(f"predict needs a Spark DataFrame, got {type(dataframe).__name__}")
    check_output_index(network, output_index)
    cols = [features_col] if isinstance(features_col, str) else list(features_col)
    missing = [c for c in cols if c not in dataframe.columns]
    if not cols or missing:
        raise DataError(f"DataFrame has no column(s) {missing or cols!r}; it has {dataframe.columns}. "
                        "Pass features_col=")
    shapes = feature_shapes(feature_shape, len(cols))
    sc = spark_context(spark)
    shipped = ship_network(sc, network)
    features = [vector_to_array(col(c), "float32") if isinstance(dataframe.schema[c].dataType, VectorUDT) else col(c)
                for c in cols]
    udf = _predict_udf(shipped, shapes, batch_size, output, output_index)
    return dataframe.withColumn(output_col, udf(*features))
