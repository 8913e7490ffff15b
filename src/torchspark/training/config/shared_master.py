"""``SharedTrainingMaster``: threshold-encoded gradient sharing (DL4J's SharedTrainingMaster).

Every worker computes its updater's step on its own minibatch (or group of ``accumulate_steps`` minibatches),
threshold-encodes it against a residual and
exchanges the sparse message with all workers over ``torch.distributed`` (inside one Spark barrier stage, or
between ``ParallelWrapper``'s worker processes); every
replica applies the same sum of messages, so the replicas stay identical without averaging parameters. The worker
loop is `torchspark.training.algorithms.sharing.loop` (with ``max_staleness``:
`torchspark.training.algorithms.sharing.stale`); this module is only its validated, JSON-serialisable
configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torchspark.encoding import (
    COMPRESSORS,
    AdaptiveThreshold,
    EncoderConfig,
    ResidualClipping,
    ResidualPostProcessor,
    ThresholdCompressor,
    ThresholdPolicy,
    compressor_from_dict,
    residual_post_processor_from_dict,
    threshold_policy_from_dict,
)
from torchspark.errors import ConfigError
from torchspark.nn.divergence import check_on_divergence
from torchspark.training.algorithms.sharing.settings import SharingSettings, check_max_staleness
from torchspark.training.algorithms.sharing.topology import DEFAULT_SHARD_ABOVE_WORKERS, check_topology
from torchspark.training.config.masters import TrainingMaster, register_master
from torchspark.validation import check_bool, check_choice, check_int, is_int

__all__ = ["SharedTrainingMaster"]


def _policy(name: str, value: Any, from_dict: Any, methods: tuple[str, ...], example: str) -> Any:
    if isinstance(value, dict):
        return from_dict(value)
    if all(callable(getattr(value, m, None)) for m in methods) and dataclasses.is_dataclass(value):
        return value
    raise ConfigError(
        f"SharedTrainingMaster: {name} must be a policy object such as {example} or its to_dict() form, got {value!r}"
    )


def _codec(owner: str, value: Any) -> Any:
    """``"threshold"`` (threshold encoding, configured by the master's own options), or the other codec ``value``
    names or describes (a name: default parameters; a ``to_dict()`` form; a codec object)."""
    if isinstance(value, str):
        check_choice("codec", value, sorted(COMPRESSORS), owner=owner, fix="a new codec is registered in COMPRESSORS")
        return value if value == "threshold" else compressor_from_dict(value)
    if isinstance(value, dict):
        value = compressor_from_dict(value)
    if isinstance(value, ThresholdCompressor):
        raise ConfigError(
            f"{owner}: pass codec='threshold' and the threshold options (threshold_algorithm, "
            "residual_post_processor, shake_frequency) instead of a ThresholdCompressor"
        )
    if getattr(type(value), "name", None) not in COMPRESSORS:
        raise ConfigError(f"{owner}: codec must be one of {sorted(COMPRESSORS)} or a codec object, got {value!r}")
    return value


@register_master
@dataclass(frozen=True)
class SharedTrainingMaster(TrainingMaster):
    """Gradient sharing with threshold-encoded sparse updates and residuals (Strom 2015).

    Traffic per worker and step is a few bytes per parameter that changed by more than the threshold, instead of
    4 bytes per parameter. Measured with the defaults on LeNet and digits (2 workers, 15 epochs): 362x fewer bytes
    than parameter averaging every 5 steps, 550x fewer than sending every step's update densely (BENCHMARKS.md,
    "Gradient sharing vs dense averaging"); the ratio depends on the model, the updater and the run's length. Use it
    when communication dominates (big models, slow networks); for tiny models on one machine the per-step exchange
    latency dominates instead.

    Args:
        threshold_algorithm: how the encoding threshold moves ([`AdaptiveThreshold`][torchspark.encoding.AdaptiveThreshold],
            [`FixedThreshold`][torchspark.encoding.FixedThreshold], [`TargetSparsityThreshold`][torchspark.encoding.TargetSparsityThreshold], or
            their ``to_dict()`` form). Default ``AdaptiveThreshold()``: sparsity band [1e-4, 1e-2] and a start
            calibrated from the workers' first updates (aiming at 1e-3, one value agreed by all workers), so it
            needs no tuning. ``AdaptiveThreshold(initial=1e-4)`` is DL4J's fixed start; with Adam at lr=1e-3 its
            first ~130 steps go out dense.
        residual_post_processor: what happens to unsent residuals; default ``ResidualClipping()`` (clip to ±5t every
            5 steps). ``NoResidualPostProcessing()`` never drops update mass but lets stale residuals pile up.
        shake_frequency: every this many steps also flush residual entries above t/3 (0 = off, the default). Try
            50-500 when many parameters never reach the threshold.
        workers_per_node: -1 (default): ``num_workers`` workers (default: one per task slot), and when Spark
            schedules GPUs (``spark.task.resource.gpu.amount=1``) each task trains on the GPU Spark assigned it, i.e.
            one worker per GPU of the executor. A value k >= 1 means k workers on every executor the session has
            when the fit starts: ``k * executors`` workers (executors still registering are waited for); each worker
            is one task slot, so a fit whose executors have fewer than k slots each fails with SetupError. Set
            either this or ``num_workers``, not both.
        overlap: exchange step t in the background while step t+1 computes (updates one step stale); False waits
            for every exchange (no staleness, slower when the exchange is slow). The staleness can cost accuracy
            per step: the 3.7 M-parameter benchmark MLP with Adam reached 0.20-0.30 test accuracy after its first
            epoch with True, 0.50-0.61 with False (BENCHMARKS.md, "Stragglers"); compare time to accuracy. Workers
            of one host overlap through shared memory without an exchange thread
            (``extra_config["sharing.overlap_via"]``).
        on_divergence: ``"fail"`` (default): a worker whose update is not finite or explodes (norm over 1000x the
            parameters', `torchspark.nn.divergence`) ends the fit with TrainingError, "... the updater
            diverged. Lower the learning rate ...", as a NaN loss does under parameter averaging. ``"warn"``: log
            it and train on; the fit then warns (RuntimeWarning) and ``net.extra_config["sharing.divergence"]``
            holds the message. Threshold encoding keeps a diverged fit's loss finite, so without this check it
            would end normally at chance accuracy.
        max_staleness: None (default): synchronous sharing as above, replicas identical at every step. An integer
            ``k >= 0``: bounded-staleness asynchronous sharing: each worker applies its own update at once and its
            peers' as they arrive, and waits only when it is more than ``k`` steps ahead of its slowest peer, so a
            slow worker stalls the others only after ``k`` steps (``k = 0``: wait for every peer's previous step).
            The replicas drift apart by the messages in flight and are averaged at the end of the fit;
            ``extra_config`` reports ``sharing.max_lag_steps``, ``sharing.replica_divergence`` (before that
            average), ``sharing.messages_sent`` / ``sharing.messages_applied``. With ``checkpoint_directory`` it
            checkpoints at each epoch's end (not ``checkpoint_every``). Not with ``overlap=False`` or
            ``topology="sharded"`` (ConfigError); see `torchspark.training.algorithms.sharing.stale`.
        topology: how the workers exchange messages: ``"all_gather"`` (every worker receives and decodes every
            message: receive bytes and decode work grow with the worker count N), ``"sharded"`` (reduce-scatter by
            parameter-index shards, then all-gather of the summed shards: receive bytes ~ ``min(N*m, dense)``
            instead of ``N*m``, which pays once the union of the workers' messages nears a dense update (many
            workers, or dense bitmap messages), at the price of about three times the per-step latency;
            `torchspark.training.algorithms.sharing.sharded`) or ``"auto"`` (default: sharded when there are more than ``shard_above_workers``
            workers). Results are bit-identical either way; ``net.extra_config["sharing.topology"]`` says which
            one a fit used.
        shard_above_workers: the worker count above which ``topology="auto"`` shards (default 128, from the cost
            model in ``docs/scaling.md``).
        codec: the gradient codec, by name (``"threshold"``, the default, configured by the options above;
            ``"topk"``: the largest 1% of each update's entries at full precision, with error feedback) or as a
            codec object with its parameters, e.g. [`TopKCompressor(k=1000)`][torchspark.encoding.TopKCompressor]
            (or its ``to_dict()`` form). Codecs other than threshold encoding are exchanged by all-gather, so
            not with ``topology="sharded"`` or ``max_staleness``. See `torchspark.encoding.compressor`.

    See [`TrainingMaster`][torchspark.TrainingMaster] for the shared options (``batch_size_per_worker``,
    ``rdd_training_approach``, ``export_directory`` and ``rng_seed`` -- both honoured, unlike in DL4J --,
    ``repartition``, ``worker_prefetch_num_batches``, ``collect_training_stats``, timeouts) and the worker-mesh
    options (``port``, ``network_mask``, ``controller_address``, ...: [`MeshConfig`][torchspark.MeshConfig]).
    """

    kind: ClassVar[str] = "sharing"
    threshold_algorithm: ThresholdPolicy = field(default_factory=AdaptiveThreshold)
    residual_post_processor: ResidualPostProcessor = field(default_factory=ResidualClipping)
    shake_frequency: int = 0
    workers_per_node: int = -1
    overlap: bool = True
    on_divergence: str = "fail"
    max_staleness: int | None = None
    topology: str = "auto"
    shard_above_workers: int = DEFAULT_SHARD_ABOVE_WORKERS
    codec: Any = "threshold"

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        object.__setattr__(
            self,
            "threshold_algorithm",
            _policy(
                "threshold_algorithm",
                self.threshold_algorithm,
                threshold_policy_from_dict,
                ("initial_state", "calibration_target", "calibrated_state", "next_threshold", "to_dict"),
                "AdaptiveThreshold()",
            ),
        )
        object.__setattr__(
            self,
            "residual_post_processor",
            _policy(
                "residual_post_processor",
                self.residual_post_processor,
                residual_post_processor_from_dict,
                ("process", "to_dict"),
                "ResidualClipping()",
            ),
        )
        check_int("shake_frequency", self.shake_frequency, 0, owner=name, meaning="(0 = off)")
        if not is_int(self.workers_per_node) or not (self.workers_per_node == -1 or self.workers_per_node >= 1):
            raise ConfigError(
                f"{name}: workers_per_node must be -1 (one per GPU, else one per task) or an integer "
                f">= 1, got {self.workers_per_node!r}"
            )
        if self.workers_per_node >= 1 and self.num_workers is not None:
            raise ConfigError(
                f"{name}: set num_workers={self.num_workers} or workers_per_node="
                f"{self.workers_per_node} (k workers on every executor), not both"
            )
        check_bool("overlap", self.overlap, owner=name)
        check_on_divergence(name, self.on_divergence)
        check_max_staleness(name, self.max_staleness, self.overlap)
        if self.max_staleness is not None and self.checkpoint_every is not None:
            raise ConfigError(
                f"{name}: max_staleness={self.max_staleness} checkpoints at epoch ends only (the one point with no "
                f"message in flight), so checkpoint_every={self.checkpoint_every} cannot apply; set "
                "checkpoint_every=None (a checkpoint per epoch) or max_staleness=None"
            )
        if self.max_staleness is not None and getattr(self, "topology", None) == "sharded":
            raise ConfigError(
                f"{name}: max_staleness={self.max_staleness} sends point-to-point, so "
                "topology='sharded' (a collective exchange) does not apply; use topology='auto' or "
                "max_staleness=None"
            )
        check_topology(name, self.topology, self.shard_above_workers)
        object.__setattr__(self, "codec", _codec(name, self.codec))
        # builds (and so validates) the encoder config and the codec's combination with the other options once,
        # here, not on the workers
        self.algorithm_settings()

    @property
    def mode(self) -> str:
        """The workers' algorithm, a key of [`ALGORITHMS`][torchspark.training.ALGORITHMS]: ``"sharing"``
        (synchronous), or ``"stale_sharing"`` when ``max_staleness`` is set."""
        return "sharing" if self.max_staleness is None else "stale_sharing"

    def encoder_config(self) -> EncoderConfig:
        """The per-worker encoder these options describe."""
        return EncoderConfig(
            threshold_policy=self.threshold_algorithm,
            residual_post_processor=self.residual_post_processor,
            shake_frequency=self.shake_frequency,
        )

    def algorithm_settings(self) -> dict[str, Any]:
        """JSON-able settings of the algorithm [`mode`][torchspark.SharedTrainingMaster.mode] names
        (`SharingSettings`)."""
        return SharingSettings(
            encoder=self.encoder_config(),
            overlap=self.overlap,
            on_divergence=self.on_divergence,
            max_staleness=self.max_staleness,
            topology=self.topology,
            shard_above_workers=self.shard_above_workers,
            codec=None if self.codec == "threshold" else self.codec,
        ).to_dict()

    @property
    def workers_per_executor(self) -> int | None:
        return self.workers_per_node if self.workers_per_node >= 1 else None

    def resolve_num_workers(self, default_parallelism: int, executors: int) -> int:
        """How many workers a fit uses: ``workers_per_node * executors`` when ``workers_per_node >= 1``; else
        ``num_workers`` if set; else one per task slot, ``default_parallelism``."""
        if self.workers_per_node >= 1:
            return self.workers_per_node * max(1, executors)
        return self.num_workers or default_parallelism

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["threshold_algorithm"] = self.threshold_algorithm.to_dict()
        d["residual_post_processor"] = self.residual_post_processor.to_dict()
        if not isinstance(self.codec, str):
            d["codec"] = self.codec.to_dict()
        d["type"] = self.kind
        return d
