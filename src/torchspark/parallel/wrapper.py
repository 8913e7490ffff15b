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

import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from torchspark.data import DataSet, MultiDataSet, batch_num_examples, rebatch, resolve_paths
from torchspark.encoding import AdaptiveThreshold, ResidualClipping
from torchspark.errors import ConfigError, DataError
from torchspark.listeners import TrainingEvents, TrainingListener
from torchspark.nn import Network
from torchspark.parallel.options import OPTION_DEFAULTS, TRAINING_MODES, check_local_master, master_from_options
from torchspark.parallel.feeding import WorkerShares
from torchspark.parallel.runner import LocalProcessRunner
from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.algorithms.sharing.topology import DEFAULT_SHARD_ABOVE_WORKERS
from torchspark.training.assignment import epoch_seed, per_epoch, plan_files, split_examples
from torchspark.training.config.masters import TrainingMaster
from torchspark.training.driver.adapter import FitAdapter, check_first_batch, check_runner
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.task import WorkerResult

__all__ = ["ParallelWrapper", "TRAINING_MODES", "plan_devices"]

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


def plan_devices(workers: int | None, devices: Sequence[Any] | None, gpu_count: int, cpu_count: int) -> list[str]:
    """One device per worker (a pure function of the machine's counts, so it is testable anywhere).

    Args:
        workers: worker count; None = one per listed device, else one per GPU, else one per CPU core.
        devices: devices to deal round-robin (``"cpu"``, ``"cuda"``, ``"cuda:1"``); None = every GPU, else CPU.
        gpu_count, cpu_count: what this machine has.
    Returns:
        ``workers`` device strings, e.g. ``["cuda:0", "cuda:1", "cuda:0"]`` for 3 workers on 2 GPUs.
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
    n = workers if workers is not None else (len(pool) if devices is not None or gpu_count else max(1, cpu_count))
    return [pool[i % len(pool)] for i in range(n)]


def _default_devices(workers: int | None, devices: Sequence[Any] | None = None) -> list[str]:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return plan_devices(workers, devices, gpus, os.cpu_count() or 1)


# ------------------------------------------------------------------ data routing
@dataclass
class _DataPlan:
    """The workers' shares of the data, a first minibatch to check the network against, and the examples one
    epoch trains when known (the progress bar's total)."""

    sample: Any
    shares: WorkerShares
    examples: int | None = None


def _route(data: Any, workers: int, batch_size: int, epochs: int, rng_seed: int | None,
           first_epoch: int = 0, drop_last: bool = False) -> _DataPlan:
    """Split ``data`` over the workers with the plans Spark uses: in-memory data exactly balanced by examples
    (:func:`split_examples`, Spark's ``repartition_strategy="balanced"``), batch files of any size re-batched to
    ``batch_size`` (:func:`plan_files`, Spark's ``fit_paths``)."""
    if isinstance(data, _BATCH_TYPES):
        if len(data) == 0:
            raise DataError("fit got an empty DataSet (0 examples)")
        return _feeds([data], workers, batch_size, rng_seed, epochs, first_epoch, drop_last)
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
                           first_epoch, epochs)
        total = sum(n for _, n in files)
        return _DataPlan(paths[0], WorkerShares(workers, paths=shares),
                         total // batch_size * batch_size if drop_last else total)
    if isinstance(data, (list, tuple)):
        items = _checked(data, _BATCH_TYPES, "DataSet or MultiDataSet")
        if len({type(item) for item in items}) > 1:
            raise DataError("data mixes DataSets and MultiDataSets; pass one kind (DataSet.to_multi converts)")
        if not any(len(item) for item in items):
            raise DataError("fit got no data: every DataSet in the list is empty")
        return _feeds(items, workers, batch_size, rng_seed, epochs, first_epoch, drop_last)
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
           first_epoch: int = 0, drop_last: bool = False) -> _DataPlan:
    """In-memory data: one plan replayed every epoch, or with ``rng_seed`` (past the network's first epoch, or
    over several) a new plan per epoch, as Spark's routes give them (:func:`~torchspark.training.assignment.per_epoch`),
    fed to the workers epoch by epoch."""
    if rng_seed is None or (epochs == 1 and first_epoch == 0):
        feeds = split_examples(items, batch_size, workers, rng_seed, drop_last)
        return _DataPlan(next(b for feed in feeds for b in feed), WorkerShares(workers, feeds=feeds),
                         sum(len(b) for feed in feeds for b in feed))
    plans = [split_examples(items, batch_size, workers, epoch_seed(rng_seed, first_epoch + e), drop_last)
             for e in range(epochs)]
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
@dataclass(eq=False)  # a trainer with state, compared by identity
class ParallelWrapper:
    """Train a network with several local worker processes, the Spark masters' algorithms without Spark.

    How to train is a training master, the object ``SparkNetwork`` takes: ``master=SharedTrainingMaster(...)`` or
    ``ParameterAveragingTrainingMaster(...)`` (its ``batch_size_per_worker`` is :meth:`fit`'s default batch size;
    Spark-only options such as ``export_directory`` or ``averaging_via="spark"`` are refused). Without one, the
    keyword options from ``training_mode`` to ``flush_denormal`` below build it (the effective one is
    :attr:`master`); passing both is a ConfigError.

    Args:
        network: the :class:`~torchspark.Network` to train (updated in place by :meth:`fit`).
        workers: worker processes. None = the master's ``num_workers``, else one per listed device, else one per
            GPU, else one per CPU core. Each CPU worker gets cores // workers torch threads, and every extra worker
            adds synchronisation, so on CPU try 2-4 workers before one per core.
        training_mode: ``"averaging"`` (synchronous parameter averaging, ParameterAveragingTrainingMaster) or
            ``"shared_gradients"`` (threshold-encoded gradient sharing, SharedTrainingMaster).
        averaging_frequency: minibatches per worker between averages (averaging). 1 = synchronous SGD with a
            bigger batch; 5 (default) cuts synchronisation 5x at little convergence cost; past ~20 it suffers.
        average_updaters: also average the updater state (momentum, Adam moments) (averaging). False resets it
            every round: less traffic, but adaptive updaters restart each round.
        prefetch_buffer: minibatches loaded ahead for each worker: the bounded queue a one-shot iterable is fed
            through, and the read-ahead thread for batch files. 2 hides loading; more only costs memory.
        report_score_after_averaging: log (INFO, logger ``torchspark.parallel.wrapper``, on this process) the score
            all workers agree on, live: averaging logs after every round the example-weighted mean over workers of
            their last minibatch loss in the round; gradient sharing has no averaging rounds and logs once per epoch
            the example-weighted mean loss of every minibatch of every worker (one extra small all-reduce per
            epoch). Each record carries the :class:`~torchspark.training.hooks.ScoreReport` as ``score_report``.
        threshold_algorithm: how the sharing threshold moves (``AdaptiveThreshold()``, ``FixedThreshold``...,
            or a ``to_dict()`` form). The default start is calibrated from the workers' first updates (no tuning);
            ``AdaptiveThreshold(initial=1e-4)`` is DL4J's fixed start (dense warm-up steps with Adam at lr=1e-3).
        residual_post_processor: what happens to unsent residuals; default clip to 5x threshold every 5 steps.
        shake_frequency: every this many steps also flush residuals above t/3 (0 = off; try 50-500).
        overlap: sharing exchanges step t while step t+1 computes (one step stale, faster per step, can learn
            less per step); False = synchronous (see :class:`~torchspark.spark.SharedTrainingMaster`).
        devices: devices dealt round-robin to the workers (``["cuda:0", "cuda:1"]``); default: every GPU, else
            CPU. GPUs shared by several workers, or mixed CPU/GPU, talk over gloo instead of nccl.
        progress: progress bar (examples/s, score) on this process: True, False, or None = only on a terminal.
        collect_training_stats: per-worker, per-phase timings in :attr:`training_stats` (``export_html(path)``).
        rng_seed: seeded shuffle of minibatches across workers (None keeps data order), a new order every epoch:
            the same plans as Spark's ``rng_seed`` (:mod:`torchspark.training.assignment`), so both train on
            identical per-worker sequences. In-memory data is then fed to the workers epoch by epoch.
        threads_per_worker: torch threads in each worker; None = cores // workers. Use 1 to reproduce a Spark run
            (``spark.task.cpus=1``) to the last bit.
        rendezvous_timeout_s: limit for every rendezvous/collective wait; a stuck worker fails the fit after it.
        data_timeout_s: limit for waiting on one minibatch.
        flush_denormal: flush denormal floats (below ~1.2e-38) to zero in the workers (default True): Adam's second
            moments and tiny gradients drift there after some epochs and x86 CPUs compute on them many times
            slower (measured: an MLP epoch 0.52 s -> 1.03 s after four epochs without it). False keeps IEEE
            denormals. The calling process is not touched; a plain loop there can call
            ``torch.set_flush_denormal(True)`` before its first torch operation.
        checkpoint_directory: where fits write checkpoints (a local path or any fsspec URL); None: none. A fit
            with ``run_id="r1"`` continues run ``r1`` from its newest checkpoint, in this or a new process (see
            the training master's option of the same name).
        checkpoint_every: averaging rounds / sharing iterations between checkpoints; None: once per epoch.
        keep_checkpoints: the newest checkpoints kept per run (default 2).
        max_failures: worker processes lost mid-fit (killed, out of memory, stopped responding) that a fit
            survives by relaunching the workers from the newest checkpoint, else from the fit's start (default 3;
            0 = fail at the first). Errors in the model or data are never retried.
        drop_last: train only full minibatches of ``batch_size`` (the remainder is not trained), as
            ``DataLoader(drop_last=True)``; see the master's ``drop_last``.
        on_divergence: gradient sharing: ``"fail"`` (default) or ``"warn"`` when an update explodes or is not
            finite (see ``SharedTrainingMaster.on_divergence``).
        max_staleness: gradient sharing: None (default) = synchronous exchange; an integer ``k >= 0`` =
            bounded-staleness asynchronous sharing, where a worker waits only when it is more than ``k`` steps ahead
            of its slowest peer and the replicas are averaged at the end (see
            ``SharedTrainingMaster.max_staleness``; not with ``overlap=False`` or ``checkpoint_directory``).
        topology: gradient sharing's exchange: ``"all_gather"``, ``"sharded"`` (reduce-scatter by index shards
            then all-gather of the sums: receive bytes ~ ``min(N*m, dense)`` instead of ``N*m``, decode work / N)
            or ``"auto"`` (default: sharded above ``shard_above_workers`` workers); see
            ``SharedTrainingMaster.topology``.
        shard_above_workers: the worker count above which ``topology="auto"`` shards (default 128).
        master: the training master (instead of the options above).
        runner: how workers run (a :class:`~torchspark.training.driver.runner.Runner`); default: a
            :class:`~torchspark.parallel.runner.LocalProcessRunner` on :attr:`worker_devices` with
            ``threads_per_worker``. Tests pass :class:`~torchspark.training.driver.runner.InProcessRunner` (threads).
    """

    network: Network
    workers: int | None = None
    training_mode: str = "averaging"
    averaging_frequency: int = 5
    average_updaters: bool = True
    prefetch_buffer: int = 2
    report_score_after_averaging: bool = False
    threshold_algorithm: Any = field(default_factory=AdaptiveThreshold)
    residual_post_processor: Any = field(default_factory=ResidualClipping)
    shake_frequency: int = 0
    overlap: bool = True
    devices: Sequence[str] | None = None
    progress: bool | None = True
    collect_training_stats: bool = False
    rng_seed: int | None = None
    threads_per_worker: int | None = None
    rendezvous_timeout_s: float = 300.0
    data_timeout_s: float = 600.0
    flush_denormal: bool = True
    checkpoint_directory: str | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = 2
    max_failures: int = 3
    drop_last: bool = False
    on_divergence: str = "fail"
    max_staleness: int | None = None
    topology: str = "auto"
    shard_above_workers: int = DEFAULT_SHARD_ABOVE_WORKERS
    master: TrainingMaster | None = None
    runner: Any = None
    _devices: list[str] = field(default_factory=list, init=False, repr=False)
    _fits: FitAdapter = field(default_factory=lambda: FitAdapter("ParallelWrapper", TrainingListener, TrainingEvents),
                              init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.network, Network):
            raise ConfigError(f"network must be a torchspark.Network, got {type(self.network).__name__}")
        for name, optional in (("workers", True), ("prefetch_buffer", False), ("threads_per_worker", True)):
            value = getattr(self, name)
            if optional and value is None:
                continue
            # prefetch_buffer also bounds the queue a one-shot iterable is fed through: at least one minibatch
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1{' or None' if optional else ''}, got {value!r}")
        if self.progress not in (True, False, None):
            raise ConfigError(f"progress must be True, False or None (only on a terminal), got {self.progress!r}")
        if not isinstance(self.report_score_after_averaging, bool):
            raise ConfigError(f"report_score_after_averaging must be True or False, got "
                              f"{self.report_score_after_averaging!r}")
        check_runner(self.runner)
        options = {name: getattr(self, name) for name in OPTION_DEFAULTS}
        object.__setattr__(self, "_options_master", self.master is None)
        if self.master is None:
            self.master = master_from_options(options)
            for name in ("threshold_algorithm", "residual_post_processor"):  # their dict forms, as policy objects
                if hasattr(self.master, name):
                    setattr(self, name, getattr(self.master, name))
        else:
            check_local_master(self.master, options)
        wanted = self.master.num_workers
        if self.workers is not None and wanted is not None and self.workers != wanted:
            raise ConfigError(f"workers={self.workers} but the master's num_workers={wanted}; set one of them")
        self._devices = _default_devices(self.workers if self.workers is not None else wanted, self.devices)

    def __setattr__(self, name: str, value: Any) -> None:
        """Options set after construction (``pw.collect_training_stats = True``, as DL4J's setters) take effect:
        the master built from the options is rebuilt (and validated, ConfigError for a bad value). With a master of
        your own, change it there instead: setting the option here is refused rather than ignored."""
        if name not in OPTION_DEFAULTS or "_options_master" not in self.__dict__:  # __init__, or not an option
            object.__setattr__(self, name, value)
            return
        if not self.__dict__["_options_master"]:
            raise ConfigError(f"this ParallelWrapper trains with a master of your own: set {name} on that master "
                              f"(its options are the ones used), not on the wrapper")
        options = {option: (value if option == name else getattr(self, option)) for option in OPTION_DEFAULTS}
        master = master_from_options(options)  # validates the new value before anything changes
        object.__setattr__(self, name, value)
        object.__setattr__(self, "master", master)

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

    def get_score(self) -> float:
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
        for name, value in (("epochs", epochs), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        plan = _route(data, len(self._devices), batch_size, epochs, self.master.rng_seed, self.network.epoch,
                      self.master.drop_last)
        check_first_batch(self.network, plan.sample)  # before any process starts
        return self._run(plan, epochs, run_id)

    # ------------------------------------------------------------------ internals
    def _runner(self) -> Any:
        if self.runner is not None:
            return self.runner
        assert self.master is not None
        threads = self.threads_per_worker or max(1, (os.cpu_count() or 1) // len(self._devices))
        return LocalProcessRunner(self._devices, threads, self.master.rendezvous_timeout_s,
                                  shared_memory=self.master.shared_memory_allreduce)

    def _run(self, plan: _DataPlan, epochs: int, run_id: str | None = None) -> Network:
        master = self.master
        assert master is not None
        n = len(self._devices)
        self._fits.fit(self.network, master, self._runner(), plan.shares, epochs=epochs, num_workers=n,
                       collect_stats=master.collect_training_stats,
                       recorder=StatsCollector(DRIVER_ID, enabled=master.collect_training_stats),
                       description=f"ParallelWrapper fit: {n} workers, {epochs} epoch(s)", run_id=run_id,
                       progress=self.progress, report_scores=self.report_score_after_averaging,
                       score_listeners=[_log_score] if self.report_score_after_averaging else [],
                       total_examples=None if plan.examples is None else plan.examples * epochs)
        return self.network
