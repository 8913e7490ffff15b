"""``ParallelWrapper``: the Spark training masters' algorithms on one machine, without Spark.

DL4J sent single-box users (many cores, several GPUs) to ParallelWrapper: the same algorithms with less overhead,
and a way to try on a laptop the configuration that will run on the cluster. Workers are separate processes that
run the very same worker loop, codec and averaging code as the Spark masters (:func:`run_worker`), connected by
``torch.distributed`` (gloo on CPU, nccl on distinct GPUs); :class:`LocalProcessRunner` supervises them.

Workers are started by a fork server with torch preloaded (``spawn`` where the platform has no fork server): never
forked from the calling process, so its threads, CUDA context and locks are not inherited. Like ``spawn``, this
means a script that calls :meth:`ParallelWrapper.fit` at top level needs the ``if __name__ == "__main__":`` guard,
and custom modules must be importable (defined in a module, not in ``__main__`` of an interactive session).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchspark.data import DataSet, MultiDataSet, batch_num_examples, rebatch, resolve_paths
from torchspark.errors import ConfigError, DataError
from torchspark.listeners import TrainingEvents, TrainingListener
from torchspark.nn import Network
from torchspark.parallel.feeding import WorkerShares
from torchspark.parallel.options import SPARK_ONLY, check_local_master, master_from_options
from torchspark.parallel.runner import LocalProcessRunner
from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.assignment import (
    check_global_plan_size,
    epoch_seed,
    per_epoch,
    plan_files,
    split_examples,
)
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.adapter import FitAdapter, check_first_batch, check_runner
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.task import WorkerResult
from torchspark.validation import check_bool, check_int

__all__ = ["ParallelWrapper", "plan_devices"]

log = logging.getLogger(__name__)

_BATCH_TYPES = (DataSet, MultiDataSet)
_PATH_TYPES = (str, os.PathLike)


# ------------------------------------------------------------------ devices
def _parse_device(value: Any, gpu_count: int, index: int) -> str:
    text = str(value).strip() if isinstance(value, (str, torch.device)) else None
    if text == "cpu":
        return "cpu"
    if text is not None and (text == "cuda" or text.startswith("cuda:")):
        gpu = text.partition(":")[2] or "0"
        if not gpu.isdigit():
            raise ConfigError(f"devices[{index}]={value!r} is not a device; use 'cuda:<index>', e.g. 'cuda:0'")
        if int(gpu) >= gpu_count:
            fix = f"use cuda:0..cuda:{gpu_count - 1}" if gpu_count else "use devices=['cpu']"
            raise ConfigError(f"devices[{index}]={value!r} but torch sees {gpu_count} CUDA GPU(s) here; {fix}")
        return f"cuda:{int(gpu)}"
    raise ConfigError(f"devices[{index}]={value!r} is not a device ParallelWrapper can train on; use 'cpu' or "
                      "'cuda:<index>'")


def plan_devices(num_workers: int | None, devices: Sequence[Any] | None, gpu_count: int, cpu_count: int) -> list[str]:
    """One device per worker (a pure function of the machine's counts, so it is testable anywhere).

    Args:
        num_workers: worker count; None = one per listed device, else one per GPU, else one per CPU core.
        devices: devices to deal round-robin (``"cpu"``, ``"cuda"``, ``"cuda:1"``); None = every GPU, else CPU.
        gpu_count, cpu_count: what this machine has.
    Returns:
        ``num_workers`` device strings, e.g. ``["cuda:0", "cuda:1", "cuda:0"]`` for 3 workers on 2 GPUs.
    Raises:
        ConfigError: an unknown device name, a GPU index this machine lacks, or an empty ``devices`` list.
    """
    if devices is not None:
        if isinstance(devices, (str, torch.device)) or len(devices) == 0:
            raise ConfigError(f"devices must be a non-empty list such as ['cpu'] or ['cuda:0', 'cuda:1'], got "
                              f"{devices!r}")
        pool = [_parse_device(d, gpu_count, i) for i, d in enumerate(devices)]
    else:
        pool = [f"cuda:{i}" for i in range(gpu_count)] or ["cpu"]
    n = num_workers
    if n is None:
        n = len(pool) if devices is not None or gpu_count else max(1, cpu_count)
    return [pool[i % len(pool)] for i in range(n)]


def _default_devices(num_workers: int | None, devices: Sequence[Any] | None = None) -> list[str]:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return plan_devices(num_workers, devices, gpus, os.cpu_count() or 1)


# ------------------------------------------------------------------ data routing
@dataclass
class _DataPlan:
    """The workers' shares of the data, a first minibatch to check the network against, and the examples one
    epoch trains when known (the progress bar's total)."""

    sample: Any
    shares: WorkerShares
    examples: int | None = None


def _route(data: Any, workers: int, batch_size: int, epochs: int, rng_seed: int | None,
           first_epoch: int = 0, drop_last: bool = False, scope: str = "worker") -> _DataPlan:
    """Split ``data`` over the workers with the plans Spark uses: in-memory data exactly balanced by examples
    (:func:`split_examples`, Spark's ``repartition_strategy="balanced"``), batch files of any size re-batched to
    ``batch_size`` (:func:`plan_files`, Spark's ``fit_paths``)."""
    if isinstance(data, _BATCH_TYPES):
        if len(data) == 0:
            raise DataError("fit got an empty DataSet (0 examples)")
        return _feeds([data], workers, batch_size, rng_seed, epochs, first_epoch, drop_last, scope)
    if isinstance(data, _PATH_TYPES):  # a directory, a glob or one batch file
        data = resolve_paths(data)
    if isinstance(data, bytes):
        raise DataError("data is bytes; pass a DataSet, a list of them, or batch-file paths (load the bytes with "
                        "torchspark.data.dataset_from_bytes)")
    if not isinstance(data, Iterable):
        raise DataError(f"cannot train on a {type(data).__name__}; pass a DataSet, a list of DataSets or a list of "
                        "batch-file paths (for Spark RDDs and DataFrames use SparkNetwork)")
    items = iter(data)
    first = next(items, None)
    if first is None:
        raise DataError("fit got no data: the list or iterable is empty")
    if isinstance(first, _PATH_TYPES):  # paths are cheap: always materialised, so any epochs work
        paths = _checked(itertools.chain([first], items), _PATH_TYPES, "batch-file path")
        files = [(os.fspath(p), batch_num_examples(os.fspath(p))) for p in paths]  # re-batched, as fit_paths
        shares = per_epoch(lambda s: plan_files(files, batch_size, workers, s, drop_last=drop_last), workers, rng_seed,
                           first_epoch, epochs, scope)
        total = sum(n for _, n in files)
        return _DataPlan(paths[0], WorkerShares(workers, paths=shares),
                         total // batch_size * batch_size if drop_last else total)
    if isinstance(data, (list, tuple)):
        batches = _checked(data, _BATCH_TYPES, "DataSet or MultiDataSet")
        if len({type(item) for item in batches}) > 1:
            raise DataError("data mixes DataSets and MultiDataSets; pass one kind (DataSet.to_multi converts)")
        if not any(len(item) for item in batches):
            raise DataError("fit got no data: every DataSet in the list is empty")
        return _feeds(batches, workers, batch_size, rng_seed, epochs, first_epoch, drop_last, scope)
    if epochs != 1:
        raise ConfigError(f"a one-shot iterable ({type(data).__name__}) trains one epoch only, got epochs={epochs}; "
                          "pass a list (e.g. list(data)) or a DataSet to train several epochs")
    if drop_last:
        raise ConfigError(f"drop_last=True needs data whose size is known before training (a DataSet, a list of them "
                          f"or of batch-file paths), got a one-shot {type(data).__name__}; pass list(data)")
    if not isinstance(first, _BATCH_TYPES):
        raise DataError(f"data[0] is a {type(first).__name__}; expected a DataSet, MultiDataSet or batch-file path")
    return _DataPlan(first, WorkerShares(workers, stream=rebatch(itertools.chain([first], items), batch_size)))


def _feeds(items: Sequence[Any], workers: int, batch_size: int, rng_seed: int | None, epochs: int = 1,
           first_epoch: int = 0, drop_last: bool = False, scope: str = "worker") -> _DataPlan:
    """In-memory data: one plan replayed every epoch (each worker reorders its share every epoch with
    ``rng_seed``), or with ``scope="global"`` and ``rng_seed`` (past the network's first epoch, or over several) a new
    plan per epoch, as Spark's routes give them (:func:`~torchspark.training.assignment.per_epoch`), fed to the
    workers epoch by epoch."""
    if rng_seed is None or scope == "worker" or (epochs == 1 and first_epoch == 0):
        feeds = split_examples(items, batch_size, workers, rng_seed, drop_last)
        return _DataPlan(next(b for feed in feeds for b in feed), WorkerShares(workers, feeds=feeds),
                         sum(len(b) for feed in feeds for b in feed))
    first = split_examples(items, batch_size, workers, epoch_seed(rng_seed, first_epoch), drop_last)
    check_global_plan_size(sum(len(feed) for feed in first), epochs)
    plans = [first] + [split_examples(items, batch_size, workers, epoch_seed(rng_seed, first_epoch + e), drop_last)
                       for e in range(1, epochs)]
    sample = next(b for feed in plans[0] for b in feed)
    return _DataPlan(sample, WorkerShares(workers, epoch_feeds=plans, first_epoch=first_epoch),
                     sum(len(b) for feed in plans[0] for b in feed))


def _checked(items: Iterable[Any], types: tuple[type, ...], what: str) -> list[Any]:
    out = list(items)
    for i, item in enumerate(out):
        if not isinstance(item, types):
            raise DataError(f"data[{i}] is a {type(item).__name__}; every item must be a {what} (do not mix them)")
    return out


def _log_score(report: ScoreReport) -> None:
    """The ``report_score_after_averaging`` log line (a progress-server listener, on this process)."""
    if report.round is None:
        log.info("epoch %d: mean score over all workers' minibatches %.6f (%d examples)", report.epoch,
                 report.score, report.examples, extra={"score_report": report})
    else:
        log.info("epoch %d, averaging round %d: averaged score %.6f (%d examples)", report.epoch, report.round,
                 report.score, report.examples, extra={"score_report": report})


# ------------------------------------------------------------------ the wrapper
class ParallelWrapper:
    """Train a network with several local worker processes, the Spark masters' algorithms without Spark.

    How to train is a training master, the object ``SparkNetwork`` takes: ``master=SharedTrainingMaster(...)`` or
    ``ParameterAveragingTrainingMaster(...)`` (its ``batch_size_per_worker`` is :meth:`fit`'s default batch size;
    Spark-only options such as ``export_directory`` or ``averaging_via="spark"`` are refused). Without one,
    ``training_mode`` names the master and the other keyword options are that master's own options, by the master's
    own names, defaults and documentation (:class:`~torchspark.training.config.masters.TrainingMaster`,
    :class:`~torchspark.training.config.masters.ParameterAveragingTrainingMaster`,
    :class:`~torchspark.training.config.shared_master.SharedTrainingMaster`; ``batch_size_per_worker`` defaults to
    32 here). The effective master is :attr:`master`; its options read through the wrapper (``pw.rng_seed``), and
    setting one on a wrapper whose options built the master rebuilds it (validated). Passing ``master=`` and options
    is a ConfigError.

    Example::

        pw = ParallelWrapper(net, num_workers=2, training_mode="sharing", overlap=False, rng_seed=0)
        pw.fit(train, epochs=3, batch_size=32)

    Args:
        network: the :class:`~torchspark.Network` to train (updated in place by :meth:`fit`).
        num_workers: worker processes. None = the master's ``num_workers``, else one per listed device, else one per
            GPU, else one per CPU core. Each CPU worker gets cores // workers torch threads, and every extra worker
            adds synchronisation, so on CPU try 2-4 workers before one per core.
        training_mode: ``"averaging"`` (default: synchronous parameter averaging, ParameterAveragingTrainingMaster)
            or ``"sharing"`` (threshold-encoded gradient sharing, SharedTrainingMaster); with ``master=``, the
            master's (:attr:`training_mode` reads it).
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
            epoch). Each record carries the :class:`~torchspark.training.hooks.ScoreReport` as ``score_report``.
        runner: how workers run (a :class:`~torchspark.training.driver.runner.Runner`); default: a
            :class:`~torchspark.parallel.runner.LocalProcessRunner` on :attr:`worker_devices` with
            ``threads_per_worker``. Tests pass :class:`~torchspark.training.driver.runner.InProcessRunner` (threads).
            A ``LocalProcessRunner`` of your own takes the master's ``rendezvous_timeout_s`` (its ``timeout_s``, if
            set, must equal it: ConfigError otherwise).
        **master_options: the options of ``training_mode``'s master (e.g. ``averaging_frequency``,
            ``save_updater``, ``worker_prefetch_num_batches``, ``overlap``, ``collect_training_stats``,
            ``rng_seed``, ``checkpoint_directory``, ``max_failures``). An option of the other mode's master, or a
            Spark-only one, is a ConfigError that lists the valid names.
    Raises:
        ConfigError: a bad value, an unknown option, or ``master=`` together with options.
    """

    def __init__(self, network: Network, num_workers: int | None = None, training_mode: str | None = None,
                 master: TrainingMaster | None = None, *, devices: Sequence[str] | None = None,
                 progress: bool | None = True, threads_per_worker: int | None = None,
                 report_score_after_averaging: bool = False, runner: Any = None, **master_options: Any) -> None:
        if not isinstance(network, Network):
            raise ConfigError(f"network must be a torchspark.Network, got {type(network).__name__}")
        check_int("num_workers", num_workers, 1, allow_none=True)
        check_int("threads_per_worker", threads_per_worker, 1, allow_none=True)
        if progress not in (True, False, None):
            raise ConfigError(f"progress must be True, False or None (only on a terminal), got {progress!r}")
        check_bool("report_score_after_averaging", report_score_after_averaging)
        check_runner(runner)
        own = self.__dict__
        own.update(network=network, num_workers=num_workers, training_mode=training_mode, devices=devices,
                   progress=progress, threads_per_worker=threads_per_worker,
                   report_score_after_averaging=report_score_after_averaging, runner=runner,
                   _options_master=master is None,
                   _fits=FitAdapter("ParallelWrapper", TrainingListener, TrainingEvents))
        if master is None:
            if num_workers is not None:
                master_options = {"num_workers": num_workers, **master_options}
            master = master_from_options("averaging" if training_mode is None else training_mode, master_options)
        else:
            check_local_master(master, master_options if training_mode is None else
                               {"training_mode": training_mode, **master_options})
        own["training_mode"] = master.kind
        wanted = master.num_workers
        if num_workers is not None and wanted is not None and num_workers != wanted:
            raise ConfigError(f"num_workers={num_workers} but the master's num_workers={wanted}; set one of them")
        own["master"] = master
        own["_devices"] = _default_devices(num_workers if num_workers is not None else wanted, devices)
        if isinstance(runner, LocalProcessRunner):  # its own timeout_s against the master's: refused now, not at fit
            runner.use_master_timeout(master.rendezvous_timeout_s)

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
            raise ConfigError(f"this ParallelWrapper trains with a master of your own: set {name} on that master "
                              f"(its options are the ones used), not on the wrapper")
        if name in SPARK_ONLY:
            raise ConfigError(f"{name} only means something on Spark (workers here are local processes); train "
                              "with SparkNetwork")
        self.__dict__["master"] = dataclasses.replace(master, **{name: value})  # validates before anything changes

    def __repr__(self) -> str:
        return (f"ParallelWrapper(num_workers={len(self._devices)}, training_mode={self.training_mode!r}, "
                f"master={self.master!r})")

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
        """Tell ``listener`` (a :class:`~torchspark.listeners.TrainingListener`, e.g. ``MlflowListener`` or
        ``TensorBoardListener``) about every later fit: its start, progress, epochs and end. With a listener the
        workers also report the score they agree on (as ``report_score_after_averaging`` does)."""
        self._fits.add_training_listener(listener)

    @property
    def score(self) -> float:
        """Mean over workers of their last minibatch loss in the last fit (NaN before any fit)."""
        return self._fits.score

    def fit(self, data: Any, epochs: int = 1, batch_size: int | None = None, run_id: str | None = None) -> Network:
        """Train for ``epochs`` epochs; returns the (updated in place) network.

        Args:
            data: a DataSet/MultiDataSet, or a list of them (read in order as one sequence of examples): every
                worker gets an equal share of the examples (+-1) in minibatches of ``batch_size``, as SparkNetwork
                with ``repartition_strategy="balanced"`` gives them; a list of batch-file paths
                (:func:`~torchspark.data.save_batches` output, files of any size re-batched to ``batch_size`` and
                balanced by examples as ``SparkNetwork.fit_paths`` does, read by the workers; a directory or a
                glob names them too); or a
                one-shot iterable of DataSets (re-batched and dealt round-robin; one epoch only).
            epochs: passes over the data, all inside one launch of the workers.
            batch_size: examples per minibatch on each worker; None = the master's ``batch_size_per_worker`` (32
                when the keyword options built the master).
            run_id: with a ``checkpoint_directory``: the run this fit continues (from its newest checkpoint, skipping
                the epochs and minibatches already done) or starts; None: a fresh run id. Resume with the same data,
                options and number of workers.
        Raises:
            ConfigError: bad ``epochs`` / ``batch_size``; ``run_id`` without ``checkpoint_directory``.
            DataError: empty or malformed data.
            WorkerError: a worker failed; the message holds its traceback (the root cause, not a peer's symptom).
        """
        assert self.master is not None
        batch_size = self.master.batch_size_per_worker if batch_size is None else batch_size
        check_int("epochs", epochs, 1)
        check_int("batch_size", batch_size, 1)
        plan = _route(data, len(self._devices), batch_size, epochs, self.master.rng_seed, self.network.epoch,
                      self.master.drop_last, self.master.shuffle_scope)
        check_first_batch(self.network, plan.sample)  # before any process starts
        master, first = self.master, self.network.epoch
        replayable = plan.shares.stream is None and isinstance(data, (*_BATCH_TYPES, *_PATH_TYPES, list, tuple))
        data_for = (lambda n: _route(data, n, batch_size, epochs, master.rng_seed, first, master.drop_last,
                                     master.shuffle_scope).shares) if replayable else None
        return self._run(plan, epochs, run_id, data_for)

    # ------------------------------------------------------------------ internals
    def _runner(self) -> Any:
        assert self.master is not None
        if isinstance(self.runner, LocalProcessRunner):  # the master's rendezvous_timeout_s, or a ConfigError
            self.runner.use_master_timeout(self.master.rendezvous_timeout_s)
        if self.runner is not None:
            return self.runner
        threads = self.threads_per_worker or max(1, (os.cpu_count() or 1) // len(self._devices))
        return LocalProcessRunner(self._devices, threads, self.master.rendezvous_timeout_s,
                                  shared_memory=self.master.shared_memory_allreduce)

    def _run(self, plan: _DataPlan, epochs: int, run_id: str | None = None,
             data_for: Callable[[int], WorkerShares] | None = None) -> Network:
        master = self.master
        assert master is not None
        n = len(self._devices)
        self._fits.fit(self.network, master, self._runner(), plan.shares, epochs=epochs, num_workers=n,
                       collect_stats=master.collect_training_stats,
                       recorder=StatsCollector(DRIVER_ID, enabled=master.collect_training_stats),
                       description=f"ParallelWrapper fit: {n} workers, {epochs} epoch(s)", run_id=run_id,
                       progress=self.progress, report_scores=self.report_score_after_averaging,
                       score_listeners=[_log_score] if self.report_score_after_averaging else [],
                       total_examples=None if plan.examples is None else plan.examples * epochs, data_for=data_for)
        return self.network
