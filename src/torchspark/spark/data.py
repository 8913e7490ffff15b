"""Turning Spark data into the workers' minibatches: re-batching, counting, and the balanced repartition
(DataFrames become batches in `torchspark.spark.dataframes`, the export to batch files is in
`torchspark.spark.export`).

Balanced (``repartition_strategy="balanced"``): a cheap job counts the examples of every input partition
(`count_examples`), the driver plans every worker's minibatches with
`torchspark.training.assignment.plan_balanced` (only counts and the plan live on the driver), then

* ``export`` writes each partition as batch files cut on the plan's grid (``export_rdd`` with ``grid_heads``),
  independent of the worker count and seed so later fits reuse them, and hands every worker its minibatches as
  paths or file slices (`file_items`);
* ``direct`` cuts each partition into the plan's pieces on the executors, shuffles them to their workers and
  joins the few minibatches made of several pieces (`worker_rdd_balanced`).

Both give the same per-worker minibatch sequences. With ``repartition="never"`` (or matching partition and worker
counts) and with ``"spark_default"``, every partition is re-batched on its own instead (`rebatch_partition`);
an ``rng_seed`` then shuffles the order of each worker's minibatches (`shuffle_partitions`,
`group_paths`, `spread_round_robin`), the same way on every run.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from torchspark._io import read_safetensors_metadata
from torchspark.data import DataSet, MultiDataSet, dataset_from_bytes, dataset_to_bytes, rebatch, recut
from torchspark.data.batching import merge_batches
from torchspark.errors import ConfigError, DataError
from torchspark.training.assignment import BalancedPlan, EpochItems, FileSlices, plan_files, split_for_workers

__all__ = [
    "as_batch",
    "rebatch_partition",
    "count_examples",
    "worker_rdd_from_paths",
    "worker_rdd_balanced",
    "worker_rdd_balanced_epochs",
    "group_paths",
    "plan_path_files",
    "spread_round_robin",
    "shuffle_partitions",
    "seeded_order",
    "storage_level_by_name",
]

log = logging.getLogger(__name__)


def as_batch(item: Any) -> DataSet | MultiDataSet:
    """An RDD item as a batch: DataSets and MultiDataSets as they are, serialized batches decoded."""
    if isinstance(item, (DataSet, MultiDataSet)):
        return item
    if isinstance(item, (bytes, bytearray)):
        return dataset_from_bytes(bytes(item))
    raise DataError(f"the RDD holds a {type(item).__name__}; expected DataSet, MultiDataSet or batch bytes")


def rebatch_partition(batch_size: int) -> Callable[[Iterable[Any]], Iterator[bytes]]:
    """``mapPartitions`` function: re-batch a partition to exactly ``batch_size`` examples, serialized."""

    def fn(items: Iterable[Any]) -> Iterator[bytes]:
        for ds in rebatch((as_batch(i) for i in items), batch_size):
            yield dataset_to_bytes(ds)

    return fn


def count_examples(rdd: Any) -> list[int]:
    """Examples in every partition, in partition order: one cheap job (DataSets are only measured, serialized
    batches only have their header read) whose result, one int per partition, is all that reaches the driver."""
    return [int(c) for c in rdd.mapPartitions(_count_partition).collect()]


def _count_partition(items: Iterable[Any]) -> Iterator[int]:
    yield sum(_num_examples(item) for item in items)


def _num_examples(item: Any) -> int:
    if isinstance(item, (bytes, bytearray)):
        try:
            claimed = read_safetensors_metadata(bytes(item)).get("num_examples", "")
        except ValueError:
            claimed = ""
        if claimed.isdigit():
            return int(claimed)
    return len(as_batch(item))


# ------------------------------------------------------------------ assignment of minibatches to workers
def worker_rdd_from_paths(sc: Any, groups: Sequence[Sequence[Any]]) -> Any:
    """An RDD with one partition per worker holding that worker's items (batch-file paths or FileSlices), in
    order. Only the names travel; the workers read the files."""
    n = len(groups)
    return sc.parallelize(range(n), n).mapPartitionsWithIndex(lambda i, _: iter(groups[i]))


def group_paths(
    paths: Sequence[tuple[int, str]], num_workers: int, rng_seed: int | None, by_partition: bool
) -> list[list[str]]:
    """Split batch-file paths into per-worker lists, each file one minibatch: one input partition per worker
    (``by_partition``), or whole files balanced by count (`split_for_workers`).
    For files cut to the batch size already (the export route's)."""
    if by_partition:
        groups: list[list[str]] = [[] for _ in range(num_workers)]
        for part, path in paths:
            groups[part].append(path)
        if rng_seed is not None:  # each worker trains its own partition, in a seeded order
            groups = [[g[k] for k in seeded_order(len(g), rng_seed, part)] for part, g in enumerate(groups)]
        return groups
    return split_for_workers([p for _, p in paths], num_workers, rng_seed)


def seeded_order(length: int, rng_seed: int, stream: int) -> list[int]:
    """A permutation of ``range(length)`` fixed by ``(rng_seed, stream)`` (``stream``: the partition index), the
    same on every run and host."""
    return np.random.default_rng([rng_seed, stream]).permutation(length).tolist()


def shuffle_partitions(rdd: Any, rng_seed: int | None) -> Any:
    """``rdd`` with every partition's items in the order `seeded_order` gives (``rng_seed=None``: as is).
    A partition is held in memory while it is reordered (the workers keep theirs in memory anyway)."""
    if rng_seed is None:
        return rdd
    return rdd.mapPartitionsWithIndex(partial(_shuffle_partition, rng_seed))


def _shuffle_partition(rng_seed: int, index: int, items: Iterable[Any]) -> Iterator[Any]:
    held = list(items)
    return iter([held[k] for k in seeded_order(len(held), rng_seed, index)])


def plan_path_files(
    files: Sequence[tuple[int, str, int]],
    num_workers: int,
    batch_size: int,
    rng_seed: int | None,
    by_partition: bool,
    loader: Callable[[str], Any] | None = None,
    drop_last: bool = False,
) -> list[list[str | FileSlices]]:
    """``fit_paths``: the user's files ``(partition, path, examples)`` of any size re-batched to ``batch_size``
    (`plan_files`): over all files, balanced by examples; or with
    ``by_partition`` within each input partition, which stays one worker's data (in order; in a seeded order with
    ``rng_seed``)."""
    if not by_partition:
        return plan_files(
            [(path, count) for _, path, count in files], batch_size, num_workers, rng_seed, loader, drop_last
        )
    groups: list[list[str | FileSlices]] = []
    for w in range(num_workers):
        mine = [(path, count) for part, path, count in files if part == w]
        groups.append(plan_files(mine, batch_size, 1, None, loader, drop_last)[0] if sum(c for _, c in mine) else [])
    if rng_seed is not None:  # each worker trains its own partition, in a seeded order
        groups = [[g[k] for k in seeded_order(len(g), rng_seed, w)] for w, g in enumerate(groups)]
    return groups


def worker_rdd_balanced(rdd: Any, plan: BalancedPlan, storage_level: Any) -> Any:
    """The direct route's balanced repartition: one partition per worker holding its planned minibatches,
    serialized, in order.

    Steps: (1) every input partition is cut into the plan's pieces, each keyed ``(worker, position, begin)``;
    (2) a shuffle sends each piece to its worker's partition, sorted by key; (3) consecutive pieces of one
    minibatch (only those straddling an input-partition boundary) are joined.
    """
    plan_bc = rdd.context.broadcast(plan)
    out = (
        rdd.mapPartitionsWithIndex(partial(_cut_partition, plan_bc))  # (1)
        .repartitionAndSortWithinPartitions(plan.num_workers, partitionFunc=_worker_of)  # (2)
        .mapPartitions(_join_pieces)
    )  # (3)
    if storage_level is not None:
        out = out.persist(storage_level)
    return out


def _cut_partition(plan_bc: Any, index: int, items: Iterable[Any]) -> Iterator[tuple[tuple[int, int, int], bytes]]:
    plan: BalancedPlan = plan_bc.value
    rows = plan.partition_rows(index)
    lengths = (plan.stop[rows] - plan.start[rows]).tolist()
    # one more, unbounded piece catches examples the count did not see
    pieces = recut((as_batch(x) for x in items), itertools.chain(lengths, [np.iinfo(np.int64).max]))
    seen = 0
    for k, piece in enumerate(pieces):
        seen += len(piece)
        if k < len(rows):
            r = rows[k]
            yield (int(plan.worker[r]), int(plan.position[r]), int(plan.begin[r])), dataset_to_bytes(piece)
    counted = int(plan.sizes[index]) if plan.sizes is not None else sum(lengths)  # drop_last: more than planned
    if seen != counted:
        raise DataError(
            f"input partition {index} held {counted} examples when counted but {seen} now; the RDD "
            "must give the same data every time it is computed (persist it, or seed its sampling)"
        )


def _worker_of(key: tuple[int, int, int]) -> int:
    return key[0]


def _join_pieces(pairs: Iterable[tuple[tuple[int, int, int], bytes]]) -> Iterator[bytes]:
    for _, group in itertools.groupby(pairs, key=lambda pair: pair[0][:2]):  # (worker, position): one minibatch
        blobs = [blob for _, blob in group]
        if len(blobs) == 1:
            yield blobs[0]
        else:
            parts = [dataset_from_bytes(blob) for blob in blobs]
            yield dataset_to_bytes(merge_batches(parts))


def worker_rdd_balanced_epochs(rdd: Any, plans: Sequence[BalancedPlan], first_epoch: int) -> Any:
    """The direct route with a new plan every epoch (``rng_seed`` and several epochs): as
    `worker_rdd_balanced`, with every piece keyed ``(worker, epoch, position, begin)`` so each worker's
    partition streams its epochs in turn, one `EpochItems` per minibatch.

    Each input partition is held in memory while it is cut (once per epoch's plan). Not persisted: the epochs
    stay in Spark's shuffle files (on disk) and a worker reads each epoch's minibatches when it gets there.
    """
    plans_bc = rdd.context.broadcast(list(plans))
    return (
        rdd.mapPartitionsWithIndex(partial(_cut_partition_epochs, plans_bc, first_epoch))
        .repartitionAndSortWithinPartitions(plans[0].num_workers, partitionFunc=_worker_of)
        .mapPartitions(_join_epoch_pieces)
    )


def _cut_partition_epochs(
    plans_bc: Any, first_epoch: int, index: int, items: Iterable[Any]
) -> Iterator[tuple[tuple[int, int, int, int], bytes]]:
    held = [as_batch(x) for x in items]
    for e, plan in enumerate(plans_bc.value):
        for (worker, position, begin), blob in _cut_partition(_Value(plan), index, held):
            yield (worker, first_epoch + e, position, begin), blob


class _Value:
    """Stands in for a broadcast (``.value``) when the plan is already at hand."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _join_epoch_pieces(pairs: Iterable[tuple[tuple[int, int, int, int], bytes]]) -> Iterator[EpochItems]:
    for key, group in itertools.groupby(pairs, key=lambda pair: pair[0][:3]):  # (worker, epoch, position)
        blobs = [blob for _, blob in group]
        if len(blobs) > 1:
            parts = [dataset_from_bytes(blob) for blob in blobs]
            blobs = [dataset_to_bytes(merge_batches(parts))]
        yield EpochItems(key[1], (blobs[0],))


def storage_level_by_name(name: str) -> Any:
    """``pyspark.StorageLevel`` from its name (``"MEMORY_ONLY"``, ``"MEMORY_AND_DISK"``, ``"DISK_ONLY"`` ...)."""
    from pyspark import StorageLevel

    level = getattr(StorageLevel, name, None)
    if not isinstance(level, StorageLevel):
        raise ConfigError(f"unknown storage_level {name!r}; use a pyspark.StorageLevel name such as 'MEMORY_ONLY'")
    return level


def spread_round_robin(rdd: Any, num_partitions: int, rng_seed: int | None = None) -> Any:
    """``repartition_strategy="spark_default"``: deal every partition's items round-robin over ``num_partitions``
    partitions, one shuffle, no counting pass (what Scala's ``rdd.repartition`` does per item).

    PySpark's own ``repartition`` shuffles pickled *batches* of up to 10 items, so an RDD of a few dozen
    minibatches can land on one partition and leave a worker idle; keying each item by its turn avoids that.
    Partition ``p`` starts dealing at ``p % num_partitions``, so single-item partitions spread too.

    With ``rng_seed``, the deal starts ``rng_seed % num_partitions`` partitions further on and every target partition
    holds its items sorted by a seeded random key: a shuffled order, the same on every run (same data, same seed).
    """
    keyed = rdd.mapPartitionsWithIndex(_RoundRobinKeys(num_partitions, rng_seed))
    if rng_seed is None:
        return keyed.partitionBy(num_partitions, _own_key).values()
    return keyed.repartitionAndSortWithinPartitions(num_partitions, partitionFunc=_worker_of).values()


class _RoundRobinKeys:
    """``mapPartitionsWithIndex`` function: ``(target partition, item)`` pairs, dealt round-robin; with a seed the
    key is ``(target, random sort key, partition, position)``."""

    def __init__(self, num_partitions: int, rng_seed: int | None = None) -> None:
        self.num_partitions = num_partitions
        self.rng_seed = rng_seed

    def __call__(self, index: int, items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        if self.rng_seed is None:
            for i, item in enumerate(items):
                yield (index + i) % self.num_partitions, item
            return
        rng = np.random.default_rng([self.rng_seed, index])
        start = index + self.rng_seed
        for i, item in enumerate(items):
            yield ((start + i) % self.num_partitions, float(rng.random()), index, i), item


def _own_key(key: int) -> int:
    return key
