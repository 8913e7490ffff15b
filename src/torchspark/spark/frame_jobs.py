"""Evaluation and scoring over a `FrameData`: one ``mapInArrow`` job whose rows are
the results, merged on the client (Spark Connect and classic DataFrames).

1. each partition's Arrow batches become batches (`FrameData.to_batches`), re-batched to ``batch_size``;
2. a network copy leased from the executor process's cache (see `torchspark.spark.shipped`) fills fresh
   copies of the evaluations, or sums the losses;
3. the partition yields ONE small row: its example count and its evaluations as JSON (no pickle), or its loss sums;
4. the client merges the rows with [`merge`][torchspark.evaluation.BaseEvaluation.merge] (exact for counts, so the
   result equals a local pass over the same data) or adds the sums.

Per-example scores (`score_column`, `score_files`) are lazy DataFrames instead: every row keeps its
columns (its key) and gains its loss. The partition cores (`evaluate_batches`, `loss_sums`) are shared
with the classic RDD route.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from torchspark.data import Columns, DataSet, MultiDataSet, rebatch
from torchspark.errors import DataError
from torchspark.evaluation import evaluation_from_json
from torchspark.nn import Network
from torchspark.nn.outputs import fill_evaluations
from torchspark.spark.dataframes import training_frame
from torchspark.spark.frames import PATH_COLUMN, FrameData, collect_rows, dataframe_batches
from torchspark.spark.shipped import Shipped

__all__ = [
    "evaluate_batches",
    "merge_jsons",
    "loss_sums",
    "regularization_score",
    "evaluate_frame",
    "loss_sums_frame",
    "score_column",
    "score_files",
    "SCORE_FILES_SCHEMA",
]

log = logging.getLogger(__name__)

Batch = DataSet | MultiDataSet

#: the rows of `score_files`: each example of each file and its loss
SCORE_FILES_SCHEMA = f"{PATH_COLUMN} string, example long, score double"


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


# ------------------------------------------------------------------ partition cores (RDD and DataFrame routes)
def evaluate_batches(
    shipped: Shipped, batches: Iterator[Batch], templates: Sequence[str], batch_size: int, targets: Sequence[int]
) -> tuple[int, list[str]] | None:
    """Fill fresh copies of the ``templates`` (evaluations as JSON) on one partition's ``batches``; ``(examples,
    evaluations as JSON)``, or None for an empty partition (which then builds no network)."""
    first = next(batches, None)
    if first is None:
        return None
    evaluations = [evaluation_from_json(t) for t in templates]
    for ev in evaluations:
        ev.reset()
    examples = 0

    def counted() -> Iterator[Batch]:
        nonlocal examples
        for batch in rebatch(_chain(first, batches), batch_size):
            examples += len(batch)
            yield batch

    with shipped.lease() as net:
        fill_evaluations(net, counted(), evaluations, list(targets))
    return examples, [ev.to_json() for ev in evaluations]


def merge_jsons(a: list[str], b: list[str]) -> list[str]:
    """Two partitions' evaluations (JSON, in the same order) merged into one list."""
    return [evaluation_from_json(x).merge(evaluation_from_json(y)).to_json() for x, y in zip(a, b)]


def loss_sums(shipped: Shipped, batches: Iterator[Batch], batch_size: int) -> tuple[float, float] | None:
    """``(sum of per-example losses, unmasked examples)`` of one partition, as ``Network.score`` counts them;
    None for an empty partition."""
    first = next(batches, None)
    if first is None:
        return None
    total, count = 0.0, 0.0
    with shipped.lease() as net, torch.no_grad():
        net.module.eval()
        for batch in rebatch(_chain(first, batches), batch_size):
            per, weight = net.batch_losses(batch)
            total, count = total + float(per.sum()), count + float(weight.sum())
    return total, count


def _chain(first: Batch, rest: Iterator[Batch]) -> Iterator[Batch]:
    yield first
    yield from rest


# ------------------------------------------------------------------ DataFrame jobs
def evaluate_frame(
    shipped: Shipped,
    data: FrameData,
    templates: Sequence[str],
    batch_size: int,
    targets: Sequence[int],
    description: str,
) -> tuple[int, list[str] | None]:
    """Every partition's `evaluate_batches` as a row, merged on the client: ``(examples, evaluations as
    JSON)``, ``(0, None)`` when no partition held data."""
    rows = collect_rows(
        data,
        _evaluate_partition(shipped, data.to_batches, list(templates), batch_size, list(targets)),
        "examples long, evaluations string",
        description,
    )
    count, merged = 0, None
    for row in rows:
        jsons = json.loads(row["evaluations"])
        count += row["examples"]
        merged = jsons if merged is None else merge_jsons(merged, jsons)
    return count, merged


def _evaluate_partition(
    shipped: Shipped,
    to_batches: Callable[[Iterable[Any]], Iterator[Batch]],
    templates: list[str],
    batch_size: int,
    targets: list[int],
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    def run(record_batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        found = evaluate_batches(shipped, to_batches(record_batches), templates, batch_size, targets)
        if found is not None:
            yield pa.RecordBatch.from_pydict(
                {
                    "examples": pa.array([found[0]], pa.int64()),
                    "evaluations": pa.array([json.dumps(found[1])], pa.string()),
                }
            )

    return run


def loss_sums_frame(shipped: Shipped, data: FrameData, batch_size: int, description: str) -> tuple[float, float]:
    """Every partition's `loss_sums` as a row, added on the client: ``(total loss, unmasked examples)``."""
    rows = collect_rows(
        data, _sums_partition(shipped, data.to_batches, batch_size), "total double, weight double", description
    )
    return sum(r["total"] for r in rows), sum(r["weight"] for r in rows)


def _sums_partition(
    shipped: Shipped, to_batches: Callable[[Iterable[Any]], Iterator[Batch]], batch_size: int
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    def run(record_batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        found = loss_sums(shipped, to_batches(record_batches), batch_size)
        if found is not None:
            yield pa.RecordBatch.from_pydict(
                {"total": pa.array([found[0]], pa.float64()), "weight": pa.array([found[1]], pa.float64())}
            )

    return run


# ------------------------------------------------------------------ per-example scores as DataFrames
def score_column(
    shipped: Shipped,
    dataframe: Any,
    score_col: str,
    include_regularization: bool,
    batch_size: int,
    columns: Columns,
    integer_labels: Sequence[bool],
) -> Any:
    """``dataframe`` (every column kept) plus ``score_col``: each row's loss, from a batched Arrow UDF over its
    features and labels (lazy: bad rows raise when an action runs)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.functions import arrow_udf

    names = training_frame(dataframe, columns).columns  # checked here
    to_batches = dataframe_batches(columns, list(integer_labels))
    scores = arrow_udf(_score_rows(shipped, to_batches, batch_size, include_regularization), "double")
    # the features and labels (Vectors as arrays) as one struct argument: the UDF reads them by name
    schema = dataframe.schema
    packed = F.struct(
        *[
            (vector_to_array(F.col(c), "float32") if isinstance(schema[c].dataType, VectorUDT) else F.col(c)).alias(c)
            for c in names
        ]
    )
    return dataframe.withColumn(score_col, scores(packed))


def _score_rows(
    shipped: Shipped,
    to_batches: Callable[[Iterable[Any]], Iterator[Batch]],
    batch_size: int,
    include_regularization: bool,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def run(arrays: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        with shipped.lease() as net:
            reg = regularization_score(net) if include_regularization else 0.0
            for struct in arrays:
                record_batch = pa.RecordBatch.from_struct_array(struct)
                values: list[float] = []
                for batch in to_batches([record_batch]):
                    values += [v + reg for v in net.score_examples(batch, batch_size=batch_size).tolist()]
                yield pa.array(values, pa.float64())

    import pyarrow as pa

    # real objects, not strings: Spark reads these hints to pick the iterator-of-arrays UDF type
    run.__annotations__ = {"arrays": Iterator[pa.Array], "return": Iterator[pa.Array]}
    return run


def score_files(shipped: Shipped, data: FrameData, batch_size: int, include_regularization: bool) -> Any:
    """A lazy DataFrame ``path, example, score``: the loss of every example of every batch file of ``data``."""
    return data.frame.mapInArrow(
        _score_files_partition(shipped, batch_size, include_regularization, data), SCORE_FILES_SCHEMA
    )


def _score_files_partition(
    shipped: Shipped, batch_size: int, include_regularization: bool, data: FrameData
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    to_batches = data.to_batches

    def run(record_batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for rb in record_batches:
            for path in rb.column(PATH_COLUMN).to_pylist():
                one = pa.RecordBatch.from_pydict({PATH_COLUMN: [path]})
                with shipped.lease() as net:  # built once per process, on the first file
                    reg = regularization_score(net) if include_regularization else 0.0
                    scores = [
                        s + reg
                        for batch in to_batches([one])
                        for s in net.score_examples(batch, batch_size=batch_size).tolist()
                    ]
                if not scores:
                    raise DataError(f"the batch file {path} holds no examples")
                yield pa.RecordBatch.from_pydict(
                    {
                        PATH_COLUMN: [path] * len(scores),
                        "example": pa.array(range(len(scores)), pa.int64()),
                        "score": pa.array(scores, pa.float64()),
                    }
                )

    return run
