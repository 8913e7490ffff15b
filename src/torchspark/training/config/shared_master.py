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

    Every step each worker sends only the entries of its update that reached the threshold (a few bytes each) and
    keeps the rest as a residual; every replica applies the same sum of messages, so the replicas stay identical
    (with ``max_staleness``: they are averaged at the end of the fit). The threshold moves by
    ``threshold_algorithm``; ``residual_post_processor`` and ``shake_frequency`` treat the residual; ``overlap``
    and ``max_staleness`` trade staleness for waiting; ``topology`` / ``shard_above_workers`` choose how messages
    travel; ``workers_per_node`` places k workers on every executor; ``on_divergence`` says what a diverged update
    does; ``codec`` swaps the threshold codec for another compressor (``"topk"``, `torchspark.encoding.compressor`).

    Each option is documented in docs/guides/masters.md (the gradient-sharing table), with the shared ones of
    [`TrainingMaster`][torchspark.TrainingMaster]; how the exchange works: docs/guides/gradient-sharing.md.

    Raises:
        ConfigError: a value out of range, a policy that is not one, ``workers_per_node`` with ``num_workers``,
            ``max_staleness`` with ``overlap=False``, ``topology="sharded"`` or ``checkpoint_every``; an unknown
            ``codec``, or a codec other than threshold encoding with ``topology="sharded"`` or ``max_staleness``.
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
