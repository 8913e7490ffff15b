"""A fit's data on Spark, prepared for the workers: one partition per worker holding that worker's minibatches in
order, on the route the master picks, and what the routes keep between fits.

The routes (`DataPreparation`):

* ``rdd_training_approach="export"`` (`from_rdd`): the RDD is written once as batch files
  (on the balanced plan's grid, or each partition on its own), kept for later fits of the same RDD, and only the
  files' names (or slices of them) travel to the workers;
* ``"direct"``: the RDD is re-batched and repartitioned to the workers, persisted and reused by later fits of the
  same RDD with the same settings (only the latest data stays persisted);
* ``"direct"`` with ``rng_seed`` over several epochs: a new seeded plan every epoch (not kept: the plans depend on
  the network's epoch counter);
* batch files or a loader's files (`from_paths`, ``fit_paths``): counted (headers, or the
  loader on the executors), planned on the driver, read by the workers.

Exports without ``export_directory`` go to a private directory of this object (`torchspark.spark.private_dirs`);
`delete_temp_files` removes the exports and unpersists the kept RDDs, and the private
directory also goes when the object is garbage-collected and at interpreter exit.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from torchspark._io import filesystem, join
from torchspark.data import batch_num_examples, resolve_paths
from torchspark.data.loaders import check_same_shapes, example_shapes
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network
from torchspark.spark.data import (
    count_examples,
    group_paths,
    plan_path_files,
    rebatch_partition,
    shuffle_partitions,
    spread_round_robin,
    storage_level_by_name,
    worker_rdd_balanced,
    worker_rdd_balanced_epochs,
    worker_rdd_from_paths,
)
from torchspark.spark.export import (
    check_export_directory,
    export_base,
    export_name,
    export_rdd,
    mark_export,
    remove_dead_exports,
)
from torchspark.spark.jobs import run_job
from torchspark.spark.private_dirs import make_private_dir, remove_dirs
from torchspark.training.assignment import (
    check_global_plan_size,
    epoch_seed,
    file_items,
    grid_heads,
    load_with,
    per_epoch,
    plan_balanced,
)
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.hooks import NullRecorder, PhaseRecorder

__all__ = ["DataPreparation", "Export", "keep_partitions", "planned_epochs", "first_item", "sample_key"]


@dataclass(frozen=True)
class Export:
    """Batch files written for one RDD: where, ``(partition, path, examples)`` in data order, and the partitions'
    example counts (only for exports cut on the balanced plan's grid)."""

    directory: str
    files: list[tuple[int, str, int]]
    sizes: list[int] | None


def keep_partitions(master: TrainingMaster, partitions: int, n: int) -> bool:
    """Whether each of the ``n`` workers trains one input partition as it is (``repartition="never"``, or
    ``"num_partitions_workers_differs"`` with as many partitions as workers).

    Raises:
        ConfigError: ``repartition="never"`` with a partition count other than ``n``.
    """
    if master.repartition == "never":
        if partitions != n:
            raise ConfigError(
                f"repartition='never' trains one input partition per worker, but the data has {partitions} "
                f"partitions and num_workers={n}; repartition the data to {n} partitions, set num_workers, "
                "or use repartition='always'"
            )
        return True
    return master.repartition == "num_partitions_workers_differs" and partitions == n


def planned_epochs(master: TrainingMaster, epochs: int) -> int | None:
    """Epochs the driver plans across workers at once: all of them, except on the rounds route (None: one Spark
    job per round reads each worker partition as it is, so the fit's epochs share one plan)."""
    return None if master.spark_rounds else epochs


class DataPreparation:
    """Turns a fit's data into the worker RDD on the master's route, and owns what the routes keep between fits.

    Args:
        sc: the SparkContext.
        network: the network being trained (its epoch counter seeds the per-epoch plans).

    Attributes:
        epoch_examples: examples one epoch trains, when the last preparation knew it (the progress bar's total).
        exports: the batch files written per ``(rdd id, batch size, on the balanced grid)``.
        frames: the batch RDD made of each DataFrame (`frame_batches`), by the DataFrame and its columns.
        persisted: the direct route's persisted worker RDD, by its settings.
        private_dirs: this object's private export directory (at most one), removed with it.

    Example: ``prep.from_rdd(rdd, master, 4, prep.export_base(master))`` -> an RDD with 4 partitions.
    """

    def __init__(self, sc: Any, network: Network) -> None:
        self.sc = sc
        self.network = network
        self.epoch_examples: int | None = None
        self.exports: dict[tuple[int, int, bool], Export] = {}
        self.persisted: dict[tuple[Any, ...], Any] = {}
        self.frames: dict[tuple[Any, ...], tuple[weakref.ref[Any], Any]] = {}
        # the finalizer holds the list, not self, so garbage collection and interpreter exit remove the directories
        self.private_dirs: list[str] = []
        self._finalizer = weakref.finalize(self, remove_dirs, self.private_dirs)

    def export_base(self, master: TrainingMaster) -> str:
        """Where exports go: ``export_directory``, else a local directory of the driver (refused on a cluster)."""
        local_dir = self.sc.getConf().get("spark.local.dir", None)
        return export_base(master.export_directory, self.sc.master, local_dir, tempfile.gettempdir())

    def delete_temp_files(self) -> None:
        """Remove the exported batch files and the private directory, and unpersist the kept RDDs."""
        for prepared in self.persisted.values():
            prepared.unpersist()
        self.persisted.clear()
        for export in self.exports.values():
            fs, path = filesystem(export.directory)
            if fs.exists(path):
                fs.rm(path, recursive=True)
        self.exports.clear()
        self.frames.clear()
        remove_dirs(self.private_dirs)

    def frame_batches(self, data: Any, columns: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """The batch RDD of DataFrame ``data`` read with ``columns``: ``build()`` the first time, the same RDD for
        later fits of the same DataFrame object with the same columns.

        The export and direct routes key their batch files and persisted partitions by the RDD's id, so a new RDD
        per ``fit(df)`` re-exported the whole frame at every call (seconds per call at 32k x 784); with the RDD
        kept, ``fit(df, epochs=1)`` in a loop reuses the first call's export, as ``fit(rdd)`` does. Like an RDD, a
        DataFrame is taken as the data it was when first trained on: a new DataFrame object (``spark.read`` again)
        is new data.
        """
        key = (id(data), *columns)
        held = self.frames.get(key)
        if held is not None and held[0]() is data:
            return held[1]
        rdd = build()
        # forget the RDDs of DataFrames that are gone (a loop over new DataFrames must not keep every lineage)
        self.frames = {k: v for k, v in self.frames.items() if v[0]() is not None}
        self.frames[key] = (weakref.ref(data), rdd)
        return rdd

    # ------------------------------------------------------------------ RDDs and DataFrames
    def from_rdd(
        self,
        rdd: Any,
        master: TrainingMaster,
        n: int,
        base: str | None,
        epochs: int | None = None,
        recorder: PhaseRecorder | None = None,
    ) -> Any:
        """An RDD with one partition per worker holding that worker's minibatches (paths, FileSlices or bytes), in
        order, for ``epochs`` epochs planned at once (None: one plan for every epoch).

        Args:
            rdd: the training batches (an RDD of DataSets or serialized batches).
            base: `export_base` for the export route (taken before any job), else None.
            recorder: times the driver's ``count``, ``export`` and ``repartition`` phases.
        Raises:
            ConfigError: ``drop_last`` without the balanced split; DataError: an empty RDD.
        """
        recorder = NullRecorder() if recorder is None else recorder
        self.epoch_examples = None
        keep = keep_partitions(master, rdd.getNumPartitions(), n)
        balanced = not keep and master.repartition_strategy == "balanced"
        if master.drop_last and not balanced:
            raise ConfigError(
                f"drop_last=True needs the balanced split, but the data's {n} partitions are kept as "
                "they are (repartition='num_partitions_workers_differs'); set repartition='always' "
                "or drop_last=False"
            )
        if master.rdd_training_approach == "export":
            assert base is not None
            return self._from_export(rdd, master, n, base, keep, balanced, epochs, recorder)
        if (
            balanced
            and master.rng_seed is not None
            and master.shuffle_scope == "global"
            and epochs is not None
            and (epochs > 1 or self.network.epoch)
        ):
            return self._direct_epochs(rdd, master, n, epochs, recorder)
        return self._direct(rdd, master, n, keep, balanced, recorder)

    def _export(self, rdd: Any, master: TrainingMaster, base: str, on_grid: bool, recorder: PhaseRecorder) -> Export:
        """Batch files of ``rdd`` (written once, reused by later fits): on the balanced plan's global grid when
        ``on_grid`` (any worker count and seed reuses them), else every partition on its own grid."""
        bsz = master.batch_size_per_worker
        key = (rdd.id(), bsz, on_grid)
        if key not in self.exports:
            directory = self._export_directory(master, base, rdd.id())
            try:
                sizes = heads = None
                if on_grid:
                    with recorder.phase("count"):
                        sizes = _count(self.sc, rdd)
                    heads = grid_heads(sizes, bsz)
                with recorder.phase("export"):
                    files = run_job(
                        self.sc,
                        f"torchspark: export the training data to {directory}",
                        lambda: export_rdd(rdd, directory, bsz, heads),
                    )
            except BaseException:  # bad data or Ctrl-C: leave no half-written export behind
                fs, path = filesystem(directory)
                if fs.exists(path):
                    fs.rm(path, recursive=True)
                raise
            self.exports[key] = Export(directory, files, sizes)
        return self.exports[key]

    def _export_directory(self, master: TrainingMaster, base: str, rdd_id: int) -> str:
        """A new directory for one export: under ``export_directory`` as it is, else inside this object's private
        directory (created on first use, 0700)."""
        name = export_name(rdd_id)
        if master.export_directory:
            remove_dead_exports(base)  # what killed drivers of this host left there
            directory = join(base, name)
            check_export_directory(directory)
            mark_export(directory)
            return directory
        if not self.private_dirs:
            self.private_dirs.append(make_private_dir(base))
        directory = join(self.private_dirs[0], name)
        os.mkdir(directory, 0o700)
        return directory

    def _from_export(
        self,
        rdd: Any,
        master: TrainingMaster,
        n: int,
        base: str,
        keep: bool,
        balanced: bool,
        epochs: int | None,
        recorder: PhaseRecorder,
    ) -> Any:
        export = self._export(rdd, master, base, balanced, recorder)
        if not export.files:
            raise DataError("the training data is empty: the RDD holds no examples")
        if balanced:  # every epoch in its own seeded order across workers (only names travel)
            sizes, bsz = export.sizes, master.batch_size_per_worker
            assert sizes is not None
            self.epoch_examples = sum(plan_balanced(sizes, bsz, n, None, master.drop_last).examples_per_worker())
            groups = per_epoch(
                lambda s: file_items(plan_balanced(sizes, bsz, n, s, master.drop_last), export.files),
                n,
                master.rng_seed,
                self.network.epoch,
                epochs,
                master.shuffle_scope,
            )
            return worker_rdd_from_paths(self.sc, groups)
        paths = [(part, path) for part, path, _ in export.files]
        self.epoch_examples = sum(count for _, _, count in export.files)
        if not keep:  # spark_default
            return spread_round_robin(self.sc.parallelize([p for _, p in paths]), n, master.rng_seed)
        return worker_rdd_from_paths(self.sc, group_paths(paths, n, master.rng_seed, by_partition=True))

    def _direct_epochs(self, rdd: Any, master: TrainingMaster, n: int, epochs: int, recorder: PhaseRecorder) -> Any:
        """The direct route with a new seeded plan across workers every epoch (not kept for later fits: the plans
        depend on the network's epoch counter)."""
        seed, bsz, first = master.rng_seed, master.batch_size_per_worker, self.network.epoch
        assert seed is not None
        with recorder.phase("count"):
            sizes = _count(self.sc, rdd)
        head = plan_balanced(sizes, bsz, n, epoch_seed(seed, first), master.drop_last)
        check_global_plan_size(len(head.worker), epochs)
        plans = [head] + [
            plan_balanced(sizes, bsz, n, epoch_seed(seed, first + e), master.drop_last) for e in range(1, epochs)
        ]
        self.epoch_examples = sum(plans[0].examples_per_worker())
        with recorder.phase("repartition"):
            return worker_rdd_balanced_epochs(rdd, plans, first)

    def _direct(
        self, rdd: Any, master: TrainingMaster, n: int, keep: bool, balanced: bool, recorder: PhaseRecorder
    ) -> Any:
        bsz = master.batch_size_per_worker
        level = storage_level_by_name(master.storage_level)
        # later fits of the same RDD reuse the persisted, repartitioned minibatches (no count, no shuffle); only the
        # latest data stays persisted
        cache_key = (
            rdd.id(),
            bsz,
            n,
            keep,
            master.repartition_strategy,
            master.rng_seed,
            master.storage_level,
            master.drop_last,
        )
        cached = self.persisted.get(cache_key)
        if cached is not None:
            return cached
        for old in self.persisted.values():
            old.unpersist()
        self.persisted.clear()
        if balanced:
            with recorder.phase("count"):
                sizes = _count(self.sc, rdd)
            plan = plan_balanced(sizes, bsz, n, master.rng_seed, master.drop_last)
            self.epoch_examples = sum(plan.examples_per_worker())
            with recorder.phase("repartition"):
                prepared = worker_rdd_balanced(rdd, plan, level)
        else:
            batches = rdd.mapPartitions(rebatch_partition(bsz))
            prepared = (
                shuffle_partitions(batches, master.rng_seed)
                if keep
                else spread_round_robin(batches, n, master.rng_seed)
            ).persist(level)
        self.persisted[cache_key] = prepared
        return prepared

    # ------------------------------------------------------------------ files
    def from_paths(
        self, paths: Any, loader: Callable[[str], Any] | None, master: TrainingMaster, n: int, epochs: int
    ) -> Any:
        """The worker RDD of ``fit_paths``: batch files (or a ``loader``'s files) counted, re-batched to
        ``batch_size_per_worker`` and balanced by examples over the ``n`` workers (with ``repartition="never"``:
        within each input partition), a new seeded order every epoch with ``rng_seed``.

        Raises:
            DataError: no paths, or what [`resolve_paths`][torchspark.data.resolve_paths] and the loader refuse.
        """
        from pyspark import RDD

        if isinstance(paths, RDD):  # the executors read the headers (or run the loader)
            partitions = paths.getNumPartitions()
            indexed = self._count_files(paths, loader)
        else:
            resolved = resolve_paths(paths, any_file=loader is not None)
            partitions = 1
            if loader is None:  # headers are cheap to read here
                indexed = [(0, p, batch_num_examples(p)) for p in resolved]
            else:  # the loader runs on the executors; the list stays one input partition
                spread = self.sc.parallelize(resolved, max(1, min(len(resolved), self.sc.defaultParallelism)))
                indexed = [(0, p, c) for _, p, c in self._count_files(spread, loader)]
        if not indexed:
            raise DataError("fit_paths got no paths: the list or RDD of files is empty")
        by_partition = keep_partitions(master, partitions, n)
        bsz, seed = master.batch_size_per_worker, master.rng_seed
        groups = per_epoch(
            lambda s: plan_path_files(indexed, n, bsz, s, by_partition, loader, master.drop_last),
            n,
            seed,
            self.network.epoch,
            planned_epochs(master, epochs) if not by_partition else None,
            master.shuffle_scope,
        )
        self.epoch_examples = None if master.drop_last else sum(count for _, _, count in indexed)
        return worker_rdd_from_paths(self.sc, groups)

    def _count_files(self, paths: Any, loader: Callable[[str], Any] | None) -> list[tuple[int, str, int]]:
        rows = run_job(
            self.sc,
            "torchspark: count the examples of every file",
            paths.mapPartitionsWithIndex(partial(_count_files, loader)).collect,
        )
        if loader is not None:  # a file of another shape fails here, naming the loader and the file
            check_same_shapes(loader, [(path, shapes) for _, path, _, shapes in rows])
        return [(index, path, count) for index, path, count, _ in rows]


def _count(sc: Any, rdd: Any) -> list[int]:
    """`count_examples` as a job whose bad data (a wrong ``feature_shape``, a non-DataSet item) raises
    [`DataError`][torchspark.errors.DataError] on the driver."""
    return run_job(sc, "torchspark: count the training examples", lambda: count_examples(rdd))


def _count_files(loader: Callable[[str], Any] | None, index: int, paths: Any) -> Any:
    """``mapPartitionsWithIndex`` function: ``(partition, path, examples, shapes)`` of every file, from the
    batch-file header, or by running the user's loader (``shapes``: its per-example shapes, ``""`` without one)."""
    for p in paths:
        path = str(p)
        if loader is None:
            yield index, path, batch_num_examples(path), ""
        else:
            batch = load_with(loader, path)
            yield index, path, len(batch), example_shapes(batch)


def first_item(sc: Any, rdd: Any) -> Any:
    """The first item of the first non-empty partition, or None.

    Unlike ``rdd.take(1)``, every partition it touches is read to the end: a Python worker that stops reading
    early cannot be reused, and its replacement would pay ``import torch`` again in the training stage.
    """
    for index in range(rdd.getNumPartitions()):
        found = sc.runJob(rdd, _first_and_drain, partitions=[index])
        if found:
            return found[0]
    return None


def sample_key(sc: Any, net: Network, rdd: Any, master: TrainingMaster, n: int) -> tuple[Any, ...]:
    """What the first-minibatch check (`first_item`) depends on: the input RDD (immutable: its id names its
    data), the master and worker count (how it is cut into minibatches) and the network's shape (module, parameter
    shapes and dtypes, precision, layout, losses). The same key means the same minibatch through the same network."""
    shapes = tuple((tuple(p.shape), p.dtype) for p in net.module.parameters())
    losses = tuple(loss.name for loss in net.losses)
    return (id(sc), rdd.id(), master, n, id(net), id(net.module), shapes, net.precision, net.memory_format, losses)


def _first_and_drain(items: Any) -> list[Any]:
    it = iter(items)
    first = next(it, _NOTHING)
    for _ in it:
        pass
    return [] if first is _NOTHING else [first]


_NOTHING = object()
