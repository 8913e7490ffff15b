"""``ParallelWrapper``: the Spark training masters' algorithms on one machine, without Spark.

DL4J sent single-box users (many cores, several GPUs) to ParallelWrapper: the same algorithms with less overhead,
and a way to try on a laptop the configuration that will run on the cluster. Workers are spawned processes that
run the very same worker loop, codec and averaging code as the Spark masters (:func:`run_worker`), connected by
``torch.distributed`` (gloo on CPU, nccl on CUDA).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from torchspark.data import DataSet, MultiDataSet
from torchspark.encoding import AdaptiveThreshold, EncoderConfig, ResidualClipping
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network, NetworkBlueprint
from torchspark.parallel.runner import LocalProcessRunner
from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.assignment import split_for_workers
from torchspark.training.averaging import AveragingSettings
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.progress import ProgressBar, ProgressServer
from torchspark.training.reporting import build_training_stats
from torchspark.training.sharing import SharingSettings
from torchspark.training.worker import WorkerResult, WorkerTask, merge_results

__all__ = ["ParallelWrapper", "TRAINING_MODES"]

log = logging.getLogger(__name__)

#: ParallelWrapper's training modes and the worker algorithm each runs.
TRAINING_MODES = {"averaging": "averaging", "shared_gradients": "sharing"}


def _default_devices(workers: int | None) -> list[str]:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if workers is None:
        return [f"cuda:{i}" for i in range(gpus)] if gpus else ["cpu"] * (os.cpu_count() or 1)
    return [f"cuda:{i % gpus}" for i in range(workers)] if gpus else ["cpu"] * workers


@dataclass
class ParallelWrapper:
    """Train a network with several local worker processes.

    Args:
        network: the :class:`~torchspark.Network` to train (updated in place by :meth:`fit`).
        workers: number of worker processes; None = one per GPU when there are GPUs, else one per core.
        training_mode: ``"averaging"`` (synchronous parameter averaging) or ``"shared_gradients"``
            (threshold-encoded gradient sharing with residuals).
        averaging_frequency: minibatches per worker between averages (averaging mode). DL4J's default here is 1;
            5 trades a little convergence for far less synchronisation.
        average_updaters: also average the updater state (averaging mode).
        prefetch_buffer: minibatches queued ahead for each worker.
        report_score_after_averaging: log the averaged score after each fit.
        threshold_algorithm, residual_post_processor, shake_frequency: the gradient-sharing encoder (see
            :mod:`torchspark.encoding`); defaults as in DL4J (adaptive threshold from 1e-4, clip to 5x threshold
            every 5 steps, no shake-up).
        overlap: gradient sharing exchanges step t while step t+1 computes (one step of staleness).
        devices: devices assigned round-robin to workers (``"cpu"``, ``"cuda:0"``...); default as ``workers``.
        progress: progress bar on this process (None = only on a terminal).
        collect_training_stats: per-phase timings in :attr:`training_stats`.
        rng_seed: shuffles minibatches across workers (None keeps data order) — the same plan as Spark's.
        rendezvous_timeout_s: limit for every rendezvous/collective wait.
        data_timeout_s: limit for waiting on one minibatch.
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
    progress: bool | None = None
    collect_training_stats: bool = False
    rng_seed: int | None = None
    rendezvous_timeout_s: float = 300.0
    data_timeout_s: float = 600.0
    training_stats: TrainingStats | None = field(default=None, init=False)
    last_results: list[WorkerResult] = field(default_factory=list, init=False)
    _listeners: list[Callable[[ProgressUpdate], None]] = field(default_factory=list, init=False)
    _score: float = field(default=math.nan, init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.network, Network):
            raise ConfigError(f"network must be a torchspark.Network, got {type(self.network).__name__}")
        if self.training_mode not in TRAINING_MODES:
            raise ConfigError(f"training_mode must be one of {list(TRAINING_MODES)}, got {self.training_mode!r}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise ConfigError(f"workers must be an integer >= 1 or None, got {self.workers!r}")
        for name in ("averaging_frequency", "prefetch_buffer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.devices is not None:
            if not self.devices:
                raise ConfigError("devices must list at least one device, e.g. ['cpu'] or ['cuda:0', 'cuda:1']")
            n = self.workers or len(self.devices)
            self.devices = [str(self.devices[i % len(self.devices)]) for i in range(n)]
            for d in self.devices:
                torch.device(d)  # raises on nonsense like "gpu7"
        # the encoder settings are validated now, not inside the workers
        self._settings()

    # ------------------------------------------------------------------ public API
    def add_progress_listener(self, listener: Callable[[ProgressUpdate], None]) -> None:
        """Call ``listener(update)`` for every progress report the workers send while training."""
        self._listeners.append(listener)

    def fit(self, data: Any, epochs: int = 1, batch_size: int = 32) -> Network:
        """Train for ``epochs`` epochs; returns the trained network.

        Args:
            data: a DataSet/MultiDataSet (split into minibatches of ``batch_size``), a list of them (used as they
                come), a one-shot iterable of them (dealt round-robin, one epoch), or a list of batch-file paths
                (read by the workers themselves).
        """
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ConfigError(f"epochs must be an integer >= 1, got {epochs!r}")
        devices = list(self.devices) if self.devices else _default_devices(self.workers)
        n = len(devices)
        feeds = paths = stream = None
        if isinstance(data, (DataSet, MultiDataSet)):
            feeds = split_for_workers(data.split(batch_size), n, self.rng_seed)
        elif isinstance(data, (list, tuple)) and data and all(isinstance(x, str) for x in data):
            paths = split_for_workers(list(data), n, self.rng_seed)
        elif isinstance(data, (list, tuple)):
            for i, item in enumerate(data):
                if not isinstance(item, (DataSet, MultiDataSet)):
                    raise DataError(f"data[{i}] is a {type(item).__name__}; expected DataSet, MultiDataSet or a path")
            feeds = split_for_workers(list(data), n, self.rng_seed)
        elif isinstance(data, Iterable):
            if epochs > 1:
                raise ConfigError("a one-shot iterable can be trained for one epoch only; pass a list or a DataSet")
            stream = data
        else:
            raise DataError(f"cannot train on a {type(data).__name__}; pass a DataSet, a list of them or of paths")
        if (feeds is not None and not any(feeds)) or (paths is not None and not any(paths)):
            raise DataError("fit got no data: the DataSet or list is empty")
        return self._run(devices, epochs, feeds, paths, stream)

    # ------------------------------------------------------------------ internals
    def _settings(self) -> tuple[str, dict[str, Any]]:
        mode = TRAINING_MODES[self.training_mode]
        if mode == "averaging":
            return mode, vars(AveragingSettings(self.averaging_frequency, self.average_updaters)).copy()
        encoder = EncoderConfig(threshold_policy=self.threshold_algorithm,
                                residual_post_processor=self.residual_post_processor,
                                shake_frequency=self.shake_frequency)
        return mode, SharingSettings(encoder=encoder, overlap=self.overlap).to_dict()

    def _run(self, devices: list[str], epochs: int, feeds: Any, paths: Any, stream: Any) -> Network:
        driver = StatsCollector(DRIVER_ID, enabled=self.collect_training_stats)
        mode, settings = self._settings()
        with driver.phase("broadcast"):
            task = WorkerTask(mode=mode, settings=settings, blueprint=NetworkBlueprint.of(self.network).to_bytes(),
                              epochs=epochs, prefetch=self.prefetch_buffer, data_timeout_s=self.data_timeout_s,
                              collect_stats=self.collect_training_stats)
        cpu_workers = sum(1 for d in devices if d == "cpu")
        threads = max(1, (os.cpu_count() or 1) // max(1, cpu_workers))
        server = ProgressServer(host="127.0.0.1", listeners=self._listeners).start()
        bar = ProgressBar(desc=f"fit x{epochs}", enabled=self.progress)
        server.add_listener(bar.update)
        runner = LocalProcessRunner(devices, threads, self.rendezvous_timeout_s, self.prefetch_buffer,
                                    server.address)
        try:
            with driver.phase("fit"):
                results = runner.run(task, feeds=feeds, paths=paths, stream=stream)
        finally:
            bar.close()
            server.close()
        with driver.phase("aggregation"):
            score = merge_results(self.network, results)
        self.network.epoch += epochs
        self.last_results = results
        if self.report_score_after_averaging and not math.isnan(score):
            log.info("score after fit: %.6f", score)
        self._score = score
        self.training_stats = (build_training_stats(driver, results, epochs, self.network.extra_config)
                               if self.collect_training_stats else None)
        return self.network

    def get_score(self) -> float:
        """Mean over workers of their last minibatch loss in the last fit."""
        return self._score
