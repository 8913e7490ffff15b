"""``SparkNetwork``: train, evaluate and run a [`Network`][torchspark.Network] on data that lives in Spark.

DL4J's SparkDl4jMultiLayer and SparkComputationGraph in one class: the training master decides how workers
synchronise; Spark moves the data and runs the workers; PyTorch does the math.

A thin adapter: `DataPreparation` turns the data into one partition per worker,
the master's route picks the runner, and `FitAdapter` runs the fit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from torchspark.data import Columns
from torchspark.data.columns import FeaturesCol
from torchspark.errors import ConfigError, DataError
from torchspark.listeners import TrainingEvents, TrainingListener
from torchspark.nn import Network
from torchspark.spark.connect.fit import check_connect_data, connect_fit_data, takes_arrow_route
from torchspark.spark.connect.paths import connect_path_data
from torchspark.spark.connect.progress import ConnectProgress, check_channel
from torchspark.spark.connect.runner import ConnectBarrierRunner
from torchspark.spark.data import spread_round_robin
from torchspark.spark.dataframes import network_batches
from torchspark.spark.evaluation_methods import EvaluationMethods
from torchspark.spark.gpus import GpuPlan, dry_run_requested, plan_gpus
from torchspark.spark.inference_methods import InferenceMethods
from torchspark.spark.jobs import jvm_guard, run_job
from torchspark.spark.preflight import executors_for_workers_per_node, preflight
from torchspark.spark.preparation import DataPreparation, first_item, planned_epochs, sample_key
from torchspark.spark.runners import SparkBarrierRunner, SparkRoundsRunner, SparkWorkerData, elastic_route
from torchspark.spark.session import spark_context
from torchspark.spark.session_kinds import is_connect_session
from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.assignment import check_loader
from torchspark.training.checkpoint import plan_for
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.adapter import FitAdapter, check_first_batch, check_runner
from torchspark.training.driver.runner import Runner
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.task import WorkerResult
from torchspark.validation import check_bool, check_int

__all__ = ["SparkNetwork"]

log = logging.getLogger(__name__)


class SparkNetwork(EvaluationMethods, InferenceMethods):
    """A network plus a training master, bound to a Spark session.

    Args:
        spark: a SparkSession or SparkContext (``torchspark.spark.local_session()`` for one machine), or a Spark
            Connect session (``SparkSession.builder.remote("sc://host:15002").getOrCreate()``): then [`fit`][torchspark.spark.SparkNetwork.fit]
            takes a DataFrame and trains in one barrier ``mapInArrow`` stage
            (`ConnectBarrierRunner`), and [`sc`][torchspark.spark.SparkNetwork.sc] is None.
        network: the [`Network`][torchspark.Network] to train; it is updated in place by [`fit`][torchspark.spark.SparkNetwork.fit].
        master: how to train (``ParameterAveragingTrainingMaster`` or ``SharedTrainingMaster``); may be
            None when the object is used only for evaluation or inference.
        progress: draw a progress bar (examples/s, latest score) while training: None = only when stderr is a
            terminal, False = never. Workers stream progress and errors to the driver either way; see
            [`add_progress_listener`][torchspark.spark.SparkNetwork.add_progress_listener].
        runner: how workers run (a [`Runner`][torchspark.training.Runner]); default (None): the master's
            route, one Spark barrier stage (`SparkBarrierRunner`) or one Spark job
            per averaging round (``averaging_via="spark"``). Tests pass
            [`InProcessRunner`][torchspark.training.InProcessRunner] to train the prepared partitions in threads.
        progress_channel: on a Spark Connect session, how progress, heartbeats, scores and worker tracebacks reach
            this client (`torchspark.spark.connect.progress`): ``"auto"`` (default: TCP when the Connect
            server runs on this machine, else the directory below when there is one), ``"tcp"``, ``"directory"``
            (workers write files the client polls: for a client the executors cannot connect to), ``"none"``.
            A classic session always uses TCP (its driver is in the cluster).
        progress_directory: where the ``"directory"`` channel's files go: any fsspec URL every executor can write
            and this client can read, e.g. ``"s3://bucket/torchspark/progress"`` (each fit uses a fresh
            subdirectory, removed when it succeeds, kept when it fails). None: ``<checkpoint_directory>/<run_id>/
            progress`` when the master checkpoints.
        progress_poll_s: seconds between two reads of the directory by the client (and two writes by a worker);
            1.0 keeps the bar live, raise it when each listing costs (an object store's LIST).

    Example (a laptop client of a remote cluster)::

        spark = SparkSession.builder.remote("sc://cluster:15002").getOrCreate()
        SparkNetwork(spark, net, master, progress_directory="s3://bucket/progress").fit(df)
    """

    def __init__(
        self,
        spark: Any,
        network: Network,
        master: TrainingMaster | None = None,
        progress: bool | None = None,
        runner: Runner | None = None,
        progress_channel: str = "auto",
        progress_directory: str | None = None,
        progress_poll_s: float = 1.0,
    ) -> None:
        if not isinstance(network, Network):
            raise ConfigError(f"network must be a torchspark.Network, got {type(network).__name__}")
        if master is not None and not isinstance(master, TrainingMaster):
            raise ConfigError(f"master must be a TrainingMaster, got {type(master).__name__}")
        #: the SparkContext; None on a Spark Connect session (which has none)
        self.sc = None if is_connect_session(spark) else spark_context(spark)
        self.spark = spark
        #: the progress channel of fits on a Connect session
        self.progress_channel = ConnectProgress(progress_channel, progress_directory, progress_poll_s)
        if self.sc is not None and (
            progress_channel != "auto" or progress_directory is not None or progress_poll_s != 1.0
        ):
            raise ConfigError(
                f"progress_channel={progress_channel!r} / progress_directory={progress_directory!r} / "
                f"progress_poll_s={progress_poll_s!r} apply to a Spark Connect session only; on a classic session "
                "the driver runs in the "
                "cluster and workers stream progress to it over TCP: drop these arguments"
            )
        self.network = network
        self.master = master
        self._preflight_done: set[tuple[str, int]] = set()  # (check, id(sc)): the once-per-session checks run
        self._sampled: Any = None  # what the last first-minibatch check passed for (sample_key)
        self.progress = progress
        check_runner(runner)
        self.runner = runner
        self._fits = FitAdapter("SparkNetwork", TrainingListener, TrainingEvents)
        self._collect_stats = bool(master and master.collect_training_stats)
        self._driver_stats = StatsCollector(DRIVER_ID, enabled=False)
        #: the fit's data on the workers: the routes, their caches and this object's export files
        #: (`torchspark.spark.private_dirs`: removed on close, garbage collection and interpreter exit)
        self.preparation = DataPreparation(self.sc, network)

    def __enter__(self) -> SparkNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove this object's exported batch files and unpersist its prepared RDDs ([`delete_temp_files`][torchspark.spark.SparkNetwork.delete_temp_files]).

        ``with SparkNetwork(...) as spark_net:`` calls it at the end of the block. Default exports (no
        ``export_directory``) are also removed when the object is garbage-collected and at interpreter exit;
        exports under an explicit ``export_directory`` only here or by [`delete_temp_files`][torchspark.spark.SparkNetwork.delete_temp_files]."""
        self.delete_temp_files()

    # ------------------------------------------------------------------ stats and progress
    @property
    def collect_training_stats(self) -> bool:
        """Whether the next fits record per-phase timings (see [`training_stats`][torchspark.spark.SparkNetwork.training_stats]); starts as the master's
        ``collect_training_stats``, and may be set (``spark_net.collect_training_stats = True``)."""
        return self._collect_stats

    @collect_training_stats.setter
    def collect_training_stats(self, collect: bool) -> None:
        self._collect_stats = bool(check_bool("collect_training_stats", collect))

    @property
    def training_stats(self) -> TrainingStats | None:
        """Timings of the last fit (per worker and phase, aligned to the driver's clock), or None when not
        collected. ``summary()`` gives totals; ``export_html(path)`` writes the timeline report."""
        return self._fits.stats

    @property
    def last_results(self) -> list[WorkerResult]:
        """Every worker's result of the last fit, by rank."""
        return self._fits.results

    def add_progress_listener(self, listener: Callable[[ProgressUpdate], None]) -> None:
        """Call ``listener(update)`` (on a driver thread) for every progress report workers send while training."""
        self._fits.add_progress_listener(listener)

    def add_training_listener(self, listener: TrainingListener) -> None:
        """Tell ``listener`` (a [`TrainingListener`][torchspark.listeners.TrainingListener], e.g. ``MlflowListener`` or
        ``TensorBoardListener``) about every later fit: its start, progress, epochs and end. With a listener the
        workers also report the score they agree on each epoch (gradient sharing: one small all-reduce per epoch)."""
        self._fits.add_training_listener(listener)

    # ------------------------------------------------------------------ public training API
    @property
    def score(self) -> float:
        """Mean over workers of their last minibatch loss in the last fit (NaN before any fit)."""
        return self._fits.score

    def fit(
        self,
        data: Any,
        epochs: int = 1,
        features_col: FeaturesCol = "features",
        label_col: str | Sequence[str] | None = "label",
        feature_shape: Any = None,
        run_id: str | None = None,
        restart_epoch: bool = False,
        columns: Columns | None = None,
    ) -> Network:
        """Train on an ``RDD[DataSet | MultiDataSet]`` or a DataFrame for ``epochs`` epochs; returns the network.

        DataSets of any size are re-batched to ``batch_size_per_worker``. A DataFrame's ``features_col`` /
        ``label_col`` may be array or ML Vector columns (lists of them for several inputs / outputs);
        ``features_col`` may map keyword inputs to columns (``{"input_ids": "ids", "attention_mask": "mask"}``:
        the module is called as ``module(input_ids=..., attention_mask=...)``, integer columns arrive as int64);
        ``feature_shape`` reshapes each row (e.g. ``(1, 28, 28)``, or ``{"input_ids": (32,)}`` per keyword);
        ``columns=Columns(...)`` says all three in one
        value (giving both is a ConfigError). Rows stream to the workers through Arrow and are never collected on
        the driver.
        With the master's ``checkpoint_directory``, ``run_id`` names the run: a fit with the id of an interrupted
        run (in this or a new driver process) continues from its newest checkpoint, skipping the epochs and
        minibatches already done; resume with the same data, master and number of workers (checked, see
        docs/guides/recovery.md), or pass ``restart_epoch=True`` to train an interrupted epoch whose data changed
        again from its start.

        On a Spark Connect session ``data`` must be a DataFrame (an RDD or a list raises ``ConfigError``); its rows
        stream to the workers of one barrier stage, split and batched as on a classic session
        (`torchspark.spark.connect.fit` says which master settings apply there).
        """
        cols = Columns.of(columns, features_col, label_col, feature_shape, owner="fit")
        master = self._require_master()
        check_int("epochs", epochs, 1)
        plan_for(master, run_id, 0, 0, restart_epoch)  # a run_id without checkpoint_directory: before any job
        self._driver_stats = StatsCollector(DRIVER_ID, enabled=self._collect_stats)
        self._restart_epoch = restart_epoch
        if takes_arrow_route(self.spark, master, data):
            if self.sc is None:
                check_channel(self.progress_channel, master.checkpoint_directory)
            return self._fit_connect(data, master, epochs, cols, run_id)
        self.preparation.epoch_examples = None
        rdd = self._batches(data, cols)
        n = self._num_workers(master)
        base = (
            self.preparation.export_base(master) if master.rdd_training_approach == "export" else None
        )  # before any job
        gpus = self._preflight(master, n)
        worker_rdd = self.preparation.from_rdd(rdd, master, n, base, planned_epochs(master, epochs), self._driver_stats)
        return self._train(
            worker_rdd, master, n, epochs, run_id, gpus, sample_key(self.sc, self.network, rdd, master, n)
        )

    def fit_paths(
        self,
        paths: Any,
        epochs: int = 1,
        loader: Callable[[str], Any] | None = None,
        run_id: str | None = None,
        restart_epoch: bool = False,
    ) -> Network:
        """Train from files: batch files (``export_batches`` / ``save_batches`` output), or any files a ``loader``
        turns into DataSets.

        DL4J's recommended route: preprocess once ([`export_batches`][torchspark.spark.export_batches]), keep the batch
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
            run_id, restart_epoch: as in [`fit`][torchspark.spark.SparkNetwork.fit].

        On a Spark Connect session the client resolves and plans the files (a path, a glob or a list: no RDD) and
        each worker of one barrier ``mapInArrow`` stage reads its own files (`torchspark.spark.connect.paths`);
        the client and every executor must reach them.

        Raises:
            ConfigError: an RDD of paths on a Spark Connect session, or master settings it cannot run.
            DataError: an empty list/RDD, a location that does not exist, a directory or glob without files, a file
                that is not a batch file (without ``loader``), or a loader that returns something else.
        """
        master = self._require_master()
        check_int("epochs", epochs, 1)
        plan_for(master, run_id, 0, 0, restart_epoch)
        check_loader(loader)
        self._driver_stats = StatsCollector(DRIVER_ID, enabled=self._collect_stats)
        self._restart_epoch = restart_epoch
        if self.sc is None:
            check_channel(self.progress_channel, master.checkpoint_directory)
            shares = connect_path_data(self.spark, self.network, paths, loader, master, epochs, self._driver_stats)
            return self._train_connect(shares, master, epochs, run_id)
        n = self._num_workers(master)
        gpus = self._preflight(master, n)
        worker_rdd = self.preparation.from_paths(paths, loader, master, n, epochs)
        return self._train(worker_rdd, master, n, epochs, run_id, gpus)

    def delete_temp_files(self) -> None:
        """Remove the batch files that ``rdd_training_approach="export"`` wrote for this object, and unpersist the
        prepared RDDs that ``"direct"`` keeps for later fits of the same data."""
        self.preparation.delete_temp_files()

    # ------------------------------------------------------------------ internals
    def _require_master(self) -> TrainingMaster:
        if self.master is None:
            raise ConfigError("this SparkNetwork has no master; pass one to train")
        return self.master

    def _preflight(self, master: TrainingMaster, n: int) -> GpuPlan:
        """Before any job touches the executors: the training stage's GPUs (`torchspark.spark.gpus`), slots,
        dynamic allocation, and (once per session) imports and, with GPUs, the executors' CUDA."""
        gpus = plan_gpus(self.sc, master.gpus_per_worker, dry_run_requested())
        imports, cuda = ("imports", id(self.sc)), ("cuda", id(self.sc))
        check_cuda = gpus.requested and not gpus.dry_run and cuda not in self._preflight_done
        preflight(
            self.sc,
            n,
            wait_s=min(60.0, master.rendezvous_timeout_s),
            check_imports=imports not in self._preflight_done,
            gpus=gpus,
            check_cuda=check_cuda,
        )
        self._preflight_done.update([imports, cuda] if check_cuda else [imports])
        return gpus

    def _batches(self, data: Any, columns: Columns) -> Any:
        """The batch RDD of ``data``: an RDD as it is; a DataFrame's made once per DataFrame and columns
        (`frame_batches`), so later fits reuse its export."""
        return self.preparation.frame_batches(data, (columns,), lambda: network_batches(self.network, data, columns))

    def _num_workers(self, master: TrainingMaster) -> int:
        per_node = master.workers_per_executor
        if per_node is not None:  # SharedTrainingMaster: k workers on every executor the session has
            return executors_for_workers_per_node(self.sc, per_node, min(60.0, master.rendezvous_timeout_s))
        return master.num_workers or self.sc.defaultParallelism

    def _validate_sample(self, worker_rdd: Any, key: Any = None) -> None:
        """Fail fast on the driver: run the network on a few examples of the first minibatch. A Spark job per fit
        (0.2-0.9 s of a warm call's fixed cost), so skipped when ``key`` (`sample_key`: the same input RDD,
        master, worker count and network shape) equals the last check's: its outcome would be the same."""
        if key is not None and key == self._sampled:
            return
        first = run_job(self.sc, "torchspark: read the first minibatch", lambda: first_item(self.sc, worker_rdd))
        if first is None:
            raise DataError("the training data is empty: no minibatches reached the workers")
        check_first_batch(self.network, first)
        self._sampled = key

    def _train(
        self,
        worker_rdd: Any,
        master: TrainingMaster,
        n: int,
        epochs: int,
        run_id: str | None = None,
        gpus: GpuPlan | None = None,
        sample_key: Any = None,
    ) -> Network:
        self._validate_sample(worker_rdd, sample_key)
        if worker_rdd.getNumPartitions() != n:
            worker_rdd = (
                worker_rdd.coalesce(n) if worker_rdd.getNumPartitions() > n else spread_round_robin(worker_rdd, n)
            )
        examples = self.preparation.epoch_examples
        with jvm_guard(self.sc, f"torchspark fit: {n} workers"):  # a dead driver JVM: say so, not py4j's words
            self._fit_rdd(worker_rdd, master, n, epochs, run_id, gpus, examples)
        return self.network

    def _fit_rdd(
        self,
        worker_rdd: Any,
        master: TrainingMaster,
        n: int,
        epochs: int,
        run_id: str | None,
        gpus: GpuPlan | None,
        examples: int | None,
    ) -> None:
        data = SparkWorkerData(self.sc, worker_rdd)
        data_for = elastic_route(data, master)
        self._fits.fit(
            self.network,
            master,
            self._runner(master, gpus),
            data,
            epochs=epochs,
            num_workers=n,
            collect_stats=self._collect_stats,
            recorder=self._driver_stats,
            description=f"torchspark fit: {n} workers, {epochs} epoch(s)",
            run_id=run_id,
            restart_epoch=self._restart_epoch,
            progress=self.progress,
            total_examples=None if examples is None else examples * epochs,
            data_for=data_for,
        )

    def _fit_connect(
        self,
        data: Any,
        master: TrainingMaster,
        epochs: int,
        columns: Columns,
        run_id: str | None,
    ) -> Network:
        """[`fit`][torchspark.spark.SparkNetwork.fit] on a Spark Connect session, or of a DataFrame with ``dataframe_route="barrier_arrow"``: the
        rows streamed into one barrier ``mapInArrow`` stage."""
        check_connect_data(self.spark, data)
        spark = self.spark if self.sc is None else data.sparkSession
        shares = connect_fit_data(
            spark,
            self.network,
            data,
            master,
            epochs,
            columns=columns,
            recorder=self._driver_stats,
        )
        return self._train_connect(shares, master, epochs, run_id, spark)

    def _train_connect(
        self, shares: Any, master: TrainingMaster, epochs: int, run_id: str | None, spark: Any = None
    ) -> Network:
        """Run the fit of a Connect session's prepared data (a DataFrame's rows or a plan of files) on ``spark``
        (default: this object's session)."""
        n, examples = shares.workers, shares.epoch_examples
        runner = self.runner or ConnectBarrierRunner(
            spark if spark is not None else self.spark, master.mesh, channel=self.progress_channel
        )
        self._fits.fit(
            self.network,
            master,
            runner,
            shares,
            epochs=epochs,
            num_workers=n,
            collect_stats=self._collect_stats,
            recorder=self._driver_stats,
            description=f"torchspark fit: {n} workers, {epochs} epoch(s)",
            run_id=run_id,
            restart_epoch=self._restart_epoch,
            progress=self.progress,
            total_examples=None if examples is None else examples * epochs,
        )
        return self.network

    def _runner(self, master: TrainingMaster, gpus: GpuPlan | None = None) -> Runner:
        """The injected runner, else the master's route: one Spark job per round (DL4J's ``averaging_via="spark"``)
        or one barrier stage, either with the training stage's GPUs ``gpus``."""
        if self.runner is not None:
            return self.runner
        if master.spark_rounds:
            return SparkRoundsRunner(
                self.sc,
                master.aggregation_depth,  # type: ignore[attr-defined]
                master.storage_level,
                gpus,
            )
        return SparkBarrierRunner(self.sc, master.mesh, gpus)
