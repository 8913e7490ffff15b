"""``SparkNetwork``: train, evaluate and run a :class:`~torchspark.Network` on data that lives in Spark.

DL4J's SparkDl4jMultiLayer and SparkComputationGraph in one class: the training master decides how workers
synchronise; Spark moves the data and runs the workers; PyTorch does the math.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

from torchspark._io import filesystem, join
from torchspark.data import batch_num_examples, resolve_paths
from torchspark.errors import ConfigError, DataError
from torchspark.listeners import TrainingEvents, TrainingListener
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
from torchspark.spark.dataframes import network_batches
from torchspark.spark.evaluation_methods import EvaluationMethods
from torchspark.spark.export import (
    check_export_directory,
    export_base,
    export_name,
    export_rdd,
    mark_export,
    remove_dead_exports,
)
from torchspark.spark.inference_methods import InferenceMethods
from torchspark.spark.jobs import run_job
from torchspark.spark.preflight import executors_for_workers_per_node, preflight
from torchspark.spark.private_dirs import make_private_dir, remove_dirs
from torchspark.spark.runners import SparkBarrierRunner, SparkRoundsRunner, SparkWorkerData
from torchspark.spark.session import spark_context
from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.assignment import (
    check_loader,
    epoch_seed,
    file_items,
    grid_heads,
    load_with,
    per_epoch,
    plan_balanced,
)
from torchspark.training.checkpoint import plan_for
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.fit import build_task, run_fit
from torchspark.training.driver.runner import Runner
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.task import WorkerResult

__all__ = ["SparkNetwork"]

log = logging.getLogger(__name__)


class SparkNetwork(EvaluationMethods, InferenceMethods):
    """A network plus a training master, bound to a Spark session.

    Args:
        spark: a SparkSession or SparkContext (``torchspark.spark.local_session()`` for one machine).
        network: the :class:`~torchspark.Network` to train; it is updated in place by :meth:`fit`.
        training_master: how to train (``ParameterAveragingTrainingMaster`` or ``SharedTrainingMaster``); may be
            None when the object is used only for evaluation or inference.
        progress: draw a progress bar (examples/s, latest score) while training: None = only when stderr is a
            terminal, False = never. Workers stream progress and errors to the driver either way; see
            :meth:`add_progress_listener`.
        runner: how workers run (a :class:`~torchspark.training.driver.runner.Runner`); default (None): the master's
            route, one Spark barrier stage (:class:`~torchspark.spark.runners.SparkBarrierRunner`) or one Spark job
            per averaging round (``averaging_via="spark"``). Tests pass
            :class:`~torchspark.training.driver.runner.InProcessRunner` to train the prepared partitions in threads.
    """

    def __init__(
        self,
        spark: Any,
        network: Network,
        training_master: TrainingMaster | None = None,
        progress: bool | None = None,
        runner: Runner | None = None,
    ) -> None:
        if not isinstance(network, Network):
            raise ConfigError(f"network must be a torchspark.Network, got {type(network).__name__}")
        if training_master is not None and not isinstance(training_master, TrainingMaster):
            raise ConfigError(f"training_master must be a TrainingMaster, got {type(training_master).__name__}")
        self.sc = spark_context(spark)
        self.spark = spark
        self.network = network
        self.training_master = training_master
        self._score = math.nan
        self._exports: dict[tuple[int, int, bool], _Export] = {}
        self._prepared: dict[tuple[Any, ...], Any] = {}
        self._preflight_done: set[int] = set()
        self.last_results: list[WorkerResult] = []
        self.progress = progress
        if runner is not None and not callable(getattr(runner, "run", None)):
            raise ConfigError(f"runner must have a run(task, data, context) method (a Runner), got "
                              f"{type(runner).__name__}")
        self.runner = runner
        self._listeners: list[Callable[[ProgressUpdate], None]] = []
        self._training_listeners: list[TrainingListener] = []
        self._collect_stats = bool(training_master and training_master.collect_training_stats)
        self._stats: TrainingStats | None = None
        self._driver_stats = StatsCollector(DRIVER_ID, enabled=False)
        self._epoch_examples: int | None = None  # set by _prepare when the split knows it (progress bar total)
        # private default-export directories; the finalizer holds the list, not self, so garbage collection and
        # interpreter exit remove them (see torchspark.spark.private_dirs)
        self._private_dirs: list[str] = []
        self._finalizer = weakref.finalize(self, remove_dirs, self._private_dirs)

    def __enter__(self) -> "SparkNetwork":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove this object's exported batch files and unpersist its prepared RDDs (:meth:`delete_temp_files`).

        ``with SparkNetwork(...) as spark_net:`` calls it at the end of the block. Default exports (no
        ``export_directory``) are also removed when the object is garbage-collected and at interpreter exit;
        exports under an explicit ``export_directory`` only here or by :meth:`delete_temp_files`."""
        self.delete_temp_files()

    # ------------------------------------------------------------------ stats and progress
    def set_collect_training_stats(self, collect: bool) -> None:
        """Record per-phase timings of the next fits (see :attr:`training_stats`)."""
        self._collect_stats = bool(collect)

    @property
    def training_stats(self) -> TrainingStats | None:
        """Timings of the last fit (per worker and phase, aligned to the driver's clock), or None when not
        collected. ``summary()`` gives totals; ``export_html(path)`` writes the timeline report."""
        return self._stats

    def add_progress_listener(self, listener: Callable[[ProgressUpdate], None]) -> None:
        """Call ``listener(update)`` (on a driver thread) for every progress report workers send while training."""
        self._listeners.append(listener)

    def add_training_listener(self, listener: TrainingListener) -> None:
        """Tell ``listener`` (a :class:`~torchspark.listeners.TrainingListener`, e.g. ``MlflowListener`` or
        ``TensorBoardListener``) about every later fit: its start, progress, epochs and end. With a listener the
        workers also report the score they agree on each epoch (gradient sharing: one small all-reduce per epoch)."""
        if not isinstance(listener, TrainingListener):
            raise ConfigError(f"add_training_listener takes a torchspark.listeners.TrainingListener, got "
                              f"{type(listener).__name__}; use add_progress_listener for a plain callable")
        self._training_listeners.append(listener)

    # ------------------------------------------------------------------ public training API
    def get_score(self) -> float:
        """Mean over workers of their last minibatch loss in the last fit (NaN before any fit)."""
        return self._score

    def fit(
        self,
        data: Any,
        epochs: int = 1,
        features_col: str = "features",
        label_col: str | None = "label",
        feature_shape: Sequence[int] | None = None,
        run_id: str | None = None,
    ) -> Network:
        """Train on an ``RDD[DataSet | MultiDataSet]`` or a DataFrame for ``epochs`` epochs; returns the network.

        DataSets of any size are re-batched to ``batch_size_per_worker``. A DataFrame's ``features_col`` /
        ``label_col`` may be array or ML Vector columns; ``feature_shape`` reshapes each row (e.g. ``(1, 28, 28)``);
        rows stream to the workers through Arrow and are never collected on the driver.
        With the master's ``checkpoint_directory``, ``run_id`` names the run: a fit with the id of an interrupted
        run (in this or a new driver process) continues from its newest checkpoint, skipping the epochs and
        minibatches already done; resume with the same data, master and number of workers.
        """
        master = self._master()
        _check_epochs(epochs)
        plan_for(master, run_id, 0, 0)  # a run_id without checkpoint_directory fails before any Spark job
        self._driver_stats = StatsCollector(DRIVER_ID, enabled=self._collect_stats)
        self._epoch_examples = None
        rdd = network_batches(self.network, data, features_col, label_col, feature_shape)
        n = self._num_workers(master)
        base = self._export_base(master) if master.rdd_training_approach == "export" else None  # before any job
        self._preflight(master, n)
        worker_rdd = self._prepare(rdd, master, n, base, self._planned_epochs(master, epochs))
        return self._train(worker_rdd, master, n, epochs, run_id)

    def fit_paths(self, paths: Any, epochs: int = 1, loader: Callable[[str], Any] | None = None,
                  run_id: str | None = None) -> Network:
        """Train from files: batch files (``export_batches`` / ``save_batches`` output), or any files a ``loader``
        turns into DataSets.

        The seeds' recommended route: preprocess once (:func:`~torchspark.spark.export_batches`), keep the batch
        files on HDFS/S3, train many times from the paths. Files of any size are re-batched to
        ``batch_size_per_worker`` (as DL4J does), balanced by examples over the workers (with
        ``repartition="never"``: within each input partition). With ``rng_seed`` every epoch trains the
        minibatches in a new seeded order across workers (a pure function of the seed and the epoch number).

        Args:
            paths: a directory, a glob (``"s3://bucket/train/*.safetensors"``), one file, a list of paths, or an
                RDD of paths; any fsspec URL the executors can read.
            epochs: passes over the data.
            loader: ``fn(path) -> DataSet | MultiDataSet`` for files that are not batch files (images, CSV shards;
                DL4J's ``DataSetLoader``). It runs on the executors: once per file to count its examples, then
                every time a minibatch needs the file, so a loader should be cheap next to a training step (one
                file per minibatch or a few examples per file). It must be picklable (a module-level function, or
                a closure Spark's cloudpickle can ship). A directory then means every non-hidden file in it.
            run_id: as in :meth:`fit`.
        Raises:
            DataError: an empty list/RDD, a location that does not exist, a directory or glob without files, a file
                that is not a batch file (without ``loader``), or a loader that returns something else.
        """
        from pyspark import RDD

        master = self._master()
        _check_epochs(epochs)
        plan_for(master, run_id, 0, 0)
        check_loader(loader)
        self._driver_stats = StatsCollector(DRIVER_ID, enabled=self._collect_stats)
        n = self._num_workers(master)
        self._preflight(master, n)
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
        by_partition = self._keep_partitions(master, partitions, n)
        bsz, seed = master.batch_size_per_worker, master.rng_seed
        groups = per_epoch(lambda s: plan_path_files(indexed, n, bsz, s, by_partition, loader, master.drop_last), n,
                           seed, self.network.epoch, self._planned_epochs(master, epochs) if not by_partition else None)
        self._epoch_examples = None if master.drop_last else sum(count for _, _, count in indexed)
        return self._train(worker_rdd_from_paths(self.sc, groups), master, n, epochs, run_id)

    def delete_temp_files(self) -> None:
        """Remove the batch files that ``rdd_training_approach="export"`` wrote for this object, and unpersist the
        prepared RDDs that ``"direct"`` keeps for later fits of the same data."""
        for prepared in self._prepared.values():
            prepared.unpersist()
        self._prepared.clear()
        for export in self._exports.values():
            fs, path = filesystem(export.directory)
            if fs.exists(path):
                fs.rm(path, recursive=True)
        self._exports.clear()
        remove_dirs(self._private_dirs)

    # ------------------------------------------------------------------ internals
    def _master(self) -> TrainingMaster:
        if self.training_master is None:
            raise ConfigError("this SparkNetwork has no training_master; pass one to train")
        return self.training_master

    def _preflight(self, master: TrainingMaster, n: int) -> None:
        """Before any job touches the executors: slots, dynamic allocation, and (once per session) imports."""
        first = id(self.sc) not in self._preflight_done
        preflight(self.sc, n, wait_s=min(60.0, master.rendezvous_timeout_s), check_imports=first)
        self._preflight_done.add(id(self.sc))

    def _num_workers(self, master: TrainingMaster) -> int:
        per_node = getattr(master, "workers_per_node", -1)
        if per_node >= 1:  # SharedTrainingMaster: k workers on every executor the session has
            return executors_for_workers_per_node(self.sc, per_node, min(60.0, master.rendezvous_timeout_s))
        return master.num_workers or self.sc.defaultParallelism

    @staticmethod
    def _keep_partitions(master: TrainingMaster, partitions: int, n: int) -> bool:
        if master.repartition == "never":
            if partitions != n:
                raise ConfigError(
                    f"repartition='never' trains one input partition per worker, but the data has {partitions} "
                    f"partitions and num_workers={n}; repartition the data to {n} partitions, set num_workers, "
                    "or use repartition='always'"
                )
            return True
        return master.repartition == "num_partitions_workers_differs" and partitions == n

    def _export_base(self, master: TrainingMaster) -> str:
        local_dir = self.sc.getConf().get("spark.local.dir", None)
        return export_base(master.export_directory, self.sc.master, local_dir, tempfile.gettempdir())

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
        if not self._private_dirs:
            self._private_dirs.append(make_private_dir(base))
        directory = join(self._private_dirs[0], name)
        os.mkdir(directory, 0o700)
        return directory

    def _count_files(self, paths: Any, loader: Callable[[str], Any] | None) -> list[tuple[int, str, int]]:
        return run_job(self.sc, "torchspark: count the examples of every file",
                       paths.mapPartitionsWithIndex(partial(_count_files, loader)).collect)

    @staticmethod
    def _planned_epochs(master: TrainingMaster, epochs: int) -> int | None:
        """Epochs the driver plans across workers at once: all of them, except on the rounds route (None: one
        Spark job per round reads each worker partition as it is, so the fit's epochs share one plan)."""
        return None if getattr(master, "averaging_via", "torch") == "spark" else epochs

    def _prepare(self, rdd: Any, master: TrainingMaster, n: int, base: str | None, epochs: int | None = None) -> Any:
        """An RDD with one partition per worker holding that worker's minibatches (paths, FileSlices or bytes), in
        order."""
        keep = self._keep_partitions(master, rdd.getNumPartitions(), n)
        balanced = not keep and master.repartition_strategy == "balanced"
        if master.drop_last and not balanced:
            raise ConfigError(f"drop_last=True needs the balanced split, but the data's {n} partitions are kept as "
                              "they are (repartition='num_partitions_workers_differs'); set repartition='always' "
                              "or drop_last=False")
        if master.rdd_training_approach == "export":
            assert base is not None
            return self._prepare_export(rdd, master, n, base, keep, balanced, epochs)
        if balanced and master.rng_seed is not None and epochs is not None and (epochs > 1 or self.network.epoch):
            return self._prepare_direct_epochs(rdd, master, n, epochs)
        return self._prepare_direct(rdd, master, n, keep, balanced)

    def _export(self, rdd: Any, master: TrainingMaster, base: str, on_grid: bool) -> _Export:
        """Batch files of ``rdd`` (written once, reused by later fits): on the balanced plan's global grid when
        ``on_grid`` (any worker count and seed reuses them), else every partition on its own grid."""
        bsz = master.batch_size_per_worker
        key = (rdd.id(), bsz, on_grid)
        if key not in self._exports:
            directory = self._export_directory(master, base, rdd.id())
            try:
                sizes = heads = None
                if on_grid:
                    with self._driver_stats.phase("count"):
                        sizes = _count(self.sc, rdd)
                    heads = grid_heads(sizes, bsz)
                with self._driver_stats.phase("export"):
                    files = run_job(self.sc, f"torchspark: export the training data to {directory}",
                                    lambda: export_rdd(rdd, directory, bsz, heads))
            except BaseException:  # bad data or Ctrl-C: leave no half-written export behind
                fs, path = filesystem(directory)
                if fs.exists(path):
                    fs.rm(path, recursive=True)
                raise
            self._exports[key] = _Export(directory, files, sizes)
        return self._exports[key]

    def _prepare_export(self, rdd: Any, master: TrainingMaster, n: int, base: str, keep: bool,
                        balanced: bool, epochs: int | None = None) -> Any:
        export = self._export(rdd, master, base, on_grid=balanced)
        if not export.files:
            raise DataError("the training data is empty: the RDD holds no examples")
        if balanced:  # every epoch in its own seeded order across workers (only names travel)
            sizes, bsz = export.sizes, master.batch_size_per_worker
            assert sizes is not None
            self._epoch_examples = sum(plan_balanced(sizes, bsz, n, None, master.drop_last).examples_per_worker())
            groups = per_epoch(lambda s: file_items(plan_balanced(sizes, bsz, n, s, master.drop_last), export.files), n,
                               master.rng_seed, self.network.epoch, epochs)
            return worker_rdd_from_paths(self.sc, groups)
        paths = [(part, path) for part, path, _ in export.files]
        self._epoch_examples = sum(count for _, _, count in export.files)
        if not keep:  # spark_default
            return spread_round_robin(self.sc.parallelize([p for _, p in paths]), n, master.rng_seed)
        return worker_rdd_from_paths(self.sc, group_paths(paths, n, master.rng_seed, by_partition=True))

    def _prepare_direct_epochs(self, rdd: Any, master: TrainingMaster, n: int, epochs: int) -> Any:
        """The direct route with a new seeded plan across workers every epoch (not kept for later fits: the plans
        depend on the network's epoch counter)."""
        seed, bsz, first = master.rng_seed, master.batch_size_per_worker, self.network.epoch
        assert seed is not None
        with self._driver_stats.phase("count"):
            sizes = _count(self.sc, rdd)
        plans = [plan_balanced(sizes, bsz, n, epoch_seed(seed, first + e), master.drop_last) for e in range(epochs)]
        self._epoch_examples = sum(plans[0].examples_per_worker())
        with self._driver_stats.phase("repartition"):
            return worker_rdd_balanced_epochs(rdd, plans, first)

    def _prepare_direct(self, rdd: Any, master: TrainingMaster, n: int, keep: bool, balanced: bool) -> Any:
        bsz = master.batch_size_per_worker
        level = storage_level_by_name(master.storage_level)
        # later fits of the same RDD reuse the persisted, repartitioned minibatches (no count, no shuffle); only the
        # latest data stays persisted
        cache_key = (rdd.id(), bsz, n, keep, master.repartition_strategy, master.rng_seed, master.storage_level,
                     master.drop_last)
        cached = self._prepared.get(cache_key)
        if cached is not None:
            return cached
        for old in self._prepared.values():
            old.unpersist()
        self._prepared.clear()
        if balanced:
            with self._driver_stats.phase("count"):
                sizes = _count(self.sc, rdd)
            plan = plan_balanced(sizes, bsz, n, master.rng_seed, master.drop_last)
            self._epoch_examples = sum(plan.examples_per_worker())
            with self._driver_stats.phase("repartition"):
                prepared = worker_rdd_balanced(rdd, plan, level)
        else:
            batches = rdd.mapPartitions(rebatch_partition(bsz))
            prepared = (shuffle_partitions(batches, master.rng_seed) if keep
                        else spread_round_robin(batches, n, master.rng_seed)).persist(level)
        self._prepared[cache_key] = prepared
        return prepared

    def _validate_sample(self, worker_rdd: Any) -> None:
        """Fail fast on the driver: run the network on a few examples of the first minibatch."""
        from torchspark.training.worker.loop import load_item

        first = run_job(self.sc, "torchspark: read the first minibatch", lambda: first_item(self.sc, worker_rdd))
        if first is None:
            raise DataError("the training data is empty: no minibatches reached the workers")
        batch = load_item(first)
        sample = batch.slice(0, min(4, len(batch)))
        sample.check_finite("training features")
        self.network.score(sample)

    def _train(self, worker_rdd: Any, master: TrainingMaster, n: int, epochs: int,
               run_id: str | None = None) -> Network:
        collector = self._driver_stats
        self._validate_sample(worker_rdd)
        if worker_rdd.getNumPartitions() != n:
            worker_rdd = (worker_rdd.coalesce(n) if worker_rdd.getNumPartitions() > n
                          else spread_round_robin(worker_rdd, n))
        task = build_task(self.network, master, epochs, self._collect_stats, collector,
                          report_scores=bool(self._training_listeners), run_id=run_id)
        events = (TrainingEvents(self._training_listeners, runner="SparkNetwork", master=master,
                                 network=self.network, epochs=epochs, num_workers=n)
                  if self._training_listeners else None)
        outcome = run_fit(self.network, task, self._runner(master), SparkWorkerData(self.sc, worker_rdd),
                          recorder=collector, description=f"torchspark fit: {n} workers, {epochs} epoch(s)",
                          listeners=self._listeners, progress=self.progress, events=events,
                          max_failures=master.max_failures,
                          total_examples=None if self._epoch_examples is None else self._epoch_examples * epochs)
        self._score, self.last_results, self._stats = outcome.score, outcome.results, outcome.stats
        return self.network

    def _runner(self, master: TrainingMaster) -> Runner:
        """The injected runner, else the master's route: one Spark job per round (DL4J's ``averaging_via="spark"``)
        or one barrier stage."""
        if self.runner is not None:
            return self.runner
        if getattr(master, "averaging_via", "torch") == "spark":
            return SparkRoundsRunner(self.sc, master.aggregation_depth,  # type: ignore[attr-defined]
                                     master.storage_level)
        return SparkBarrierRunner(self.sc, master.mesh)


@dataclass(frozen=True)
class _Export:
    """Batch files written for one RDD: where, ``(partition, path, examples)`` in data order, and the partitions'
    example counts (only for exports cut on the balanced plan's grid)."""

    directory: str
    files: list[tuple[int, str, int]]
    sizes: list[int] | None


def _count(sc: Any, rdd: Any) -> list[int]:
    """:func:`count_examples` as a job whose bad data (a wrong ``feature_shape``, a non-DataSet item) raises
    :class:`DataError` on the driver."""
    return run_job(sc, "torchspark: count the training examples", lambda: count_examples(rdd))


def _count_files(loader: Callable[[str], Any] | None, index: int, paths: Any) -> Any:
    """``mapPartitionsWithIndex`` function: ``(partition, path, examples)`` of every file, from the batch-file
    header, or by running the user's loader."""
    for p in paths:
        path = str(p)
        yield index, path, batch_num_examples(path) if loader is None else len(load_with(loader, path))


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


def _first_and_drain(items: Any) -> list[Any]:
    it = iter(items)
    first = next(it, _NOTHING)
    for _ in it:
        pass
    return [] if first is _NOTHING else [first]


_NOTHING = object()


def _check_epochs(epochs: Any) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")

