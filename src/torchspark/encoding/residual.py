"""Residual post-processors, the *memory* side of the GRACE split: what happens to the residual after an encode.

The residual holds everything not yet sent. With a threshold that is small relative to the updates it can grow
without bound ("residual explosion", DL4J); clipping it to a few thresholds every few steps bounds the staleness at
the price of dropping the clipped mass (the only place where update mass is deliberately lost).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

import torch

from torchspark.errors import ConfigError

__all__ = [
    "ResidualPostProcessor",
    "ResidualClipping",
    "NoResidualPostProcessing",
    "RESIDUAL_POST_PROCESSORS",
    "residual_post_processor_from_dict",
]


class ResidualPostProcessor(Protocol):
    """Called once per step after encoding with the threshold used that step."""

    def process(self, residual: torch.Tensor, threshold: float, step: int) -> bool: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ResidualClipping:
    """Clip the residual to ``[-threshold_multiple*t, +threshold_multiple*t]`` every ``frequency`` steps (DL4J default).

    Args:
        threshold_multiple: clip bound in thresholds, >= 1. Larger keeps more history (less lost mass) but lets
            stale updates pile up; DL4J uses 5.
        frequency: clip when ``step > 0 and step % frequency == 0``; 1 = every step after the first. DL4J uses 5.
    """

    name: ClassVar[str] = "clipping"
    threshold_multiple: float = 5.0
    frequency: int = 5

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold_multiple, (int, float)) and self.threshold_multiple >= 1):
            raise ConfigError(
                f"threshold_multiple must be >= 1, got {self.threshold_multiple!r}; clipping below one "
                "threshold would erase entries before they can be sent; DL4J uses 5.0"
            )
        if not (isinstance(self.frequency, int) and self.frequency >= 1):
            raise ConfigError(f"frequency must be an int >= 1, got {self.frequency!r}; DL4J uses 5")

    def process(self, residual: torch.Tensor, threshold: float, step: int) -> bool:
        """Clip in place on clipping steps; returns whether it clipped."""
        if step > 0 and step % self.frequency == 0:
            bound = self.threshold_multiple * threshold
            residual.clamp_(-bound, bound)
            return True
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.name, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResidualClipping:
        return cls(**{k: v for k, v in data.items() if k != "type"})


@dataclass(frozen=True)
class NoResidualPostProcessing:
    """Leave the residual alone: nothing is ever lost, but the residual may grow if the threshold is too large."""

    name: ClassVar[str] = "none"

    def process(self, residual: torch.Tensor, threshold: float, step: int) -> bool:
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoResidualPostProcessing:
        return cls()


RESIDUAL_POST_PROCESSORS: dict[str, type[Any]] = {cls.name: cls for cls in (ResidualClipping, NoResidualPostProcessing)}


def residual_post_processor_from_dict(data: dict[str, Any]) -> ResidualPostProcessor:
    """Rebuild a post-processor from its ``to_dict`` form.

    Raises:
        ConfigError: unknown ``type`` (the message lists the known ones) or bad fields.
    """
    kind = data.get("type") if isinstance(data, dict) else None
    cls = RESIDUAL_POST_PROCESSORS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(f"unknown residual post-processor type {kind!r}; known: {sorted(RESIDUAL_POST_PROCESSORS)}")
    try:
        processor: ResidualPostProcessor = cls.from_dict(data)
    except TypeError as e:
        raise ConfigError(f"bad fields for residual post-processor {data.get('type')!r}: {e}") from e
    return processor
