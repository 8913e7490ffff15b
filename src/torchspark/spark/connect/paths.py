"""``SparkNetwork.fit_paths`` on a Spark Connect session: batch files on a shared path, each worker reading its own
files directly (no RDD, no broadcast, nothing of the data through the client).

1. the client resolves the paths (a directory, a glob, one file or a list; any fsspec URL) and counts the examples
   of every file: batch files from their headers on the client; with a ``loader``, by running it on the executors
   (one ``mapInArrow`` over a small DataFrame of the paths);
2. the client plans every worker's minibatches exactly as the classic ``fit_paths`` does
   (`plan_path_files`, a new seeded order every epoch with ``rng_seed``): file names
   and example ranges only;
3. the plan travels inside the training task's closure; the barrier stage runs over ``spark.range(n)`` in ``n``
   partitions (one row each: partition ``w`` is worker ``w``), and each worker reads the files of its plan.

The same files, master and seed give the parameters of the classic ``fit_paths`` and of ``ParallelWrapper``.
The client and every executor must reach the files (HDFS, S3, a shared mount).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torchspark.data import batch_num_examples, resolve_paths
from torchspark.data.loaders import check_same_shapes, example_shapes
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network
from torchspark.spark.connect.feeding import ConnectWorkerData
from torchspark.spark.connect.fit import check_connect_master, connect_num_workers
from torchspark.spark.connect.jobs import run_tagged
from torchspark.spark.data import plan_path_files
from torchspark.training.assignment import load_with, per_epoch
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.adapter import check_first_batch
from torchspark.training.hooks import NullRecorder, PhaseRecorder
from torchspark.training.worker.loop import load_item

__all__ = ["PathFeed", "connect_path_data", "count_files"]

_COUNT_SCHEMA = "path string, examples long, shapes string"


@dataclass(frozen=True)
class PathFeed:
    """The ``feed`` of a ``fit_paths`` stage: worker ``rank``'s planned items (batch-file paths, file slices, or
    one `EpochItems` per epoch); the partition's one placeholder row is
    read and dropped."""

    groups: Sequence[Sequence[Any]]

    def __call__(self, rank: int, batches: Iterable[Any]) -> Iterable[Any]:
        for _ in batches:  # the partition's single row: read to the end so the Python worker can be reused
            pass
        return list(self.groups[rank])


def _count_partition(loader: Callable[[str], Any], batches: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa

    for batch in batches:
        paths = [str(p) for p in batch.column(0).to_pylist()]
        loaded = [load_with(loader, p) for p in paths]
        counts, shapes = [len(b) for b in loaded], [example_shapes(b) for b in loaded]
        yield pa.RecordBatch.from_pydict({"path": paths, "examples": counts, "shapes": shapes})


def count_files(
    spark: Any, paths: Sequence[str], loader: Callable[[str], Any] | None, parallelism: int
) -> list[tuple[int, str, int]]:
    """``(0, path, examples)`` of every file, in the given order: from the batch-file headers on the client, or
    with a ``loader`` by running it on the executors (in ``parallelism`` tasks at most).

    Raises:
        DataError: a file that is not a batch file, or a loader that fails, returns something else, or returns
            another per-example shape for some file than for the first.
    """
    if loader is None:
        return [(0, p, batch_num_examples(p)) for p in paths]
    frame = spark.createDataFrame([(p,) for p in paths], "path string").repartition(
        max(1, min(len(paths), parallelism))
    )
    table = run_tagged(
        spark,
        "torchspark: count the examples of every file",
        lambda: frame.mapInArrow(lambda it: _count_partition(loader, it), _COUNT_SCHEMA).toArrow(),
    )
    counted = dict(zip(table.column("path").to_pylist(), table.column("examples").to_pylist()))
    shapes = dict(zip(table.column("path").to_pylist(), table.column("shapes").to_pylist()))
    check_same_shapes(loader, [(p, shapes[p]) for p in paths])  # a file of another shape fails here, named
    return [(0, p, int(counted[p])) for p in paths]


def connect_path_data(
    spark: Any,
    network: Network,
    paths: Any,
    loader: Callable[[str], Any] | None,
    master: TrainingMaster,
    epochs: int,
    recorder: PhaseRecorder | None = None,
) -> ConnectWorkerData:
    """The workers' data of ``fit_paths`` on a Connect session (steps 1-3 of the module docstring).

    Raises:
        ConfigError: what `check_connect_master` refuses, or paths given as
            an RDD or DataFrame (give a path, a glob or a list of paths).
        DataError: no files, a location that does not exist, a file that is not a batch file (without
            ``loader``), or files without examples.
    """
    recorder = NullRecorder() if recorder is None else recorder
    check_connect_master(master)
    if not isinstance(paths, (str, os.PathLike, list, tuple)):
        raise ConfigError(
            f"fit_paths on a Spark Connect session takes a directory, a glob, one file or a list of "
            f"paths (the client resolves them), got a {type(paths).__name__}; collect the paths "
            "into a list"
        )
    n = connect_num_workers(spark, master)
    with recorder.phase("count"):
        indexed = count_files(spark, resolve_paths(paths, any_file=loader is not None), loader, n)
    if not indexed:
        raise DataError("fit_paths got no paths: the list of files is empty")
    bsz = master.batch_size_per_worker
    groups = per_epoch(
        lambda s: plan_path_files(indexed, n, bsz, s, False, loader, master.drop_last),
        n,
        master.rng_seed,
        network.epoch,
        epochs,
        master.shuffle_scope,
    )
    first = next((g[0] for g in groups if g), None)
    if first is not None and loader is None:  # a wrong shape fails here, before any worker starts
        check_first_batch(network, load_item(first))
    examples = None if master.drop_last else sum(count for _, _, count in indexed)
    return ConnectWorkerData(spark.range(0, n, 1, n), n, PathFeed(groups), examples)
