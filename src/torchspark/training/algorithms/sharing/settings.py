"""The knobs of gradient sharing: `SharingSettings` and its validation.

One frozen settings object serves both sharing algorithms: the synchronous loop
(`SharingAlgorithm`, ``max_staleness=None``) and bounded
staleness (`StaleSharingAlgorithm`, ``max_staleness=k``). The
master builds them; they travel to the workers as `SharingSettings.to_dict`.

Example::

    settings = SharingSettings(EncoderConfig(), overlap=True, topology="auto")
    assert SharingSettings.from_dict(settings.to_dict()) == settings
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchspark.encoding import EncoderConfig
from torchspark.encoding.compressor import COMPRESSORS, Compressor, ThresholdCompressor, compressor_from_dict
from torchspark.errors import ConfigError
from torchspark.nn.divergence import check_on_divergence
from torchspark.training.algorithms.sharing.topology import DEFAULT_SHARD_ABOVE_WORKERS, check_topology

__all__ = ["SharingSettings", "check_max_staleness"]


@dataclass(frozen=True)
class SharingSettings:
    """The knobs of the gradient-sharing loop (validated by the master that builds them).

    Args:
        encoder: threshold policy, residual post-processor, shake-up frequency (see
            [`EncoderConfig`][torchspark.encoding.EncoderConfig]).
        overlap: exchange step ``t`` in the background while step ``t+1`` computes (staleness one step). False
            gives the synchronous loop: no staleness, but computation waits for every exchange.
        on_divergence: ``"fail"`` (raise TrainingError when an update is not finite or explodes, see
            `torchspark.nn.divergence`) or ``"warn"`` (log it once, keep training, the driver warns).
        topology: how messages travel: ``"all_gather"`` (every worker receives and decodes every message),
            ``"sharded"`` (reduce-scatter by index shards then all-gather of the sums, see
            `torchspark.training.algorithms.sharing.sharded`; receive bytes ~ ``min(N*m, dense)`` instead of
            ``N*m``, decode work / N, one more round trip) or ``"auto"`` (sharded above ``shard_above_workers``
            workers). Both give bit-identical results.
        shard_above_workers: ``"auto"`` shards when the number of workers is larger than this.
        max_staleness: None (default): the synchronous loop (algorithm ``"sharing"``). An integer ``k >= 0``:
            bounded-staleness asynchronous sharing (algorithm ``"stale_sharing"``), where a worker applies its
            peers' messages as they arrive and waits only when it is more than ``k`` steps ahead of its slowest
            peer (`torchspark.training.algorithms.sharing.stale`; needs ``overlap=True``).
        codec: None (default): threshold encoding with ``encoder``. Another
            [`Compressor`][torchspark.encoding.Compressor] (e.g. [`TopKCompressor`][torchspark.encoding.TopKCompressor])
            or its ``to_dict()`` form: that codec, exchanged by all-gather (not with ``topology="sharded"`` or
            ``max_staleness``, which are threshold encoding's own exchanges). A
            [`ThresholdCompressor`][torchspark.encoding.ThresholdCompressor] becomes ``encoder``.
    """

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    overlap: bool = True
    on_divergence: str = "fail"
    topology: str = "auto"
    shard_above_workers: int = DEFAULT_SHARD_ABOVE_WORKERS
    max_staleness: int | None = None
    codec: Any = None

    def __post_init__(self) -> None:
        codec = self.codec
        if isinstance(codec, (str, dict)):
            codec = compressor_from_dict(codec)
        if isinstance(codec, ThresholdCompressor):  # the threshold codec is the default path: its knobs are `encoder`
            object.__setattr__(self, "encoder", codec.config)
            codec = None
        if codec is not None and getattr(type(codec), "name", None) not in COMPRESSORS:
            raise ConfigError(
                f"codec must be None (threshold encoding), a codec name in {sorted(COMPRESSORS)} or one of their "
                f"objects, got {codec!r}"
            )
        object.__setattr__(self, "codec", codec)
        if codec is not None and (self.topology == "sharded" or self.max_staleness is not None):
            raise ConfigError(
                f"SharingSettings: codec={codec.name!r} is exchanged by all-gather; topology='sharded' and "
                "max_staleness are threshold encoding's own exchanges. Use topology='auto' or 'all_gather' and "
                "max_staleness=None, or codec='threshold'"
            )
        if not isinstance(self.encoder, EncoderConfig):
            raise ConfigError(
                f"encoder must be an EncoderConfig, got {type(self.encoder).__name__}; build it with "
                "EncoderConfig(...) or SharingSettings.from_dict"
            )
        if not isinstance(self.overlap, bool):
            raise ConfigError(f"overlap must be True or False, got {self.overlap!r}")
        check_on_divergence("SharingSettings", self.on_divergence)
        check_max_staleness("SharingSettings", self.max_staleness, self.overlap)
        check_topology("SharingSettings", self.topology, self.shard_above_workers)
        if self.max_staleness is not None and self.topology == "sharded":
            raise ConfigError(
                "SharingSettings: topology='sharded' is an exchange of the synchronous loop and "
                f"max_staleness={self.max_staleness} the asynchronous mode (its own transport); use "
                "topology='auto' or 'all_gather' with max_staleness, or max_staleness=None"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"encoder": EncoderConfig.to_dict(), "overlap": bool, "on_divergence": str,
        "max_staleness": int | None, "topology": str, "shard_above_workers": int}``, plus ``"codec": dict`` for a codec other than threshold encoding."""
        data = {
            "encoder": self.encoder.to_dict(),
            "overlap": self.overlap,
            "on_divergence": self.on_divergence,
            "max_staleness": self.max_staleness,
            "topology": self.topology,
            "shard_above_workers": self.shard_above_workers,
        }
        if self.codec is not None:  # threshold encoding's settings keep the form they always had
            data["codec"] = self.codec.to_dict()
        return data

    def compressor(self) -> Compressor:
        """The codec of this fit: ``codec``, or threshold encoding with ``encoder`` when it is None."""
        return ThresholdCompressor(self.encoder) if self.codec is None else self.codec

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SharingSettings:
        encoder = data.get("encoder")
        config = (
            EncoderConfig()
            if encoder is None
            else (encoder if isinstance(encoder, EncoderConfig) else EncoderConfig.from_dict(encoder))
        )
        return cls(
            encoder=config,
            overlap=data.get("overlap", True),
            on_divergence=data.get("on_divergence", "fail"),
            max_staleness=data.get("max_staleness"),
            topology=data.get("topology", "auto"),
            shard_above_workers=data.get("shard_above_workers", DEFAULT_SHARD_ABOVE_WORKERS),
            codec=data.get("codec"),
        )


def check_max_staleness(owner: str, value: Any, overlap: bool) -> None:
    """``max_staleness`` is None or an integer >= 0, and asks for ``overlap=True`` (ConfigError naming the value)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"{owner}: max_staleness must be None (synchronous sharing) or an integer >= 0 (steps a "
            f"worker may run ahead of its slowest peer), got {value!r}"
        )
    if overlap is False:
        raise ConfigError(
            f"{owner}: max_staleness={value} is the asynchronous mode and overlap=False the "
            "synchronous loop without staleness; set one of them (max_staleness=0 waits for every "
            "peer's previous step)"
        )
