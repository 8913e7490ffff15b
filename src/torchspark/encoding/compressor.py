"""The compressor slot of gradient sharing: what a codec must provide, the threshold codec as one of them, and the
registry that names them (Horovod's ``Compressor`` and DDP communication hooks are the models).

A [`Compressor`][torchspark.encoding.Compressor] turns one worker's flat float32 update into a message with error
feedback (what is not sent stays in a per-worker residual for later steps), writes it as bytes, and adds a
received message into a sum. The gradient-sharing loop holds one per fit: it encodes each step with
``encode``, sends ``to_bytes(message)`` and, on every rank, decodes every rank's bytes in rank order into one sum,
so every replica applies the same sum bit for bit whatever the codec.

Two codecs ship: ``"threshold"`` ([`ThresholdCompressor`][torchspark.encoding.ThresholdCompressor], Strom 2015,
the default; the loop keeps its fast paths for it: sparse sums, the sharded exchange, bounded staleness) and
``"topk"`` ([`TopKCompressor`][torchspark.encoding.TopKCompressor], the largest ``k`` entries at full precision).

**A new codec** is one module with a frozen dataclass that has the methods of
[`Compressor`][torchspark.encoding.Compressor] (``name``, ``start``, ``encode``, ``to_bytes``, ``decode``,
``to_dict``, ``from_dict``; `torchspark.encoding.topk` is the example) and one line in `COMPRESSORS` below; it
is then selectable as ``SharedTrainingMaster(codec="<name>")``.

Example::

    codec = compressor_from_dict({"type": "topk", "ratio": 0.01})
    state = codec.start(torch.zeros(n), None)
    message, state = codec.encode(update, state, step)      # state.residual keeps what was not sent
    data = codec.to_bytes(message)                          # len(data) == message.nbytes
    codec.decode(data, total)                               # total += the decoded message
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from torchspark.encoding.codec import EncodedUpdate, decode
from torchspark.encoding.encoder import EncoderConfig, EncoderState, encode_step
from torchspark.encoding.threshold import FixedThreshold, ThresholdState
from torchspark.encoding.topk import TopKCompressor
from torchspark.encoding.wire import from_bytes, to_bytes
from torchspark.errors import ConfigError, EncodingError

__all__ = ["Compressor", "CompressedMessage", "ThresholdCompressor", "COMPRESSORS", "compressor_from_dict"]


class CompressedMessage(Protocol):
    """What the sharing loop reads from a message besides its bytes (for traffic and the training statistics)."""

    @property
    def format(self) -> str: ...  # "empty" means: nothing to send this step

    @property
    def threshold(self) -> float: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def density(self) -> float: ...


class Compressor(Protocol):
    """A gradient codec with error feedback.

    ``start(residual, saved)`` is the state a fit starts from (``residual``: zeros or a previous fit's; ``saved``:
    the previous fit's averaged threshold state or None). ``encode(update, state, step)`` adds ``update`` (None:
    already added) to ``state.residual``, takes out what it sends and returns ``(message, state)``.
    ``to_bytes(message)`` is the wire form (``nbytes`` long); ``decode(data, out)`` adds a message's values into
    ``out`` in place and raises [`EncodingError`][torchspark.errors.EncodingError] for bytes it cannot read or of
    another length. ``to_dict`` / ``from_dict`` carry it to the workers as JSON.
    """

    name: ClassVar[str]

    def start(self, residual: torch.Tensor, saved: ThresholdState | None) -> EncoderState: ...

    def encode(
        self, update: torch.Tensor | None, state: EncoderState, step: int
    ) -> tuple[CompressedMessage, EncoderState]: ...

    def to_bytes(self, message: Any) -> bytes: ...

    def decode(self, data: bytes | memoryview, out: torch.Tensor) -> torch.Tensor: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ThresholdCompressor:
    """Threshold encoding with residuals (Strom 2015) behind the [`Compressor`][torchspark.encoding.Compressor]
    protocol: [`encode_step`][torchspark.encoding.encode_step] with ``config``, the wire format of
    `torchspark.encoding.wire`.

    Args:
        config: threshold policy, residual post-processor, shake-up, ``min_entries``, ``boundary``.
    """

    name: ClassVar[str] = "threshold"
    config: EncoderConfig = field(default_factory=EncoderConfig)

    def start(self, residual: torch.Tensor, saved: ThresholdState | None) -> EncoderState:
        """The previous fit's threshold (not its sparsity) when there is one, except with
        [`FixedThreshold`][torchspark.encoding.FixedThreshold] (stateless: the configured value wins) or when it
        never calibrated one (then the policy's initial state)."""
        threshold_state = None
        if saved is not None and not isinstance(self.config.threshold_policy, FixedThreshold):
            # the sparsity does not carry over: "no sparsity" means "not stepped in this fit" (average_states)
            threshold_state = ThresholdState(saved.threshold)
        if threshold_state is None or not threshold_state.calibrated:
            threshold_state = self.config.threshold_policy.initial_state()
        return EncoderState(self.config, residual, threshold_state)

    def encode(self, update: torch.Tensor | None, state: EncoderState, step: int) -> tuple[EncodedUpdate, EncoderState]:
        """[`encode_step`][torchspark.encoding.encode_step]."""
        return encode_step(update, state, step)

    def to_bytes(self, message: EncodedUpdate) -> bytes:
        """[`to_bytes`][torchspark.encoding.to_bytes]."""
        return to_bytes(message)

    def decode(self, data: bytes | memoryview, out: torch.Tensor) -> torch.Tensor:
        """[`from_bytes`][torchspark.encoding.from_bytes] then [`decode`][torchspark.encoding.decode] into ``out``."""
        message = from_bytes(data)
        if message.length != out.numel():
            raise EncodingError(
                f"a worker sent an update of {message.length} elements but this network has {out.numel()} "
                "parameters; all workers must train the same network"
            )
        return decode(message, out)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.name, **self.config.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThresholdCompressor:
        fields = {key: value for key, value in data.items() if key != "type"}
        return cls(EncoderConfig.from_dict(fields) if fields else EncoderConfig())


#: the codecs by name: a new one is one module and one entry here
COMPRESSORS: dict[str, type[Any]] = {cls.name: cls for cls in (ThresholdCompressor, TopKCompressor)}


def compressor_from_dict(data: dict[str, Any] | str) -> Compressor:
    """A codec from its ``to_dict()`` form, or its name alone (default parameters).

    Raises:
        ConfigError: an unknown name (the message lists the known ones) or bad parameters.
    """
    kind = data if isinstance(data, str) else data.get("type") if isinstance(data, dict) else None
    cls = COMPRESSORS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(
            f"unknown codec {kind!r}; known codecs: {sorted(COMPRESSORS)} (a new one is one module and one "
            "line in torchspark.encoding.compressor.COMPRESSORS)"
        )
    compressor: Compressor = cls() if isinstance(data, str) else cls.from_dict(data)
    return compressor
