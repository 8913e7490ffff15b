"""A DataFrame's rows streamed into each worker's minibatches on a Spark Connect session: no RDD, nothing
collected on the client, no intermediate files.

The classic route's balanced split (`plan_balanced`), done with DataFrame
operations a Connect client has:

1. *survey* (one small query): the rows of every input partition, and the checks a worker would otherwise fail on
   mid-fit (null rows, nulls inside arrays, arrays of different lengths) -> [`DataError`][torchspark.errors.DataError]
   before training;
2. *plan* on the client, as the classic route and ``ParallelWrapper`` plan the same data: one plan for the fit, or
   with ``rng_seed`` over several epochs one plan per epoch (`plan_epochs`); the plan travels to the executors
   in the closure or as session artifacts (`torchspark.spark.connect.shipping`);
3. *tag* (`RowTagger`, a ``mapInArrow`` over the input partitions): every row gets its worker (as a
   partition key), epoch, minibatch position and global row number;
4. ``repartition(n, key)`` sends each worker's rows to partition ``rank`` (the key of worker ``w`` is a number
   Spark's hash partitioning maps to ``w``: `partition_keys`), ``sortWithinPartitions`` puts them in training
   order;
5. in the barrier task, `RowFeed` cuts the sorted rows into minibatches as they stream in (Arrow -> tensors
   with `arrow_to_batch`) and hands them to the worker loop.

Every worker then trains the minibatches the classic route and ``ParallelWrapper`` give it for the same data and
seed (row counts differ by at most one between workers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchspark.data import Columns
from torchspark.errors import DataError, SetupError
from torchspark.spark.connect.shipping import Shipment, ship_bytes
from torchspark.spark.dataframes import arrow_to_batch
from torchspark.training.assignment import (
    BalancedPlan,
    EpochItems,
    check_global_plan_size,
    epoch_seed,
    plan_balanced,
)
from torchspark.training.task import EpochSource
from torchspark.training.worker.loop import ItemSource

__all__ = [
    "ConnectWorkerData",
    "RowTagger",
    "RowFeed",
    "survey",
    "plan_epochs",
    "partition_keys",
    "frame_data",
    "TAG_COLUMNS",
]

#: the columns `RowTagger` adds: partition key, epoch, minibatch position, global row number
TAG_COLUMNS = ("_ts_key", "_ts_epoch", "_ts_pos", "_ts_row")

# one plan row per piece: epoch, partition, start, stop, worker, position, begin
_EPOCH, _PART, _START, _STOP, _WORKER, _POS, _BEGIN = range(7)


@dataclass(frozen=True)
class ConnectWorkerData:
    """The workers' data on a Connect session (the Connect runner's ``data``).

    Attributes:
        frame: a DataFrame whose partition ``w`` holds worker ``w``'s rows (``workers`` partitions), ready for a
            barrier ``mapInArrow``.
        workers: the number of workers.
        feed: ``feed(rank, record_batches) -> items`` in the task: the partition's Arrow batches as the worker's
            minibatch items (DataSets, or `EpochItems` for per-epoch plans).
        epoch_examples: examples one epoch trains (the progress bar's total), when known.
    """

    frame: Any
    workers: int
    feed: Callable[[int, Iterable[Any]], Iterable[Any]]
    epoch_examples: int | None = None

    def local_sources(self) -> list[EpochSource]:
        """Every worker's items read on the client (``InProcessRunner``; small data only: it collects)."""
        table = self.frame.toArrow()
        feed = self.feed
        sources = []
        for w in range(self.workers):
            rows = table.filter(_key_mask(table, feed, w)) if isinstance(feed, RowFeed) else table
            sources.append(ItemSource(feed(w, rows.sort_by([(c, "ascending") for c in TAG_COLUMNS[1:]]).to_batches())))
        return sources


def _key_mask(table: Any, feed: RowFeed, worker: int) -> Any:
    import pyarrow.compute as pc

    return pc.equal(table.column(TAG_COLUMNS[0]), feed.keys[worker])


# ------------------------------------------------------------------ 1. survey
class _Survey:
    """The survey's ``mapInArrow`` function: per input partition, its rows and, per column, null rows, nulls
    inside arrays and the shortest and longest array (JSON). Counted in a Python task, as the tagging is: Spark
    may evaluate a plain query over local data on the driver, in one partition."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import json

        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        rows = 0
        stats = {c: {"null": 0, "inner": 0, "min": None, "max": None} for c in self.columns}
        for rb in batches:
            rows += rb.num_rows
            for c in self.columns:
                col, seen = rb.column(c), stats[c]
                seen["null"] += col.null_count
                if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                    seen["inner"] += col.flatten().null_count
                    lengths = pc.list_value_length(col).drop_null()
                    if len(lengths):
                        low, high = int(pc.min(lengths).as_py()), int(pc.max(lengths).as_py())
                        seen["min"] = low if seen["min"] is None else min(seen["min"], low)
                        seen["max"] = high if seen["max"] is None else max(seen["max"], high)
                    seen["array"] = True
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([TaskContext.get().partitionId()], pa.int64()),
                pa.array([rows], pa.int64()),
                pa.array([json.dumps(stats)]),
            ],
            names=["p", "rows", "stats"],
        )


def survey(frame: Any, columns: Columns) -> list[int]:
    """Rows in each input partition of ``frame`` (in partition order), with the rows' checks, in one query.

    Raises:
        DataError: null rows, nulls inside arrays, arrays of different lengths in a column, or no rows at all.
    """
    import json

    cols = columns.names
    rows = frame.select(*cols).mapInArrow(_Survey(cols), "p long, rows long, stats string").collect()
    _check_rows([json.loads(r["stats"]) for r in rows], cols)
    sizes = [0] * (max((int(r["p"]) for r in rows), default=-1) + 1)
    for r in rows:
        sizes[int(r["p"])] += int(r["rows"])
    if sum(sizes) == 0:
        raise DataError("the training data is empty: the DataFrame has no rows")
    return sizes


def _check_rows(partitions: Sequence[dict[str, Any]], cols: Sequence[str]) -> None:
    for c in cols:
        seen = [p[c] for p in partitions]
        nulls = sum(s["null"] for s in seen)
        if any(s.get("array") for s in seen):
            if nulls:
                raise DataError(
                    f"column {c!r} has {nulls} null row(s) (the whole array is null); drop them first: "
                    f"df.dropna(subset=[{c!r}])"
                )
            if sum(s["inner"] for s in seen):
                raise DataError(f"column {c!r} has null values inside its arrays; fill or drop them first")
            lengths = [s[k] for s in seen for k in ("min", "max") if s[k] is not None]
            if lengths and min(lengths) != max(lengths):
                raise DataError(
                    f"column {c!r} has arrays of different lengths ({min(lengths)} to {max(lengths)} "
                    "values); every row needs the same length: fix or drop the odd rows"
                )
        elif nulls:
            raise DataError(f"column {c!r} has {nulls} null values; fill or drop them first")


# ------------------------------------------------------------------ 2. plan
def plan_epochs(
    sizes: Sequence[int],
    batch_size: int,
    num_workers: int,
    rng_seed: int | None,
    epochs: int,
    first_epoch: int,
    drop_last: bool = False,
    scope: str = "worker",
) -> list[BalancedPlan]:
    """The fit's plans as the classic direct route and ``ParallelWrapper`` make them: one plan (seeded by
    ``rng_seed``) trained every epoch (each worker reorders its share every epoch), or, with ``scope="global"`` and
    ``rng_seed`` past the network's first epoch or over several, one plan per epoch seeded by
    `epoch_seed`."""
    if rng_seed is None or scope == "worker" or (epochs == 1 and first_epoch == 0):
        return [plan_balanced(sizes, batch_size, num_workers, rng_seed, drop_last)]
    first = plan_balanced(sizes, batch_size, num_workers, epoch_seed(rng_seed, first_epoch), drop_last)
    check_global_plan_size(len(first.worker), epochs)
    return [first] + [
        plan_balanced(sizes, batch_size, num_workers, epoch_seed(rng_seed, first_epoch + e), drop_last)
        for e in range(1, epochs)
    ]


def _plan_table(plans: Sequence[BalancedPlan], first_epoch: int) -> np.ndarray:
    """Every plan's pieces as one int64 table (one row per piece: the ``_EPOCH`` ... ``_BEGIN`` columns)."""
    tables = [
        np.stack(
            [np.full(len(p.worker), first_epoch + e), p.partition, p.start, p.stop, p.worker, p.position, p.begin],
            axis=1,
        )
        for e, p in enumerate(plans)
    ]
    return np.ascontiguousarray(np.concatenate(tables).astype(np.int64))


def partition_keys(spark: Any, n: int) -> list[int]:
    """For each worker ``w``, a number that Spark's hash partitioning into ``n`` partitions sends to partition ``w``
    (``pmod(hash(key), n) == w``, the expression ``repartition(n, col)`` uses), found with one tiny query.

    Raises:
        SetupError: no such number among the first ``64 n`` (never seen; the task would check it anyway).
    """
    from pyspark.sql import functions as F

    rows = (
        spark.range(0, 64 * n)
        .select("id", F.expr(f"pmod(hash(id), {n})").alias("p"))
        .groupBy("p")
        .agg(F.min("id").alias("k"))
        .collect()
    )
    found = {int(r["p"]): int(r["k"]) for r in rows}
    if sorted(found) != list(range(n)):
        raise SetupError(f"found partition keys for partitions {sorted(found)} only of {n}")
    return [found[w] for w in range(n)]


# ------------------------------------------------------------------ 3. tag (task side)
class RowTagger:
    """The ``mapInArrow`` function of step 3: each input partition's rows with their worker key, epoch, minibatch
    position and global row number (a row goes out once per epoch plan; rows ``drop_last`` drops not at all).

    Raises (in the task):
        DataError: the partition holds another number of rows than the survey counted (the DataFrame must give
            the same rows every time it is computed).
    """

    def __init__(self, plan: Shipment, sizes: Sequence[int], keys: Sequence[int]) -> None:
        self.plan = plan
        self.sizes = tuple(int(s) for s in sizes)
        self.keys = np.asarray(keys, dtype=np.int64)

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        partition = TaskContext.get().partitionId()
        table = np.frombuffer(self.plan.read(), dtype=np.int64).reshape(-1, 7)
        mine = table[table[:, _PART] == partition]
        epochs = [mine[mine[:, _EPOCH] == e] for e in np.unique(mine[:, _EPOCH])]
        epochs = [p[np.argsort(p[:, _START], kind="stable")] for p in epochs]
        seen = 0
        for rb in batches:
            local = seen + np.arange(rb.num_rows, dtype=np.int64)
            seen += rb.num_rows
            for pieces in epochs:
                at = np.searchsorted(pieces[:, _START], local, side="right") - 1
                keep = (at >= 0) & (local < pieces[np.maximum(at, 0), _STOP])
                if not keep.any():
                    continue
                rows, piece = local[keep], pieces[at[keep]]
                extra = [
                    self.keys[piece[:, _WORKER]],
                    piece[:, _EPOCH],
                    piece[:, _POS],
                    piece[:, _BEGIN] + rows - piece[:, _START],
                ]
                kept = rb.filter(pa.array(keep))
                yield pa.RecordBatch.from_arrays(
                    [*kept.columns, *(pa.array(x, pa.int64()) for x in extra)], names=[*rb.schema.names, *TAG_COLUMNS]
                )
        counted = self.sizes[partition] if partition < len(self.sizes) else 0
        if seen != counted:
            raise DataError(
                f"input partition {partition} held {counted} rows when counted but {seen} now; the "
                "DataFrame must give the same rows every time it is computed (cache it, or seed its "
                "sampling)"
            )


# ------------------------------------------------------------------ 5. feed (task side)
class RowFeed:
    """Step 5: a worker partition's rows, sorted by (epoch, position, row), cut into its minibatches as they stream
    in; ``planned``: one `EpochItems` per minibatch (per-epoch plans).

    Raises (in the task):
        SetupError: a row of another worker reached this partition (Spark's hash partitioning changed).
        DataError: what `arrow_to_batch` refuses.
    """

    def __init__(
        self,
        columns: Columns,
        integer_labels: Any,
        keys: Sequence[int],
        planned: bool,
    ) -> None:
        self.to_batch = arrow_to_batch(columns, integer_labels)
        self.columns = [*columns.feature_names, *columns.label_names]
        self.keys = tuple(int(k) for k in keys)
        self.planned = planned

    def __call__(self, rank: int, batches: Iterable[Any]) -> Iterator[Any]:
        pending: list[Any] = []
        current: tuple[int, int] | None = None
        for rb in batches:
            if rb.num_rows == 0:
                continue
            self._check_keys(rank, rb)
            epoch = rb.column(TAG_COLUMNS[1]).to_numpy()
            pos = rb.column(TAG_COLUMNS[2]).to_numpy()
            cuts = np.flatnonzero((epoch[1:] != epoch[:-1]) | (pos[1:] != pos[:-1])) + 1
            for s, e in zip([0, *cuts], [*cuts, rb.num_rows]):
                group = (int(epoch[s]), int(pos[s]))
                if current is not None and group != current:
                    yield self._item(current, pending)
                    pending = []
                current = group
                pending.append(rb.slice(s, e - s))
        if current is not None:
            yield self._item(current, pending)

    def _check_keys(self, rank: int, rb: Any) -> None:
        keys = rb.column(TAG_COLUMNS[0]).to_numpy()
        if (keys != self.keys[rank]).any():
            raise SetupError(
                f"worker {rank}'s partition received rows keyed for another worker ({int(keys[0])}, "
                f"expected {self.keys[rank]}): Spark's hash partitioning did not place them as planned"
            )

    def _item(self, group: tuple[int, int], pieces: list[Any]) -> Any:
        import pyarrow as pa

        rows = pa.Table.from_batches(pieces).select(self.columns)
        batch = self.to_batch(rows)
        return EpochItems(group[0], (batch,)) if self.planned else batch


# ------------------------------------------------------------------ 1-4 on the client
def frame_data(
    spark: Any,
    frame: Any,
    *,
    columns: Columns,
    integer_labels: Any,
    batch_size: int,
    num_workers: int,
    rng_seed: int | None,
    epochs: int,
    first_epoch: int,
    drop_last: bool = False,
    shuffle_scope: str = "worker",
) -> ConnectWorkerData:
    """Steps 1-4 for ``frame`` (the checked columns, `training_frame`): the
    workers' data, one partition per worker in training order, and the task side's feed.

    Raises:
        DataError: what `survey` finds.
    """
    from pyspark.sql.types import LongType, StructField, StructType

    sizes = survey(frame, columns)
    plans = plan_epochs(sizes, batch_size, num_workers, rng_seed, epochs, first_epoch, drop_last, shuffle_scope)
    keys = partition_keys(spark, num_workers)
    tagger = RowTagger(ship_bytes(spark, _plan_table(plans, first_epoch).tobytes(), "plan"), sizes, keys)
    schema = StructType([*frame.schema.fields, *(StructField(c, LongType(), False) for c in TAG_COLUMNS)])
    tagged = (
        frame.mapInArrow(tagger, schema).repartition(num_workers, TAG_COLUMNS[0]).sortWithinPartitions(*TAG_COLUMNS[1:])
    )
    feed = RowFeed(columns, integer_labels, keys, planned=len(plans) > 1)
    return ConnectWorkerData(tagged, num_workers, feed, sum(plans[0].examples_per_worker()))
