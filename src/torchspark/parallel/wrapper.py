"""``ParallelWrapper``: the Spark training masters' algorithms on one machine, without Spark.

DL4J sent single-box users (many cores, several GPUs) to ParallelWrapper: the same algorithms with less overhead,
and a way to try on a laptop the configuration that will run on the cluster. Workers are separate processes that
run the very same worker loop, codec and averaging code as the Spark masters ([`run_worker`][torchspark.training.run_worker]), connected by
``torch.distributed`` (gloo on CPU, nccl on distinct GPUs); [`LocalProcessRunner`][torchspark.parallel.LocalProcessRunner] supervises them.

Workers are started by a fork server with torch preloaded (``spawn`` where the platform has no fork server): never
forked from the calling process, so its threads, CUDA context and locks are not inherited. Like ``spawn``, this
means a script that calls [`ParallelWrapper.fit`][torchspark.parallel.ParallelWrapper.fit] at top level needs the ``if __name__ == "__main__":`` guard,
and custom modules must be importable (defined in a module, not in ``__main__`` of an interactive session).

Beside it: which device each worker gets (`torchspark.parallel.devices`) and how the data is split over the
workers (`torchspark.parallel.routing`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import DataLoader

from torchspark.errors import ConfigError
from torchspark.listeners import TrainingEvents, TrainingListener
from torchspark.nn import Network
from torchspark.parallel.devices import default_devices, default_threads, plan_devices
from torchspark.parallel.feeding import WorkerShares
from torchspark.parallel.options import SPARK_ONLY, check_local_master, master_from_options
from torchspark.parallel.routing import BATCH_TYPES, PATH_TYPES, DataPlan, from_torch_data, route_data
from torchspark.parallel.runner import LocalProcessRunner
from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.checkpoint import check_restart_epoch
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.adapter import FitAdapter, check_first_batch, check_runner
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.task import WorkerResult
from torchspark.validation import check_bool, check_int

# plan_devices is re-exported: users import it from here and from torchspark.parallel
__all__ = ["ParallelWrapper", "plan_devices"]

log = logging.getLogger(__name__)


def _log_score(report: ScoreReport) -> None:
    """The ``report_score_after_averaging`` log line (a progress-server listener, on this process)."""
    if report.round is None:
        log.info(
            "epoch %d: mean score over all workers' minibatches %.6f (%d examples)",
            report.epoch,
            report.score,
            report.examples,
            extra={"score_report": report},
        )
    else:
        log.info(
            "epoch %d, averaging round %d: averaged score %.6f (%d examples)",
            report.epoch,
            report.round,
            report.score,
            report.examples,
            extra={"score_report": report},
        )


# ------------------------------------------------------------------ the wrapper
class ParallelWrapper:
    """Train a network with several local worker processes, the Spark masters' algorithms without Spark.

    How to train is a training master, the object ``SparkNetwork`` takes: ``master=SharedTrainingMaster(...)`` or
    ``ParameterAveragingTrainingMaster(...)`` (its ``batch_size_per_worker`` is [`fit`][torchspark.parallel.ParallelWrapper.fit]'s default batch size;
    Spark-only options such as ``export_directory`` or ``averaging_via="spark"`` are refused). Without one,
    ``training_mode`` names the master and the other keyword options are that master's own options, by the master's
    own names, defaults and documentation ([`TrainingMaster`][torchspark.TrainingMaster],
    [`ParameterAveragingTrainingMaster`][torchspark.ParameterAveragingTrainingMaster],
    [`SharedTrainingMaster`][torchspark.SharedTrainingMaster]; ``batch_size_per_worker`` defaults to
    32 here). The effective master is `master`; its options read through the wrapper (``pw.rng_seed``), and
    setting one on a wrapper whose options built the master rebuilds it (validated). Passing ``master=`` and options
    is a ConfigError.

    Example::

        pw = ParallelWrapper(net, num_workers=2, training_mode="sharing", overlap=False, rng_seed=0)
        pw.fit(train, epochs=3, batch_size=32)

    Args:
        network: the [`Network`][torchspark.Network] to train (updated in place by [`fit`][torchspark.parallel.ParallelWrapper.fit]).
        num_workers: worker processes. None = the master's ``num_workers``, else one per listed device, else one per
            GPU, else one per CPU core. Each CPU worker gets cores // workers torch threads, and every extra worker
            adds synchronisation, so on CPU try 2-4 workers before one per core.
        training_mode: ``"averaging"`` (default: synchronous parameter averaging, ParameterAveragingTrainingMaster)
            or ``"sharing"`` (threshold-encoded gradient sharing, SharedTrainingMaster); with ``master=``, the
            master's (`training_mode` reads it).
        master: the training master (instead of ``training_mode`` and its options).
        devices: devices dealt round-robin to the workers (``["cuda:0", "cuda:1"]``); default: every GPU, else
            CPU. GPUs shared by several workers, or mixed CPU/GPU, talk over gloo instead of nccl.
        progress: progress bar (examples/s, score) on this process: True, False, or None = only on a terminal.
        threads_per_worker: torch threads in each worker; None = cores // workers. Use 1 to reproduce a Spark run
            (``spark.task.cpus=1``) to the last bit.
        report_score_after_averaging: log (INFO, logger ``torchspark.parallel.wrapper``, on this process) the score
            all workers agree on, live: averaging logs after every round the example-weighted mean over workers of
            their last minibatch loss in the round; gradient sharing has no averaging rounds and logs once per epoch
            the example-weighted mean loss of every minibatch of every worker (one extra small all-reduce per
            epoch). Each record carries the [`ScoreReport`][torchspark.training.ScoreReport] as ``score_report``.
        runner: how workers run (a [`Runner`][torchspark.training.Runner]); default: a
            [`LocalProcessRunner`][torchspark.parallel.LocalProcessRunner] on [`worker_devices`][torchspark.parallel.ParallelWrapper.worker_devices] with
            ``threads_per_worker``. Tests pass [`InProcessRunner`][torchspark.training.InProcessRunner] (threads).
            A ``LocalProcessRunner`` of your own takes the master's ``rendezvous_timeout_s`` and
            ``shared_memory_allreduce`` and this wrapper's ``threads_per_worker`` where it leaves its own
            ``timeout_s``, ``shared_memory``, ``threads_per_worker`` None (set on both: they must be equal,
            ConfigError otherwise).
        **master_options: the options of ``training_mode``'s master (e.g. ``averaging_frequency``,
            ``save_updater``, ``worker_prefetch_num_batches``, ``overlap``, ``collect_training_stats``,
            ``rng_seed``, ``checkpoint_directory``, ``max_failures``). An option of the other mode's master, or a
            Spark-only one, is a ConfigError that lists the valid names.
    Raises:
        ConfigError: a bad value, an unknown option, or ``master=`` together with options.
    """

    def __init__(
        self,
        network: Network,
        num_workers: int | None = None,
        training_mode: str | None = None,
        master: TrainingMaster | None = None,
        *,
        devices: Sequence[str] | None = None,
        progress: bool | None = True,
        threads_per_worker: int | None = None,
        report_score_after_averaging: bool = False,
        runner: Any = None,
        **master_options: Any,
    ) -> None:
        if not isinstance(network, Network):
            raise ConfigError(f"network must be a torchspark.Network, got {type(network).__name__}")
        check_int("num_workers", num_workers, 1, allow_none=True)
        check_int("threads_per_worker", threads_per_worker, 1, allow_none=True)
        if progress not in (True, False, None):
            raise ConfigError(f"progress must be True, False or None (only on a terminal), got {progress!r}")
        check_bool("report_score_after_averaging", report_score_after_averaging)
        check_runner(runner)
        own = self.__dict__
        own.update(
            network=network,
            num_workers=num_workers,
            training_mode=training_mode,
            devices=devices,
            progress=progress,
            threads_per_worker=threads_per_worker,
            report_score_after_averaging=report_score_after_averaging,
            runner=runner,
            _options_master=master is None,
            _fits=FitAdapter("ParallelWrapper", TrainingListener, TrainingEvents),
        )
        if master is None:
            if num_workers is not None:
                master_options = {"num_workers": num_workers, **master_options}
            master = master_from_options("averaging" if training_mode is None else training_mode, master_options)
        else:
            check_local_master(
                master, master_options if training_mode is None else {"training_mode": training_mode, **master_options}
            )
        own["training_mode"] = master.kind
        wanted = master.num_workers
        if num_workers is not None and wanted is not None and num_workers != wanted:
            raise ConfigError(f"num_workers={num_workers} but the master's num_workers={wanted}; set one of them")
        own["master"] = master
        own["_devices"] = default_devices(num_workers if num_workers is not None else wanted, devices)
        if isinstance(runner, LocalProcessRunner):  # its own timeout_s against the master's: refused now, not at fit
            runner.use_master(master.rendezvous_timeout_s, master.shared_memory_allreduce, threads_per_worker)

    def __getattr__(self, name: str) -> Any:
        """The master's options read through the wrapper (``pw.averaging_frequency``)."""
        master = self.__dict__.get("master")
        if master is not None and name in {f.name for f in dataclasses.fields(master)}:
            return getattr(master, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """A master option set after construction (``pw.collect_training_stats = True``, as DL4J's setters) takes
        effect: the master built from the options is rebuilt (validated: ConfigError for a bad value). With a master
        of your own, change it there instead: setting the option here is refused rather than ignored."""
        master = self.__dict__.get("master")
        if master is None or name in self.__dict__ or name not in {f.name for f in dataclasses.fields(master)}:
            object.__setattr__(self, name, value)
            return
        if not self.__dict__["_options_master"]:
            raise ConfigError(
                f"this ParallelWrapper trains with a master of your own: set {name} on that master "
                f"(its options are the ones used), not on the wrapper"
            )
        if name in SPARK_ONLY:
            raise ConfigError(
                f"{name} only means something on Spark (workers here are local processes); train with SparkNetwork"
            )
        self.__dict__["master"] = dataclasses.replace(master, **{name: value})  # validates before anything changes

    def __repr__(self) -> str:
        return (
            f"ParallelWrapper(num_workers={len(self._devices)}, training_mode={self.training_mode!r}, "
            f"master={self.master!r})"
        )

    # ------------------------------------------------------------------ public API
    @property
    def worker_devices(self) -> list[str]:
        """The device of each worker, by rank (e.g. ``["cpu", "cpu"]``)."""
        return list(self._devices)

    @property
    def training_stats(self) -> TrainingStats | None:
        """Timings of the last fit (None unless ``collect_training_stats``)."""
        return self._fits.stats

    @property
    def last_results(self) -> list[WorkerResult]:
        """Every worker's result of the last fit, by rank."""
        return self._fits.results

    def add_progress_listener(self, listener: Callable[[ProgressUpdate], None]) -> None:
        """Call ``listener(update)`` (on a background thread) for every progress report workers send."""
        self._fits.add_progress_listener(listener)

    def add_training_listener(self, listener: TrainingListener) -> None:
        """Tell ``listener`` (a [`TrainingListener`][torchspark.listeners.TrainingListener], e.g. ``MlflowListener`` or
        ``TensorBoardListener``) about every later fit: its start, progress, epochs and end. With a listener the
        workers also report the score they agree on (as ``report_score_after_averaging`` does)."""
        self._fits.add_training_listener(listener)

    @property
    def score(self) -> float:
        """Mean over workers of their last minibatch loss in the last fit (NaN before any fit)."""
        return self._fits.score

    def fit(
        self,
        data: Any,
        epochs: int = 1,
        batch_size: int | None = None,
        run_id: str | None = None,
        restart_epoch: bool = False,
    ) -> Network:
        """Train for ``epochs`` epochs; returns the (updated in place) network.

        Args:
            data: a DataSet/MultiDataSet, or a list of them (read in order as one sequence of examples): every
                worker gets an equal share of the examples (+-1) in minibatches of ``batch_size``, as SparkNetwork
                with ``repartition_strategy="balanced"`` gives them; a list of batch-file paths
                ([`save_batches`][torchspark.save_batches] output, files of any size re-batched to ``batch_size`` and
                balanced by examples as ``SparkNetwork.fit_paths`` does, read by the workers; a directory or a
                glob names them too); or a
                one-shot iterable of DataSets (re-batched and dealt round-robin; one epoch only). PyTorch data
                (`torchspark.parallel.routing.from_torch_data`): a map-style ``Dataset``, or a ``DataLoader`` over
                one (its ``collate_fn`` used; a custom sampler refused), is read once in index order and sharded
                as a DataSet is (each worker its own seeded shard, like ``DistributedSampler``); an
                ``IterableDataset`` (or a loader over one) is streamed round-robin, one epoch a fit. Batches may be
                tensors, ``(x, y)`` tuples or dicts of named tensors (keyword inputs).
            epochs: passes over the data, all inside one launch of the workers.
            batch_size: examples per minibatch on each worker; None = a ``DataLoader``'s ``batch_size``, else the
                master's ``batch_size_per_worker`` (32 when the keyword options built the master).
            run_id: with a ``checkpoint_directory``: the run this fit continues (from its newest checkpoint, skipping
                the epochs and minibatches already done) or starts; None: a fresh run id. Resume with the same data,
                options and number of workers.
            restart_epoch: when the run resumes from a checkpoint cut inside an epoch and the data no longer matches
                it (another batch size, data size or order, which the resume checks), train that epoch again from
                its start instead of refusing (the examples it trained before the cut are trained twice). Default
                False: such a resume is refused with a ``ConfigError`` naming what changed.
        Raises:
            ConfigError: bad ``epochs`` / ``batch_size``; ``run_id`` without ``checkpoint_directory``; a resume whose
                data no longer matches the checkpoint (without ``restart_epoch``).
            DataError: empty or malformed data.
            WorkerError: a worker failed; the message holds its traceback (the root cause, not a peer's symptom).
        """
        assert self.master is not None
        if batch_size is None and isinstance(data, DataLoader) and data.batch_size is not None:
            batch_size = data.batch_size
        batch_size = self.master.batch_size_per_worker if batch_size is None else batch_size
        check_int("epochs", epochs, 1)
        check_int("batch_size", batch_size, 1)
        check_restart_epoch(restart_epoch, run_id)
        data = from_torch_data(data, batch_size, epochs)
        plan = route_data(
            data,
            len(self._devices),
            batch_size,
            epochs,
            self.master.rng_seed,
            self.network.epoch,
            self.master.drop_last,
            self.master.shuffle_scope,
        )
        check_first_batch(self.network, plan.sample)  # before any process starts
        master, first = self.master, self.network.epoch
        replayable = plan.shares.stream is None and isinstance(data, (*BATCH_TYPES, *PATH_TYPES, list, tuple))
        data_for = (
            (
                lambda n: (
                    route_data(
                        data, n, batch_size, epochs, master.rng_seed, first, master.drop_last, master.shuffle_scope
                    ).shares
                )
            )
            if replayable
            else None
        )
        return self._run(plan, epochs, run_id, data_for, restart_epoch)

    # ------------------------------------------------------------------ internals
    def _runner(self) -> Any:
        assert self.master is not None
        if isinstance(self.runner, LocalProcessRunner):  # the master's rendezvous_timeout_s, or a ConfigError
            self.runner.use_master(
                self.master.rendezvous_timeout_s, self.master.shared_memory_allreduce, self.threads_per_worker
            )
        if self.runner is not None:
            return self.runner
        threads = self.threads_per_worker or default_threads(len(self._devices))
        return LocalProcessRunner(
            self._devices, threads, self.master.rendezvous_timeout_s, shared_memory=self.master.shared_memory_allreduce
        )

    def _run(
        self,
        plan: DataPlan,
        epochs: int,
        run_id: str | None = None,
        data_for: Callable[[int], WorkerShares] | None = None,
        restart_epoch: bool = False,
    ) -> Network:
        master = self.master
        assert master is not None
        n = len(self._devices)
        self._fits.fit(
            self.network,
            master,
            self._runner(),
            plan.shares,
            epochs=epochs,
            num_workers=n,
            collect_stats=master.collect_training_stats,
            recorder=StatsCollector(DRIVER_ID, enabled=master.collect_training_stats),
            description=f"ParallelWrapper fit: {n} workers, {epochs} epoch(s)",
            run_id=run_id,
            restart_epoch=restart_epoch,
            progress=self.progress,
            report_scores=self.report_score_after_averaging,
            score_listeners=[_log_score] if self.report_score_after_averaging else [],
            total_examples=None if plan.examples is None else plan.examples * epochs,
            data_for=data_for,
        )
        return self.network
