"""One encoder step per minibatch: threshold policy + shake-up + codec + residual post-processing.

This is what a gradient-sharing worker calls once per minibatch::

    state = EncoderState.create(EncoderConfig(), num_params)
    for step, update in enumerate(updates):          # update: flat float32, what the optimizer would apply
        message, state = encode_step(update, state, step)
        broadcast(to_bytes(message))                 # every replica (own included) applies decode(message, ...)

The residual tensor is mutated in place (no params-sized copy per step); the returned state shares it and carries
the new threshold state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from torchspark.encoding.calibration import calibrated_threshold
from torchspark.encoding.codec import EncodedUpdate, float32_update, threshold_encode
from torchspark.encoding.residual import (
    ResidualClipping,
    ResidualPostProcessor,
    residual_post_processor_from_dict,
)
from torchspark.encoding.threshold import (
    AdaptiveThreshold,
    ThresholdPolicy,
    ThresholdState,
    shake_up_threshold,
    threshold_policy_from_dict,
)
from torchspark.errors import ConfigError, EncodingError

__all__ = ["EncoderConfig", "EncoderState", "encode_step", "local_calibration", "with_calibration"]


@dataclass(frozen=True)
class EncoderConfig:
    """Knobs of the per-worker encoder.

    Args:
        threshold_policy: how the threshold moves; default [`AdaptiveThreshold`][torchspark.encoding.AdaptiveThreshold] (DL4J's default policy,
            with a start calibrated from the first update; ``AdaptiveThreshold(initial=1e-4)`` is DL4J's start).
        residual_post_processor: what happens to the residual after each encode; default
            [`ResidualClipping`][torchspark.encoding.ResidualClipping] (clip to ±5t every 5 steps). Use ``NoResidualPostProcessing()`` to never
            drop update mass.
        shake_frequency: every this many steps encode with ``t/3`` to flush small residuals; 0 (default) = never.
            Try 50..500 if many parameters never reach the threshold.
        min_entries: send nothing unless at least this many entries reach the threshold (DL4J: 2).
        boundary: at most this many entries per message, the rest stay in the residual (DL4J's ``boundary``;
            see [`threshold_encode`][torchspark.encoding.threshold_encode]). None (default) = no cap.
    """

    threshold_policy: ThresholdPolicy = field(default_factory=AdaptiveThreshold)
    residual_post_processor: ResidualPostProcessor = field(default_factory=ResidualClipping)
    shake_frequency: int = 0
    min_entries: int = 1
    boundary: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.shake_frequency, int) and self.shake_frequency >= 0):
            raise ConfigError(f"shake_frequency must be an int >= 0 (0 = off), got {self.shake_frequency!r}")
        if not (isinstance(self.min_entries, int) and self.min_entries >= 1):
            raise ConfigError(f"min_entries must be an int >= 1, got {self.min_entries!r}; DL4J uses 2")
        if self.boundary is not None and (
            isinstance(self.boundary, bool) or not isinstance(self.boundary, int) or self.boundary < 1
        ):
            raise ConfigError(f"boundary must be None (no cap) or an int >= 1, got {self.boundary!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold_policy": self.threshold_policy.to_dict(),
            "residual_post_processor": self.residual_post_processor.to_dict(),
            "shake_frequency": self.shake_frequency,
            "min_entries": self.min_entries,
            "boundary": self.boundary,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        return cls(
            threshold_policy=threshold_policy_from_dict(data["threshold_policy"]),
            residual_post_processor=residual_post_processor_from_dict(data["residual_post_processor"]),
            shake_frequency=int(data.get("shake_frequency", 0)),
            min_entries=int(data.get("min_entries", 1)),
            boundary=None if data.get("boundary") is None else int(data["boundary"]),
        )


@dataclass(frozen=True)
class EncoderState:
    """Everything one worker's encoder carries between steps.

    Attributes:
        config: the encoder's knobs.
        residual: flat float32 residual (N,), mutated in place by [`encode_step`][torchspark.encoding.encode_step].
        threshold_state: threshold for the next step and the last step's sparsity.
    """

    config: EncoderConfig
    residual: torch.Tensor
    threshold_state: ThresholdState

    @classmethod
    def create(
        cls,
        config: EncoderConfig,
        length: int,
        device: torch.device | str | None = None,
        threshold_state: ThresholdState | None = None,
    ) -> EncoderState:
        """A zero residual of ``length`` elements and the policy's initial (or the given, e.g. averaged) state."""
        return cls(
            config,
            torch.zeros(length, dtype=torch.float32, device=device),
            threshold_state if threshold_state is not None else config.threshold_policy.initial_state(),
        )

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors to save (e.g. with safetensors) next to the model: residual and threshold state."""
        return {"residual": self.residual, "threshold_state": self.threshold_state.to_tensor()}

    @classmethod
    def load_state_tensors(
        cls, config: EncoderConfig, tensors: dict[str, torch.Tensor], device: torch.device | str | None = None
    ) -> EncoderState:
        """Inverse of [`state_tensors`][torchspark.encoding.EncoderState.state_tensors].

        Raises:
            EncodingError: a tensor is missing or the residual is not flat float32.
        """
        missing = {"residual", "threshold_state"} - set(tensors)
        if missing:
            raise EncodingError(f"encoder state is missing tensors {sorted(missing)}; save it with state_tensors()")
        residual = tensors["residual"].to(device=device).contiguous()
        if residual.dtype != torch.float32 or residual.dim() != 1:
            raise EncodingError(
                f"saved residual must be 1-D float32, got dtype={residual.dtype}, shape={tuple(residual.shape)}"
            )
        return cls(config, residual, ThresholdState.from_tensor(tensors["threshold_state"]))


def local_calibration(update: torch.Tensor | None, state: EncoderState) -> float | None:
    """This worker's calibrated threshold for ``update``, or None (already calibrated, fixed start, no update,
    or an all-zero update). Workers then agree on one value with
    [`agree_threshold`][torchspark.encoding.agree_threshold] and apply it with [`with_calibration`][torchspark.encoding.with_calibration]."""
    target = state.config.threshold_policy.calibration_target()
    if state.threshold_state.calibrated or target is None or update is None:
        return None
    return calibrated_threshold(update, target)


def with_calibration(state: EncoderState, threshold: float | None) -> EncoderState:
    """``state`` starting from the calibrated ``threshold`` (unchanged if it is None or already calibrated)."""
    if threshold is None or state.threshold_state.calibrated:
        return state
    return replace(state, threshold_state=state.config.threshold_policy.calibrated_state(threshold))


def encode_step(update: torch.Tensor | None, state: EncoderState, step: int) -> tuple[EncodedUpdate, EncoderState]:
    """Encode one update and advance the threshold state.

    Steps:
        0. Not calibrated yet (a calibrated start, see `torchspark.encoding.threshold`): calibrate from this
           update alone. Several workers calibrate together beforehand instead ([`local_calibration`][torchspark.encoding.local_calibration], agree,
           [`with_calibration`][torchspark.encoding.with_calibration]), so they start from one threshold. Nothing to calibrate from (no update or an
           all-zero one): send nothing and stay uncalibrated.
        1. ``t`` = the state's threshold; on shake-up steps encode with ``t/3`` instead.
        2. [`threshold_encode`][torchspark.encoding.threshold_encode] (``residual += update``; send every ``|r| >= t`` entry as ``±t``).
        3. Post-process the residual with ``t`` (default: clip to ±5t when ``step % 5 == 0``).
        4. Next threshold from this step's sparsity; shake-up steps leave the threshold state alone, since their
           sparsity (measured at ``t/3``) would wrongly push the threshold up.

    Args:
        update: flat update of the residual's length and device, or None to flush the residual only; float32, or
            bf16/fp16 (widened to float32 before it meets the float32 residual: the residual keeps full precision).
        state: from [`EncoderState.create`][torchspark.encoding.EncoderState.create] or a previous call.
        step: the worker's iteration counter (0-based); drives clipping and shake-up schedules.

    Returns:
        ``(message, new_state)``; ``new_state.residual`` is the same (mutated) tensor as ``state.residual``.
    """
    config = state.config
    update = float32_update(update)
    state = with_calibration(state, local_calibration(update, state))
    threshold = state.threshold_state.threshold
    if threshold is None:  # 0. nothing to calibrate from yet; the residual is untouched (a None update adds nothing)
        if update is not None:
            state.residual.add_(update)
        return EncodedUpdate(
            "empty", state.residual.numel(), 0.0, torch.empty(0, dtype=torch.int32, device=state.residual.device), 0
        ), state
    step_threshold = shake_up_threshold(threshold, step, config.shake_frequency)
    message = threshold_encode(
        update, state.residual, step_threshold, min_entries=config.min_entries, boundary=config.boundary
    )
    config.residual_post_processor.process(state.residual, threshold, step)
    if step_threshold != threshold:
        return message, state
    return message, replace(
        state, threshold_state=config.threshold_policy.next_threshold(state.threshold_state, message.density)
    )
