"""Distributed inference and scoring: outputs by key, per-example losses, total score, and a prediction column.

DL4J's ``feedForwardWithKey``, ``scoreExamples``, ``calculateScore`` and MLlib ``predict`` in Python. Every
function ships the network once (`torchspark.spark.shipped`: a broadcast on a classic session, the closure or
a session artifact on Spark Connect); each executor Python process builds one copy and reuses it for every
partition it runs (see `NetworkCache`), so the network is deserialised once per
Python worker, never once per row.

What comes back follows what goes in: an RDD gives a lazy RDD (classic sessions only); a DataFrame gives a lazy
DataFrame (on any session, Spark Connect included), each row keeping its columns - its key - beside the new
output or score column; batch-file paths give an RDD on a classic session and a ``path, example, score``
DataFrame on Spark Connect. Nothing runs (and no data error shows) until an action such as ``collect`` or a
write. Keys exist because Spark does not keep row order through shuffles; join the output back on them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Any

import torch

from torchspark.data import Columns, rebatch
from torchspark.data.batching import merge_batches
from torchspark.data.columns import DEFAULT_COLUMNS
from torchspark.errors import DataError
from torchspark.nn import Network
from torchspark.nn.inference import check_non_finite, non_finite_message, non_finite_rows
from torchspark.spark.dataframes import classification_outputs
from torchspark.spark.eval_inputs import batch_items, load_batch_item, peek_nonempty
from torchspark.spark.evaluation import DEFAULT_BATCH_SIZE
from torchspark.spark.frame_jobs import (
    loss_sums,
    loss_sums_frame,
    regularization_score,
    score_column,
    score_files,
)
from torchspark.spark.frames import frame_data, is_dataframe
from torchspark.spark.jobs import run_job
from torchspark.spark.predict import PREDICT_OUTPUTS, predict
from torchspark.spark.session import spark_context
from torchspark.spark.session_kinds import is_connect_session, require_classic
from torchspark.spark.shipped import DEFAULT_EVAL_WORKERS, Shipped, ship_network, ship_to_session
from torchspark.validation import check_int

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

#: what keyed inference on a DataFrame needs, for the message refusing other inputs under Spark Connect
KEYED_ROUTE = "pass a DataFrame with a key column and a features column (key_col=, features_col=)"


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
        raise DataError(
            f"feed_forward_with_key: every value must hold {len(values[0])} input arrays, as the one "
            f"for key {keys[0]!r} does"
        )
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


def _key_name(keys: Sequence[Any], index: int) -> str:
    return f"key {keys[index]!r}"


def _feed_forward_partition(
    shipped: Shipped, batch_size: int, non_finite: str = "error"
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
                bad = non_finite_rows(feats)
                if non_finite == "error" and bool(bad.any()):
                    raise DataError(non_finite_message("feed_forward_with_key", feats, bad, partial(_key_name, keys)))
                out = net.output(feats if len(feats) > 1 else feats[0], non_finite="null")
                outs = out if isinstance(out, tuple) else (out,)
                for i, key in enumerate(keys):
                    # clone: a row view would pickle the whole batch's storage
                    rows = tuple(o[i].clone() for o in outs)
                    yield key, rows[0] if len(rows) == 1 else rows

    return run


def feed_forward_with_key(
    sc: Any,
    network: Network,
    data: Any,
    batch_size: int = DEFAULT_BATCH_SIZE,
    key_col: str = "key",
    columns: Columns = DEFAULT_COLUMNS,
    output_col: str = "output",
    output_index: int = 0,
    non_finite: str = "error",
) -> Any:
    """Network outputs for keyed examples: ``RDD[(key, features)] -> RDD[(key, output)]``, or a DataFrame's
    ``key_col`` and features -> a DataFrame ``key_col, output_col``.

    Args:
        sc: SparkContext, SparkSession or Spark Connect session (a DataFrame runs on its own session).
        network: the network to run (eval mode, output activation applied as in ``Network.output``).
        data: an RDD of pairs ``(key, features)``; ``features`` is ONE example without a batch dimension (a
            tensor or numpy array of the network's input shape), or a tuple of them for a multi-input network.
            Or a DataFrame (the route on Spark Connect, which has no RDDs) with a ``key_col`` column of any type
            and ``features_col`` (array or ML Vector columns; a list of them for several inputs).
        batch_size: examples stacked per forward pass; 64 is DL4J's suggestion, raise it for small networks.
        key_col, columns, output_col, output_index: DataFrame input only. ``columns`` names the features
            columns and their shapes (the label is not read); ``output_index`` picks the output of a
            several-output network; ``output_col`` names the result column.
        non_finite: an example whose features hold NaN or inf: ``"error"`` (default) fails the action with
            DataError naming its key; ``"null"`` gives it NaN outputs (RDD) or a null ``output_col`` (DataFrame).
    Returns:
        for an RDD, a lazy ``RDD[(key, output)]`` with every key once; ``output`` is that example's CPU tensor
        (no batch dimension), or a tuple of tensors for a multi-output network. For a DataFrame, a lazy
        DataFrame ``key_col, output_col`` with one row per input row; ``output_col`` is the output flattened to
        ``array<float>``.
    Raises:
        ConfigError: bad ``batch_size``; a non-DataFrame input on a Spark Connect session.
        DataError: a missing DataFrame column. Bad rows (mismatched shapes, nulls) surface when an action runs.
    """
    check_int("batch_size", batch_size, 1)
    check_non_finite("feed_forward_with_key", non_finite)
    if is_dataframe(data):
        cols = columns.feature_names
        if key_col not in data.columns:
            raise DataError(f"DataFrame has no key column {key_col!r}; it has {data.columns}. Pass key_col=")
        frame = data.select(key_col, *[c for c in dict.fromkeys(cols) if c != key_col and c in data.columns])
        out = predict(
            frame.sparkSession,
            network,
            frame,
            columns,
            output_col,
            batch_size,
            "probabilities",
            output_index,
            non_finite,
        )
        return out.select(key_col, output_col)
    require_classic(sc, f"feed_forward_with_key on a {type(data).__name__}", KEYED_ROUTE)
    sc = spark_context(sc)
    shipped = ship_network(sc, network)
    return data.mapPartitions(_feed_forward_partition(shipped, batch_size, non_finite), preservesPartitioning=True)


# ------------------------------------------------------------------ scoring
def _score_partition(
    shipped: Shipped, batch_size: int, include_regularization: bool
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
    columns: Columns = DEFAULT_COLUMNS,
    score_col: str = "score",
) -> Any:
    """The loss of every example.

    Args:
        sc: SparkContext, SparkSession or Spark Connect session (a DataFrame runs on its own session).
        data: an RDD of DataSet/MultiDataSet (or batch bytes / batch-file paths), a DataFrame (columns as for
            ``fit``) or batch-file paths (a directory, a glob, a file or a list).
        include_regularization: add `regularization_score` (the L2 and L1 penalties) to each
            example's loss, as DL4J does; False gives the pure data loss (summed over outputs).
        batch_size: examples per forward pass.
        columns: the DataFrame's columns (DataFrame input only), as for ``fit``.
        score_col: the new column of a DataFrame input.
    Returns:
        for a DataFrame, the DataFrame (every column kept: keep an id column to tell rows apart) plus
        ``score_col`` (double), lazy. For an RDD or paths on a classic session, a lazy RDD of floats in the data's
        order within each partition (``.zipWithIndex()`` or `score_examples_with_key` tell examples apart);
        for paths on Spark Connect, a lazy DataFrame ``path, example, score`` (``example``: the index in its file).
    Raises:
        ConfigError: bad ``batch_size``; an RDD or a list of batches on a Spark Connect session.
        DataError: missing DataFrame columns; bad rows (nulls, ragged arrays) when an action runs.
    """
    check_int("batch_size", batch_size, 1)
    flags = classification_outputs(network)
    if is_dataframe(data):
        shipped = ship_to_session(data.sparkSession, network)
        return score_column(shipped, data, score_col, include_regularization, batch_size, columns, flags)
    if is_connect_session(sc):
        frame = frame_data(sc, data, columns, flags)
        return score_files(ship_to_session(sc, network), frame, batch_size, include_regularization)
    sc = spark_context(sc)
    rdd = batch_items(sc, data, columns, flags)
    shipped = ship_network(sc, network)
    return rdd.mapPartitions(_score_partition(shipped, batch_size, include_regularization))


def _score_keyed_partition(
    shipped: Shipped, batch_size: int, include_regularization: bool
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
                        raise DataError(
                            f"score_examples_with_key: the DataSet for key {key!r} holds {len(b)} "
                            "examples; give each key exactly one example (DataSet.split(1))"
                        )
                merged = merge_batches(batches)
                scores = net.score_examples(merged, batch_size=len(batches)).tolist()
                for key, value in zip(keys, scores):
                    yield key, value + reg

    return run


def score_examples_with_key(
    sc: Any,
    network: Network,
    data: Any,
    include_regularization: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    key_col: str = "key",
    columns: Columns = DEFAULT_COLUMNS,
    score_col: str = "score",
) -> Any:
    """Per-example loss by key: ``RDD[(key, DataSet)] -> RDD[(key, float)]``, or a DataFrame's rows -> a DataFrame
    ``key_col, score_col``.

    Args:
        data: an RDD of pairs ``(key, DataSet | MultiDataSet)`` each holding exactly ONE example (as in DL4J);
            batch bytes or a batch-file path work in place of the DataSet. Or a DataFrame (the route on Spark
            Connect) with ``key_col`` and the features and label columns, one example per row.
        include_regularization: as for `score_examples`.
        batch_size: examples merged per forward pass.
        key_col, columns, score_col: DataFrame input only.
    Returns:
        a lazy ``RDD[(key, float)]``, or for a DataFrame a lazy DataFrame ``key_col, score_col``.
    Raises:
        ConfigError: a non-DataFrame input on a Spark Connect session.
        DataError (when an action runs): a value with more or fewer than one example, naming its key; bad rows.
    """
    check_int("batch_size", batch_size, 1)
    if is_dataframe(data):
        if key_col not in data.columns:
            raise DataError(f"DataFrame has no key column {key_col!r}; it has {data.columns}. Pass key_col=")
        scored = score_examples(sc, network, data, include_regularization, batch_size, columns, score_col)
        return scored.select(key_col, score_col)
    require_classic(sc, f"score_examples_with_key on a {type(data).__name__}", KEYED_ROUTE + " and label_col=")
    sc = spark_context(sc)
    shipped = ship_network(sc, network)
    return data.mapPartitions(
        _score_keyed_partition(shipped, batch_size, include_regularization), preservesPartitioning=True
    )


def _sum_partition(shipped: Shipped, batch_size: int) -> Callable[[Iterable[Any]], Iterator[tuple[float, float]]]:
    def run(items: Iterable[Any]) -> Iterator[tuple[float, float]]:
        found = loss_sums(shipped, (load_batch_item(i) for i in items), batch_size)
        if found is not None:
            yield found

    return run


def _add(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def calculate_score(
    sc: Any,
    network: Network,
    data: Any,
    average: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    columns: Columns = DEFAULT_COLUMNS,
) -> float:
    """The loss over all of ``data``: the mean per example (``average=True``, as ``Network.score``) or the sum.

    Label-masked examples count as ``Network.score`` counts them (excluded from the mean). No regularization
    term is added (see `regularization_score`). ``data`` as for `score_examples`; a DataFrame (any
    session) and batch files on Spark Connect are summed by one ``mapInArrow`` job whose rows are the partitions'
    sums.

    Raises:
        ConfigError: an RDD or a list of batches on a Spark Connect session.
        DataError: empty data, missing DataFrame columns, or bad data on an executor.
    """
    check_int("batch_size", batch_size, 1)
    flags = classification_outputs(network)
    if is_dataframe(data) or is_connect_session(sc):
        session = data.sparkSession if is_dataframe(data) else sc
        frame = frame_data(session, data, columns, flags)
        shipped = ship_to_session(session, network)
        try:
            total, count = loss_sums_frame(shipped, frame, batch_size, "torchspark calculate_score")
        finally:
            shipped.release()
    else:
        sc = spark_context(sc)
        rdd = batch_items(sc, data, columns, flags)
        shipped = ship_network(sc, network)
        try:
            total, count = run_job(
                sc,
                "torchspark calculate_score",
                lambda: rdd.mapPartitions(_sum_partition(shipped, batch_size)).treeAggregate((0.0, 0.0), _add, _add),
                "torchspark-eval-job",
            )
        finally:
            shipped.release()
    if count == 0:
        raise DataError("calculate_score got no data: the RDD, DataFrame or path list holds no labelled examples")
    return total / count if average else total
