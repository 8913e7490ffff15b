"""Per-step statistics of the encoder, for the training-stats timeline and for threshold tuning."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torchspark.encoding.codec import EncodedUpdate

__all__ = ["EncodingStats"]


@dataclass(frozen=True)
class EncodingStats:
    """What one encode step sent.

    Attributes:
        entries: number of ``±t`` entries sent (0 for an empty message).
        length: N, the number of elements of the update.
        sparsity: ``entries / N``, the fraction sent (DL4J's "sparsity ratio"). A healthy run sits around 1e-4..1e-2;
            persistently above 1/16 means the bitmap is used and the threshold is too small for the updates.
        nbytes: wire size of the message, header included.
        format: ``"sparse"``, ``"bitmap"`` or ``"empty"``.
        threshold: the step size used.
    """

    entries: int
    length: int
    sparsity: float
    nbytes: int
    format: str
    threshold: float

    @classmethod
    def from_message(cls, message: EncodedUpdate) -> EncodingStats:
        """Stats of one [`EncodedUpdate`][torchspark.encoding.EncodedUpdate]."""
        return cls(
            entries=message.num_entries,
            length=message.length,
            sparsity=message.density,
            nbytes=message.nbytes,
            format=message.format,
            threshold=message.threshold,
        )

    @property
    def compression_ratio(self) -> float:
        """Bytes of the float32 update divided by bytes sent (how much smaller the message is)."""
        return 4 * self.length / self.nbytes

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)
