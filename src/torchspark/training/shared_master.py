"""``SharedTrainingMaster``: threshold-encoded gradient sharing (DL4J's SharedTrainingMaster).

Every worker computes its updater's step on its own minibatch, threshold-encodes it against a residual and
exchanges the sparse message with all workers over ``torch.distributed`` (inside one Spark barrier stage, or
between ``ParallelWrapper``'s worker processes); every
replica applies the same sum of messages, so the replicas stay identical without averaging parameters. The worker
loop is :mod:`torchspark.training.sharing`; this module is only its validated, JSON-serialisable configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torchspark.encoding import (
    AdaptiveThreshold,
    EncoderConfig,
    ResidualClipping,
    ResidualPostProcessor,
    ThresholdPolicy,
    residual_post_processor_from_dict,
    threshold_policy_from_dict,
)
from torchspark.errors import ConfigError
from torchspark.training.masters import TrainingMaster, register_master
from torchspark.training.sharing import SharingSettings

__all__ = ["SharedTrainingMaster"]


def _policy(name: str, value: Any, from_dict: Any, methods: tuple[str, ...], example: str) -> Any:
    if isinstance(value, dict):
        return from_dict(value)
    if all(callable(getattr(value, m, None)) for m in methods) and dataclasses.is_dataclass(value):
        return value
    raise ConfigError(f"SharedTrainingMaster: {name} must be a policy object such as {example} or its to_dict() "
                      f"form, got {value!r}")


@register_master
@dataclass(frozen=True)
class SharedTrainingMaster(TrainingMaster):
    """Gradient sharing with threshold-encoded sparse updates and residuals (Strom 2015).

    Traffic per worker and step is a few bytes per parameter that changed by more than the threshold, instead of
    4 bytes per parameter: typically 100-1000x less than dense exchange. Use it when communication dominates (big
    models, slow networks); for tiny models on one machine the per-step exchange latency dominates instead.

    Args:
        threshold_algorithm: how the encoding threshold moves (:class:`~torchspark.encoding.AdaptiveThreshold`,
            :class:`~torchspark.encoding.FixedThreshold`, :class:`~torchspark.encoding.TargetSparsityThreshold`, or
            their ``to_dict()`` form). Default ``AdaptiveThreshold()`` (start 1e-4, sparsity band [1e-4, 1e-2]).
            The start should be near the size of the updater's steps times ~10: with Adam at lr=1e-3 every step is
            ~1e-3 per parameter, so ``AdaptiveThreshold(initial=1e-2)`` avoids ~150 dense warm-up steps.
        residual_post_processor: what happens to unsent residuals; default ``ResidualClipping()`` (clip to ±5t every
            5 steps). ``NoResidualPostProcessing()`` never drops update mass but lets stale residuals pile up.
        shake_frequency: every this many steps also flush residual entries above t/3 (0 = off, the default). Try
            50-500 when many parameters never reach the threshold.
        workers_per_node: -1 (default): one worker per Spark task, and when Spark schedules GPUs
            (``spark.task.resource.gpu.amount=1``) each task trains on the GPU Spark assigned it, i.e. one worker per
            GPU of the executor. A value k >= 1 means k workers on each executor; the number of workers is then
            ``num_workers`` if set, else ``k * executors`` (see :meth:`resolve_num_workers`); each worker is still
            one task slot, so executors need k task slots.
        overlap: exchange step t in the background while step t+1 computes (updates one step stale); False waits
            for every exchange (no staleness, slower when the exchange is slow).

    See :class:`~torchspark.training.masters.TrainingMaster` for the shared options (``batch_size_per_worker``,
    ``rdd_training_approach``, ``export_directory`` and ``rng_seed`` -- both honoured, unlike in DL4J --,
    ``repartition``, ``worker_prefetch_num_batches``, ``collect_training_stats``, timeouts) and the worker-mesh
    options (``port``, ``network_mask``, ``controller_address``, ...: :class:`~torchspark.training.mesh.MeshConfig`).
    """

    kind: ClassVar[str] = "shared_gradients"
    mode: ClassVar[str] = "sharing"
    threshold_algorithm: ThresholdPolicy = field(default_factory=AdaptiveThreshold)
    residual_post_processor: ResidualPostProcessor = field(default_factory=ResidualClipping)
    shake_frequency: int = 0
    workers_per_node: int = -1
    overlap: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        object.__setattr__(self, "threshold_algorithm", _policy(
            "threshold_algorithm", self.threshold_algorithm, threshold_policy_from_dict,
            ("initial_state", "next_threshold", "to_dict"), "AdaptiveThreshold(initial=1e-3)"))
        object.__setattr__(self, "residual_post_processor", _policy(
            "residual_post_processor", self.residual_post_processor, residual_post_processor_from_dict,
            ("process", "to_dict"), "ResidualClipping()"))
        if isinstance(self.shake_frequency, bool) or not isinstance(self.shake_frequency, int) \
                or self.shake_frequency < 0:
            raise ConfigError(f"{name}: shake_frequency must be an integer >= 0 (0 = off), got "
                              f"{self.shake_frequency!r}")
        if isinstance(self.workers_per_node, bool) or not isinstance(self.workers_per_node, int) \
                or not (self.workers_per_node == -1 or self.workers_per_node >= 1):
            raise ConfigError(f"{name}: workers_per_node must be -1 (one per GPU, else one per task) or an integer "
                              f">= 1, got {self.workers_per_node!r}")
        if not isinstance(self.overlap, bool):
            raise ConfigError(f"{name}: overlap must be True or False, got {self.overlap!r}")
        # builds (and so validates) the encoder config once, here, not on the workers
        self.encoder_config()

    def encoder_config(self) -> EncoderConfig:
        """The per-worker encoder these options describe."""
        return EncoderConfig(threshold_policy=self.threshold_algorithm,
                             residual_post_processor=self.residual_post_processor,
                             shake_frequency=self.shake_frequency)

    def algorithm_settings(self) -> dict[str, Any]:
        """JSON-able settings of :class:`~torchspark.training.sharing.SharingAlgorithm`."""
        return SharingSettings(encoder=self.encoder_config(), overlap=self.overlap).to_dict()

    def resolve_num_workers(self, default_parallelism: int, executors: int) -> int:
        """How many workers a fit uses: ``num_workers`` if set; else ``workers_per_node * executors`` when
        ``workers_per_node >= 1``; else (-1) one per task slot, ``default_parallelism``."""
        if self.num_workers is not None:
            return self.num_workers
        if self.workers_per_node >= 1:
            return self.workers_per_node * max(1, executors)
        return default_parallelism

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["threshold_algorithm"] = self.threshold_algorithm.to_dict()
        d["residual_post_processor"] = self.residual_post_processor.to_dict()
        d["type"] = self.kind
        return d
